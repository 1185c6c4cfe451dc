"""DetectionTask trains Deformable DETR: criterion and post-processing from the model's class head,
the paper's optimiser from its configs, option pass-through, the targets hook, every loss term
logged, and images without targets in training and evaluation."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import lightning as L
import pytest
import torch
from torch import nn

import visiontf.set_prediction.set_loss as set_loss
from visiontf.core.config_files import read_config
from visiontf.models.contract import Detector
from visiontf.set_prediction import DeformablePostProcess, PostProcess, SetCriterion
from visiontf.tasks.detection.coco_data import CocoDataModule
from visiontf.tasks.detection.detection_synthetic import make_detection_dataset
from visiontf.tasks.detection.detection_task import DetectionTask, split_loss_terms

ROOT = Path(__file__).resolve().parents[2]
# a small deformable model: ResNet-18 trunk, d 64, 1 + 2 layers, 12 queries
TINY = {"backbone": {"frozen_bn": False, "freeze_stem": False},
        "arch": {"hidden_dim": 64, "nheads": 2, "enc_layers": 1, "dec_layers": 2, "dim_feedforward": 64, "num_queries": 12}}
TWO_STAGE = {**TINY, "arch": {**TINY["arch"], "two_stage": True}}
SIZES = {"scales": [64], "max_size": 96, "crop_scales": [48], "crop_size": [32, 64], "val_size": 64}
PAPER_CONFIGS = sorted((ROOT / "configs" / "deformable_detr").glob("deformable_detr_r50_*coco.yaml"))


def _trainer(tmp_path, **kw):
    return L.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                     enable_model_summary=False, default_root_dir=tmp_path, **kw)


def test_criterion_and_postprocessing_follow_the_class_head():
    deformable = DetectionTask("deformable_detr_tiny", num_classes=3, model_kwargs=TINY)
    c = deformable.criterion
    assert (c.class_loss, c.matcher.class_cost) == ("focal", "focal")
    assert (c.matcher.cost_class, c.matcher.cost_bbox, c.matcher.cost_giou) == (2.0, 5.0, 2.0)
    assert c.weight_dict == {"loss_ce": 2.0, "loss_bbox": 5.0, "loss_giou": 2.0} and c.focal_alpha == 0.25
    assert isinstance(deformable.postprocess, DeformablePostProcess)

    detr = DetectionTask("detr_tiny", num_classes=3, model_kwargs={"arch": {"enc_layers": 1, "dec_layers": 1, "num_queries": 5}})
    c = detr.criterion
    assert (c.class_loss, c.matcher.class_cost, c.eos_coef) == ("ce", "softmax", 0.1)
    assert (c.matcher.cost_class, c.matcher.cost_bbox, c.matcher.cost_giou) == (1.0, 5.0, 2.0)
    assert c.weight_dict == {"loss_ce": 1.0, "loss_bbox": 5.0, "loss_giou": 2.0}
    assert isinstance(detr.postprocess, PostProcess)

    # single defaults overridden in the set_loss section, the rest kept
    tuned = DetectionTask("deformable_detr_tiny", num_classes=3, model_kwargs=TINY,
                          set_loss={"matcher": {"cost_class": 3.0, "cost_bbox": 4.0}, "criterion": {"focal_alpha": 0.3},
                                    "weights": {"loss_bbox": 6.0, "loss_giou": 1.0}})
    c = tuned.criterion
    assert (c.matcher.cost_class, c.matcher.cost_bbox, c.matcher.cost_giou, c.matcher.class_cost) == (3.0, 4.0, 2.0, "focal")
    assert c.weight_dict == {"loss_ce": 2.0, "loss_bbox": 6.0, "loss_giou": 1.0} and c.focal_alpha == 0.3


def test_criterion_kwargs_reach_a_new_criterion_option_unchanged(monkeypatch):
    """A criterion option added later needs no task change: set_loss.criterion.options go through as given."""

    class WithOption(SetCriterion):
        def __init__(self, *args, new_option: int = 0, **kwargs):
            super().__init__(*args, **kwargs)
            self.new_option = new_option

    family_defaults = set_loss.set_loss_defaults
    monkeypatch.setattr(set_loss, "set_loss_defaults",
                        lambda model: dataclasses.replace(family_defaults(model), criterion_class=WithOption))
    task = DetectionTask("deformable_detr_tiny", num_classes=3, model_kwargs=TINY, set_loss={"criterion": {"options": {"new_option": 7}}})
    assert task.criterion.new_option == 7 and task.criterion.class_loss == "focal"


def test_a_class_head_without_defaults_is_a_clear_error():
    task = DetectionTask("deformable_detr_tiny", num_classes=3, model_kwargs=TINY)
    task.model.class_head = "softmax_v2"
    with pytest.raises(ValueError, match="SET_LOSS_BY_CLASS_HEAD"):
        set_loss.build_criterion(task.model, 3)


def test_loss_terms_are_split_by_name_alone():
    names = ["loss", "loss_ce", "class_error", "loss_ce_0", "loss_bbox_4", "loss_ce_enc", "loss_giou_dn", "loss_giou_dn_1"]
    main, aux = split_loss_terms({k: torch.tensor(1.0) for k in names})
    assert sorted(main) == ["class_error", "loss_ce", "loss_ce_enc", "loss_giou_dn"]
    assert sorted(aux) == ["loss_bbox_4", "loss_ce_0", "loss_giou_dn_1"]


@pytest.mark.parametrize("config", PAPER_CONFIGS, ids=lambda p: p.stem)
def test_paper_recipes_set_the_papers_optimiser(config):
    """lr 2e-4, backbone 2e-5, offsets and reference points 2e-5 (0.1x), weight decay 1e-4 everywhere,
    clipping 0.1, 50 epochs dropping x0.1 at 40, total batch 32."""
    cfg = read_config(config)  # with its base file
    trainer, args = cfg["trainer"], cfg["model"]["init_args"]
    assert trainer["gradient_clip_val"] == 0.1 and trainer["max_epochs"] == 50
    assert trainer["devices"] * trainer.get("num_nodes", 1) * cfg["data"]["init_args"]["batch_size"] == 32
    assert args["model_kwargs"]["backbone"]["pretrained"] is True
    # the real R50 model without its download
    task = DetectionTask(**{**args, "model_kwargs": {**args["model_kwargs"], "backbone": {"pretrained": False}}}, num_classes=80)
    opt = task.configure_optimizers()
    groups = opt["optimizer"].param_groups
    assert [g["lr"] for g in groups] == pytest.approx([2e-4, 2e-5, 2e-5])
    assert all(g["weight_decay"] == 1e-4 for g in groups)
    names = {id(p): n for n, p in task.model.named_parameters()}
    offsets = sorted(names[id(p)] for p in groups[2]["params"])
    assert offsets and all("sampling_offsets" in n or "reference_points" in n for n in offsets)
    assert all(names[id(p)].startswith("backbone.") for p in groups[1]["params"])
    assert sum(len(g["params"]) for g in groups) == sum(p.requires_grad for p in task.model.parameters())
    sched = opt["lr_scheduler"]
    assert sched["interval"] == "epoch" and sched["scheduler"].step_size == 40 and sched["scheduler"].gamma == 0.1
    assert isinstance(task.criterion.matcher, set_loss.HungarianMatcher) and task.criterion.class_loss == "focal"


# -- training and evaluation on tiny data --------------------------------------------------------------------
def _strip_annotations(ann_file: Path, keep_from: int) -> list[int]:
    """Drop every annotation of the first ``keep_from`` images (by id order); returns their ids."""
    data = json.loads(ann_file.read_text())
    empty = sorted(im["id"] for im in data["images"])[:keep_from]
    data["annotations"] = [a for a in data["annotations"] if a["image_id"] not in empty]
    ann_file.write_text(json.dumps(data))
    return empty


@pytest.fixture(scope="module")
def det_paths(tmp_path_factory):
    """4 training images (2 without annotations) and 5 validation images (the first 2 without: the first
    eval batch of 2 is all empty)."""
    paths = make_detection_dataset(tmp_path_factory.mktemp("det"), num_train=4, num_val=5, image_size=(64, 64), num_classes=2, seed=3)
    _strip_annotations(paths["train_ann"], 2)
    _strip_annotations(paths["val_ann"], 2)
    return paths


class TakesTargets(Detector):
    """A model declaring ``forward_takes_targets``: records what each call received."""

    forward_takes_targets = True
    class_head = "sigmoid"

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.calls: list[tuple[bool, object]] = []

    def forward(self, images, mask=None, targets=None):
        self.calls.append((self.training, targets))
        return self.inner(images, mask)

    def param_group(self, name: str) -> str:
        return self.inner.param_group(name.removeprefix("inner."))


def test_fit_with_empty_images_logs_every_term_and_gives_targets_only_to_training(det_paths, tmp_path):
    """Two-stage (so ``_enc`` terms exist), images without targets in training and an all-empty eval
    batch; the targets hook sees targets in training steps and never in validation."""
    dm = CocoDataModule(det_paths["root"], batch_size=2, val_batch_size=2, num_workers=0, **SIZES)
    task = DetectionTask("deformable_detr_tiny", num_classes=2, model_kwargs=TWO_STAGE,
                         lr=2e-4, lr_backbone=2e-5, schedule="constant")
    task.model = TakesTargets(task.model)
    trainer = _trainer(tmp_path, max_epochs=1, gradient_clip_val=0.1, log_every_n_steps=1)
    trainer.fit(task, datamodule=dm)
    m = trainer.callback_metrics
    for key in ("train/loss", "train/loss_ce", "train/loss_bbox", "train/loss_giou", "train/loss_ce_enc",
                "train/loss_bbox_enc", "train_aux/loss_ce_0", "train_aux/loss_giou_0", "val/loss_ce_enc", "val/mAP"):
        assert key in m and torch.isfinite(m[key]), key
    assert not any(k.startswith("val/loss") and k[-1].isdigit() for k in m)  # aux terms are not logged in eval
    train_calls = [t for training, t in task.model.calls if training]
    eval_calls = [t for training, t in task.model.calls if not training]
    assert len(train_calls) == 2 and all(isinstance(t, list) and len(t) == 2 for t in train_calls)
    assert sum(len(t["labels"]) == 0 for batch in train_calls for t in batch) == 2  # both empty images trained
    assert eval_calls and all(t is None for t in eval_calls)
    assert 0.0 <= float(m["val/mAP"]) <= 1.0


def test_a_batch_of_only_empty_images_trains_and_evaluates(det_paths):
    """Every image empty: focal loss on all-negative targets, zero box losses, finite gradients; the
    eval step scores such a batch too."""
    task = DetectionTask("deformable_detr_tiny", num_classes=2, model_kwargs=TWO_STAGE)
    empty = {"labels": torch.zeros(0, dtype=torch.int64), "boxes": torch.zeros(0, 4), "image_id": 1,
             "orig_size": torch.tensor([64, 64]), "size": torch.tensor([64, 64])}
    images = torch.randn(2, 3, 64, 64)
    mask = torch.zeros(2, 64, 64, dtype=torch.bool)
    mask[1, :, 48:] = True
    task.train()
    _, losses, _ = task._step((images, mask, [empty, {**empty, "image_id": 2}]))
    assert torch.isfinite(losses["loss"]) and float(losses["loss_ce"]) > 0
    assert float(losses["loss_bbox"]) == 0 and float(losses["loss_giou"]) == 0 and float(losses["loss_bbox_enc"]) == 0
    losses["loss"].backward()
    grads = [p.grad for p in task.model.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)

    seen = []
    task.eval()
    task._metric = lambda stage: type("M", (), {"update": lambda self, preds, ids: seen.append((preds, ids))})()
    with torch.no_grad():
        task.validation_step((images, mask, [empty, {**empty, "image_id": 2}]), 0)
    (preds, ids), = seen
    assert ids.tolist() == [1, 2] and all(len(p["scores"]) == TINY["arch"]["num_queries"] * 2 for p in preds)  # top 100, clamped to Q x K
