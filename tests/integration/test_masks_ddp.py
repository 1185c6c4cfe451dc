"""A mask model's evaluation on 2 DDP CPU processes (gloo) gives exactly the single-process numbers: mask AP,
PQ/SQ/RQ and the mask losses, with an odd number of validation images (7); and the metrics also with Lightning's
repeating sampler (a repeated image must count once). See tests/integration/test_ddp.py for the detector's.

After a few steps a model scores 0 everywhere, which would hide a lost or doubled image; the checkpoint
here is pinned instead: every query says "sky" with a mask over the whole image, so each image's sky
segment is the whole image and matches the ground truth's sky (IoU above 0.5) on some images and not on
others, and PQ moves with every image.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import lightning
import pytest
import torch
from ddp_utils import evaluate_runs

pytestmark = pytest.mark.slow

CONFIG = "configs/detr/detr_tiny_masks_panoptic.yaml"
KWARGS = {"backbone": {"frozen_bn": False, "freeze_stem": False},
          "arch": {"num_queries": 8, "dropout": 0.0, "enc_layers": 1, "dec_layers": 1}, "thing_classes": [0, 1]}


@pytest.fixture(scope="module")
def pinned(tmp_path_factory) -> tuple[Path, list[str]]:
    from visiontf.models import create_model
    from visiontf.tasks.detection.panoptic_synthetic import make_panoptic_dataset

    tmp = tmp_path_factory.mktemp("masks_ddp")
    paths = make_panoptic_dataset(tmp / "data", num_train=2, num_val=7, num_classes=2, image_size=(64, 80), seed=5)
    model = create_model("detr_tiny_masks", num_classes=4, **KWARGS)
    with torch.no_grad():
        model.class_embed.weight.zero_()
        model.class_embed.bias.zero_()
        model.class_embed.bias[2] = 10.0  # "sky" (class 2 of circle, square, sky, ground)
        model.mask_head.out_lay.weight.zero_()
        model.mask_head.out_lay.bias.fill_(5.0)
    state = {f"model.{k}": v for k, v in model.state_dict().items()}
    state["criterion.empty_weight"] = torch.cat([torch.ones(4), torch.tensor([0.1])])
    ckpt = {"state_dict": state,
            "hyper_parameters": {"_class_path": "visiontf.tasks.detection.detection_task.DetectionTask", "model_name": "detr_tiny_masks",
                                 "num_classes": 4, "model_kwargs": KWARGS},
            "epoch": 0, "global_step": 0, "pytorch-lightning_version": lightning.__version__}
    path = tmp / "pinned.ckpt"
    torch.save(ckpt, path)
    overrides = [f"--data.init_args.root={paths['root']}", "--data.init_args.val_size=64", "--data.init_args.max_size=96",
                 "--data.init_args.batch_size=2", "--data.init_args.num_workers=0",
                 f"--model.init_args.model_kwargs={json.dumps(KWARGS)}", "--trainer.precision=32-true"]
    return path, overrides


def _same(single: dict, other: dict, keys: list[str]) -> None:
    for k in keys:
        assert k in single and k in other, f"{k} missing: {sorted(single)}"
        assert math.isclose(single[k], other[k], rel_tol=0, abs_tol=1e-6), f"{k}: single {single[k]} != {other[k]}"


def test_mask_model_ddp_eval_equals_single_process(pinned, tmp_path):
    from visiontf.evaluation.coco import METRIC_NAMES
    from visiontf.tasks.detection.panoptic_metric import PQ_METRIC_NAMES

    ckpt, overrides = pinned
    metrics = [f"val/segm_{k}" for k in METRIC_NAMES] + [f"val/{k}" for k in PQ_METRIC_NAMES] + ["val/map"]
    losses = ["val/loss_mask", "val/loss_dice"]
    stats = evaluate_runs(CONFIG, ckpt, tmp_path, overrides, runs=("single", "ddp", "padded"), timeout=900)
    single = stats["single"]
    assert 0 < single["val/pq_stuff"] < 1 and single["val/loss_dice"] > 0, f"degenerate stats prove nothing: {single}"
    _same(single, stats["ddp"], metrics + losses)
    # a repeating sampler counts the repeated image's loss twice (only the metrics know image ids)
    _same(single, stats["padded"], metrics)
