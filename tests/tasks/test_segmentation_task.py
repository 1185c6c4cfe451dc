"""SegmentationTask: mmseg mIoU by hand, the loss with auxiliary heads, optimiser groups, TTA, a short fit."""
import math

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from torchmetrics.classification import MulticlassConfusionMatrix

from visiontf.tasks.segmentation.segmentation_task import SegmentationTask, segmentation_scores

IGN = 255
# 4x4 ground truth with a 2x2 ignored corner; class 3 never appears in it
TARGET = torch.tensor([[0, 0, 1, 1],
                       [0, 0, 1, 1],
                       [2, 2, IGN, IGN],
                       [2, 2, IGN, IGN]])
PRED = torch.tensor([[0, 0, 1, 1],
                     [0, 1, 1, 1],
                     [2, 0, 0, 1],   # the last two fall on ignored pixels and must not count
                     [2, 2, 1, 1]])


def _scores(pred, target, k=4):
    cm = MulticlassConfusionMatrix(k, ignore_index=IGN)(pred[None], target[None])
    return segmentation_scores(cm)


def test_miou_by_hand_with_ignore_and_absent_class():
    s = _scores(PRED, TARGET)
    # class 0: gt 4, pred 4 (one at (2,1)), tp 3 -> 3/5; class 1: gt 4, pred 5, tp 4 -> 4/5;
    # class 2: gt 4, pred 3, tp 3 -> 3/4; class 3: union 0 -> NaN, not averaged
    assert torch.allclose(s["IoU"][:3], torch.tensor([0.6, 0.8, 0.75], dtype=torch.float64))
    assert math.isnan(s["IoU"][3])
    assert s["mIoU"].item() == pytest.approx((0.6 + 0.8 + 0.75) / 3)
    assert s["aAcc"].item() == pytest.approx(10 / 12)  # 12 labelled pixels, 10 right
    assert s["mAcc"].item() == pytest.approx((3 / 4 + 4 / 4 + 3 / 4) / 3)


def test_predicted_but_absent_class_counts_as_zero_iou():
    pred = PRED.clone()
    pred[1, 1] = 3  # a false positive of the class missing from the ground truth
    s = _scores(pred, TARGET)
    # class 1 now gt 4, pred 4, tp 4 -> 1; class 3 gt 0, pred 1 -> IoU 0 and it is averaged; its Acc is NaN
    assert s["IoU"].tolist()[:4] == pytest.approx([0.6, 1.0, 0.75, 0.0])
    assert s["mIoU"].item() == pytest.approx((0.6 + 1.0 + 0.75 + 0.0) / 4)
    assert s["mAcc"].item() == pytest.approx((3 / 4 + 1 + 3 / 4) / 3)


def test_eval_report_from_the_task():
    task = SegmentationTask("setr_naive_vit_tiny_patch16", num_classes=4, model_kwargs={"encoder": {"img_size": 64}})
    task.confmat.update(PRED[None], TARGET[None])
    task._eval_end("val")
    report = task.eval_report()
    assert report["mIoU"] == pytest.approx(2.15 / 3)
    assert report["IoU_class_1"] == pytest.approx(0.8)
    assert "class_2" in report["table"] and "75.00" in report["table"] and "mIoU 71.67" in report["table"]


def _task(decoder="pup", **kw):
    return SegmentationTask(f"setr_{decoder}_vit_tiny_patch16", num_classes=3,
                            model_kwargs={"encoder": {"img_size": 64, "drop_path_rate": 0.0}}, **kw)


def test_training_step_loss_has_aux_terms():
    task = _task("pup")
    images = torch.randn(2, 3, 64, 64)
    masks = torch.randint(0, 3, (2, 64, 64))
    masks[:, :8] = IGN
    torch.manual_seed(1)
    loss = task.training_step((images, masks), 0)
    assert torch.isfinite(loss)
    torch.manual_seed(1)
    out = task.model(images)  # same batch, same BN statistics: same logits
    main = F.cross_entropy(out["out"], masks, ignore_index=IGN)
    aux = sum(F.cross_entropy(a, masks, ignore_index=IGN) for a in out["aux"])
    assert len(out["aux"]) == 4
    assert loss.item() == pytest.approx((main + 0.4 * aux).item(), rel=1e-5)
    loss.backward()
    assert task.model.aux_heads[0].cls_seg.weight.grad is not None


def test_optimizer_groups_and_poly_to_min_lr():
    task = _task("mla", lr=0.001, head_lr_mult=10.0, min_lr=1e-4)
    cfg = task.configure_optimizers()
    opt, sched = cfg["optimizer"], cfg["lr_scheduler"]["scheduler"]
    assert isinstance(opt, torch.optim.SGD) and opt.defaults["momentum"] == 0.9
    enc_ids = {id(p) for n, p in task.model.named_parameters() if n.startswith(("encoder.", "neck."))}
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.001, 0.01])
    assert {id(p) for p in opt.param_groups[0]["params"]} == enc_ids
    assert any(id(p) == id(task.model.decode_head.cls_seg.weight) for p in opt.param_groups[1]["params"])
    # without a trainer total_steps() is 1: one step reaches the end of the poly curve = min_lr for both groups
    opt.step()
    sched.step()
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([1e-4, 1e-4])


def test_flip_and_multiscale_testing_average_probabilities():
    task = _task("naive", test_scales=[0.75, 1.0], test_flip=True).eval()
    x = torch.randn(1, 3, 64, 48)
    with torch.no_grad():
        probs = task.predict_logits(x)
        mirrored = task.predict_logits(x.flip(-1)).flip(-1)
    assert probs.shape == (1, 3, 64, 48)
    assert torch.allclose(probs.sum(1), torch.ones(1, 64, 48), atol=1e-5)
    # flip testing makes the prediction exactly mirror-symmetric in the input
    assert torch.allclose(probs, mirrored, atol=1e-5)
    assert task.predict_step((x, None), 0).shape == (1, 64, 48)


def _loaders(n=8, size=64, k=3):
    g = torch.Generator().manual_seed(0)
    masks = torch.randint(0, k, (n, size // 16, size // 16), generator=g)
    masks = masks.repeat_interleave(16, 1).repeat_interleave(16, 2)
    palette = torch.tensor([[-1.0, 0, 1], [1, -1, 0], [0, 1, -1]])
    images = palette[masks].permute(0, 3, 1, 2) + 0.1 * torch.randn(n, 3, size, size, generator=g)
    ds = TensorDataset(images, masks)
    return DataLoader(ds, batch_size=4, shuffle=True), DataLoader(ds, batch_size=2)


@pytest.mark.slow
def test_short_fit_logs_miou(tmp_path):
    task = _task("naive", lr=0.01, inference_mode="slide", crop_size=64, stride=43)
    train, val = _loaders()
    trainer = L.Trainer(max_steps=2, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                        limit_val_batches=2, default_root_dir=tmp_path)
    trainer.fit(task, train, val)
    metrics = trainer.callback_metrics
    for key in ("val/mIoU", "val/aAcc", "val/mAcc", "train/loss", "train/loss_main", "train/loss_aux"):
        assert key in metrics and torch.isfinite(metrics[key]), key
    assert 0.0 <= float(metrics["val/mIoU"]) <= 1.0
    assert task.eval_report()["table"].count("class_") == 3


@pytest.mark.slow
def test_fit_with_the_segmentation_datamodule(tmp_path):
    seg = pytest.importorskip("visiontf.tasks.segmentation.segmentation_data")
    synth = pytest.importorskip("visiontf.tasks.segmentation.segmentation_synthetic")
    root = synth.make_segmentation_dataset(tmp_path / "seg", num_train=4, num_val=2, num_classes=3, image_size=(64, 64))
    dm = seg.SegmentationDataModule(root, layout="generic", crop_size=64, base_size=(64, 64), batch_size=2,
                                    num_workers=0, photometric=False)
    task = SegmentationTask("setr_mla_vit_tiny_patch16", num_classes=dm.num_classes,
                            model_kwargs={"encoder": {"img_size": 64, "drop_path_rate": 0.0}})
    trainer = L.Trainer(max_epochs=1, limit_train_batches=1, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                        default_root_dir=tmp_path)
    trainer.fit(task, datamodule=dm)
    report = task.eval_report()
    assert "background" in report["table"] and "IoU_background" in report
