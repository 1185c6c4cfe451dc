"""Classification task: a short real training run learns the synthetic set; distillation and NaN guard."""
import lightning as L
import pytest
import torch

from visiontf.tasks.base_task import NonFiniteLossError
from visiontf.tasks.classification.classification_data import ClassificationDataModule
from visiontf.tasks.classification.classification_synthetic import make_classification_dataset
from visiontf.tasks.classification.classification_task import ClassificationTask

TINY = {"img_size": 32, "patch_size": 8, "depth": 2, "embed_dim": 64, "num_heads": 2}


@pytest.fixture(scope="module")
def cls_root(tmp_path_factory):
    return make_classification_dataset(tmp_path_factory.mktemp("cls"), num_train=96, num_val=32, num_classes=3, image_size=32, seed=0)


@pytest.mark.slow
def test_short_training_loss_falls_and_accuracy_above_chance(cls_root, tmp_path):
    L.seed_everything(0)
    dm = ClassificationDataModule(cls_root, image_size=32, batch_size=16, num_workers=0, scale=(0.6, 1.0), color_jitter=0.0, crop_pct=1.0)
    task = ClassificationTask(num_classes=dm.num_classes, model_kwargs=TINY, lr=2e-3, warmup_steps=0, label_smoothing=0.0)
    trainer = L.Trainer(max_epochs=8, accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        default_root_dir=tmp_path, enable_model_summary=False)
    before = trainer.validate(task, datamodule=dm, verbose=False)[0]
    trainer.fit(task, datamodule=dm)
    after = trainer.validate(task, datamodule=dm, verbose=False)[0]
    assert after["val/loss"] < before["val/loss"] - 0.2
    assert after["val/acc1"] > 0.6  # chance is 1/3


def test_distillation_uses_teacher_argmax(cls_root):
    task = ClassificationTask(model_name="deit_tiny_distilled_patch16_224", num_classes=3, model_kwargs=TINY,
                              teacher_name="vit_tiny_patch16_224", distill_alpha=0.5)
    task.teacher = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.LazyLinear(3))
    images, labels = torch.randn(4, 3, 32, 32), torch.tensor([0, 1, 2, 0])
    task.teacher(images)
    loss = task.training_step((images, labels), 0)
    logits, dist_logits = task.model.train()(images)
    teacher_labels = task.teacher(images).argmax(1)
    expected = 0.5 * torch.nn.functional.cross_entropy(logits, labels, label_smoothing=0.1) + 0.5 * torch.nn.functional.cross_entropy(dist_logits, teacher_labels)
    torch.testing.assert_close(loss, expected)


def test_nonfinite_loss_raises_with_step_and_terms_or_skips():
    task = ClassificationTask(num_classes=3, model_kwargs=TINY)
    task.log = lambda *a, **k: None
    bad = (torch.full((2, 3, 32, 32), float("nan")), torch.tensor([0, 1]))
    with pytest.raises(NonFiniteLossError, match=r"global step 0.*loss_cls=nan"):
        task.training_step(bad, 0)
    task.on_nonfinite = "skip"
    assert task.training_step(bad, 0) is None
    assert task.nonfinite_steps == 1
