"""The tasks' optimizer groups come from the models (no_weight_decay, param_group) and are exactly
the groups of the name-matching rules they replaced: same parameters, same order, same lr and decay.

The reference rules below restate, as the specification, the name-matching rules this project's tasks used before.
Cost: three tiny models, about 2 s.
"""
from __future__ import annotations

import pytest
import torch

from visiontf.tasks.classification.classification_task import ClassificationTask
from visiontf.tasks.detection.detection_task import DetectionTask
from visiontf.tasks.segmentation.segmentation_task import SegmentationTask


def _old_classification(model, hp):
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim <= 1 or name.endswith(("cls_token", "dist_token", "pos_embed")) else decay).append(p)
    return [{"params": decay, "weight_decay": hp.weight_decay, "lr": hp.lr},
            {"params": no_decay, "weight_decay": 0.0, "lr": hp.lr}]


def _old_detection(model, hp):
    backbone, rest = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (backbone if "backbone" in name else rest).append(p)
    return [{"params": rest, "lr": hp.lr, "weight_decay": hp.weight_decay},
            {"params": backbone, "lr": hp.lr_backbone, "weight_decay": hp.weight_decay}]


def _old_segmentation(model, hp):
    prefixes = tuple(getattr(model, "backbone_prefixes", ("encoder.",)))
    backbone, heads = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (backbone if name.startswith(prefixes) else heads).append(p)
    groups = ({"params": backbone, "lr": hp.lr, "weight_decay": hp.weight_decay},
              {"params": heads, "lr": hp.lr * hp.head_lr_mult, "weight_decay": hp.weight_decay})
    return [g for g in groups if g["params"]]


def _assert_same_groups(task, expected):
    got = task.configure_optimizers()["optimizer"].param_groups
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert [id(p) for p in g["params"]] == [id(p) for p in e["params"]]
        assert g["lr"] == pytest.approx(e["lr"]) and g["weight_decay"] == pytest.approx(e["weight_decay"])


@pytest.mark.parametrize("model_name", ["vit_tiny_patch16_224", "deit_tiny_distilled_patch16_224"])
def test_classification_groups_unchanged(model_name):
    task = ClassificationTask(model_name, num_classes=3, model_kwargs={"img_size": 32, "depth": 1},
                              lr=3e-4, weight_decay=0.05, warmup_steps=0)
    assert task.model.no_weight_decay() >= {"pos_embed", "cls_token"}
    _assert_same_groups(task, _old_classification(task.model, task.hparams))


def test_detection_groups_unchanged_and_frozen_backbone_keeps_the_layout():
    kwargs = {"arch": {"enc_layers": 1, "dec_layers": 1, "num_queries": 5}}
    task = DetectionTask("detr_tiny", num_classes=3, model_kwargs=kwargs, lr=1e-4, lr_backbone=1e-5, weight_decay=1e-4)
    assert task.model.no_weight_decay() == set()
    assert {task.model.param_group(n) for n, _ in task.model.named_parameters()} == {"backbone", "default"}
    _assert_same_groups(task, _old_detection(task.model, task.hparams))
    frozen = DetectionTask("detr_tiny", num_classes=3, model_kwargs={**kwargs, "backbone": {"train": False}})
    _assert_same_groups(frozen, _old_detection(frozen.model, frozen.hparams))


@pytest.mark.parametrize("decoder", ["naive", "mla"])
def test_segmentation_groups_unchanged(decoder):
    task = SegmentationTask(f"setr_{decoder}_vit_tiny_patch16", num_classes=3,
                            model_kwargs={"encoder": {"img_size": 32, "kwargs": {"depth": 4}}}, lr=0.01, head_lr_mult=10.0)
    _assert_same_groups(task, _old_segmentation(task.model, task.hparams))


def test_segmentation_reads_the_models_param_group_when_it_has_one():
    task = SegmentationTask("setr_naive_vit_tiny_patch16", num_classes=3,
                            model_kwargs={"encoder": {"img_size": 32, "kwargs": {"depth": 4}}}, lr=0.01, head_lr_mult=10.0)
    # a model that names its groups is asked, not matched by prefix: here everything is "head"
    task.model.param_group = lambda name: "head"
    groups = task.configure_optimizers()["optimizer"].param_groups
    assert len(groups) == 1 and groups[0]["lr"] == pytest.approx(0.1)
    task.model.param_group = lambda name: "offsets"
    with pytest.raises(ValueError, match=r"group\(s\) \['offsets'\]"):
        task.configure_optimizers()


def test_unknown_groups_and_models_without_groups_are_clear_errors():
    from visiontf.tasks.optim import group_parameters

    with pytest.raises(TypeError, match="no param_group"):
        group_parameters(torch.nn.Linear(2, 2))
