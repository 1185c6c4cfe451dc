"""Deformable DETR under DDP on CPU (gloo, 2 processes).

* ``tools/train.py fit`` of the tiny model on 2 processes, from the paper's R50 recipe with only the
  sizes overridden (Lightning's ``ddp``: ``find_unused_parameters=False``);
* ``tools/eval.py`` on 2 processes gives exactly the 12 COCO stats of 1 process (7 validation
  images: the unrepeated sampler gives ranks 4 and 3);
* every variant (plain, box refinement, two-stage) trains under ``DistributedDataParallel`` with
  ``find_unused_parameters=False``: each parameter gets a gradient in every step
  (``tests/deformable_ddp_worker.py``, with a control that must fail).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from ddp_utils import ddp_args, launch_runs, run, subprocess_env

pytestmark = pytest.mark.slow

CONFIG = "configs/deformable_detr/deformable_detr_r50_coco.yaml"
NUM_VAL = 7  # odd: a repeating sampler would pad one rank
SMALL = ("{arch: {hidden_dim: 64, nheads: 2, enc_layers: 1, dec_layers: 2, dim_feedforward: 64, num_queries: 12}, "
         "backbone: {frozen_bn: false, freeze_stem: false}}")


def _overrides(root: Path) -> list[str]:
    # val batch 1: no batch padding, so each image's outputs do not depend on its batch neighbours
    # (1 process and 2 ranks group the images differently)
    return ["--trainer.accelerator=cpu", "--trainer.strategy=auto", "--model.init_args.model_name=deformable_detr_tiny",
            f"--model.init_args.model_kwargs={SMALL}", "--model.init_args.eval_backend=pycocotools",
            f"--data.init_args.root={root}", "--data.init_args.num_workers=0", "--data.init_args.batch_size=2",
            "--data.init_args.val_batch_size=1", "--data.init_args.scales=[64]", "--data.init_args.max_size=96",
            "--data.init_args.crop_scales=[48]", "--data.init_args.crop_size=[32, 64]", "--data.init_args.val_size=64"]


def _add_centred_boxes(ann_file: Path) -> None:
    """One large centred box per validation image, what the pinned box heads below predict."""
    data = json.loads(ann_file.read_text())
    next_id = max((a["id"] for a in data["annotations"]), default=0) + 1
    cats = sorted(c["id"] for c in data["categories"])
    for k, img in enumerate(data["images"]):
        w, h = img["width"], img["height"]
        data["annotations"].append({"id": next_id + k, "image_id": img["id"], "category_id": cats[k % len(cats)],
                                    "bbox": [0.1 * w, 0.1 * h, 0.8 * w, 0.8 * h], "area": 0.64 * w * h, "iscrowd": 0})
    ann_file.write_text(json.dumps(data))


#: the box heads pinned when validation starts (tests/box_head_pin.py): after two steps every COCO stat is 0, and
#: 0 == 0 would hide a lost or doubled image; pinned, each query's box is 80 % of the image at its reference point
PIN = "--trainer.callbacks+=box_head_pin.PinBoxHeads"


@pytest.fixture(scope="module")
def ddp_fit(tmp_path_factory) -> tuple[Path, Path, list[str]]:
    """2-process ``fit``: 8 images / (2 ranks x batch 2) = 2 optimizer steps, then validation; then, in the same
    launch (tests/ddp_utils.py launch_runs), ``tools/eval.py`` of its checkpoint on 2 processes with the box heads
    pinned: (checkpoint, the 2-process eval's stats file, the overrides)."""
    from visiontf.tasks.detection.detection_synthetic import make_detection_dataset

    tmp = tmp_path_factory.mktemp("deformable_ddp")
    paths = make_detection_dataset(tmp / "data", num_train=8, num_val=NUM_VAL, image_size=(64, 64), num_classes=2)
    _add_centred_boxes(paths["val_ann"])
    overrides = _overrides(paths["root"])
    last = tmp / "run" / "checkpoints" / "last.ckpt"
    fit = ["fit", "--config", CONFIG, *overrides, *ddp_args(), "--trainer.max_epochs=1", "--trainer.num_nodes=1",
           "--trainer.log_every_n_steps=1", f"--trainer.default_root_dir={tmp / 'run'}", "--trainer.enable_progress_bar=false"]
    evaluate = ["--config", CONFIG, "--ckpt_path", last, *overrides, PIN, "--trainer.enable_progress_bar=false",
                "--trainer.logger=false", "--output", tmp / "ddp.json", *ddp_args()]
    launch_runs([{"tool": "train", "argv": fit, "processes": 2}, {"argv": evaluate, "processes": 2}], tmp / "runs.json")
    assert last.is_file()
    return last, tmp / "ddp.json", overrides


def test_ddp_fit_of_the_paper_recipe_writes_a_finite_checkpoint_and_logs_every_term(ddp_fit):
    ckpt_path, _, _ = ddp_fit
    ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=True)
    assert ckpt["global_step"] == 2
    hp = ckpt["hyper_parameters"]
    # the paper config's class index is the category id (ids 1 and 2 here: 3 outputs, as the original)
    assert (hp["model_name"], hp["num_classes"], hp["lr"], hp["lr_backbone"], hp["lr_drop_epochs"]) == ("deformable_detr_tiny", 3, 2e-4, 2e-5, 40)
    assert all(torch.isfinite(v).all() for v in ckpt["state_dict"].values() if v.is_floating_point())
    metrics = next((ckpt_path.parents[1] / "csv").rglob("metrics.csv")).read_text().splitlines()[0].split(",")
    for key in ("train/loss_ce", "train/loss_bbox", "train/loss_giou", "train_aux/loss_ce_0", "val/mAP", "lr-AdamW/pg3"):
        assert key in metrics, key


def _evaluate_here(ckpt: Path, out: Path, overrides: list[str]) -> dict[str, float]:
    """``tools/eval.py`` on 1 process, this one (one thread, as each DDP rank): a third interpreter
    start would cost more than the evaluation."""
    from visiontf.cli import eval_main

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        eval_main(["--config", CONFIG, "--ckpt_path", str(ckpt), *overrides, PIN, "--trainer.enable_progress_bar=false",
                   "--trainer.logger=false", "--trainer.devices=1", "--output", str(out)])
    finally:
        torch.set_num_threads(threads)
    return json.loads(out.read_text())


def test_ddp_eval_equals_single_process(ddp_fit, tmp_path):
    from visiontf.tasks.detection.coco_metric import METRIC_NAMES

    ckpt, ddp_stats, overrides = ddp_fit
    single = _evaluate_here(ckpt, tmp_path / "single.json", overrides)
    assert 0 < single["val/map"] < 1 and 0 < single["val/mar_100"] < 1, f"degenerate stats prove nothing: {single}"
    ddp = json.loads(ddp_stats.read_text())
    keys = [f"val/{k}" for k in METRIC_NAMES]
    assert len(keys) == 12
    for k in keys:
        assert single[k] == pytest.approx(ddp[k], abs=1e-6, rel=0), f"{k}: single {single[k]} != ddp {ddp[k]}"


def test_every_variant_uses_every_parameter_under_ddp(tmp_path):
    out = tmp_path / "ddp_variants.json"
    run(["tests/deformable_ddp_worker.py", str(out)], timeout=240, env=subprocess_env())
    report = json.loads(out.read_text())
    for variant in ("plain", "box_refine", "two_stage"):
        assert report[variant] == {"status": "ok", "ranks_agree": True}, (variant, report[variant])
    # the control, with one parameter the forward never reads, fails: the check has teeth
    assert "find_unused_parameters" in report["control"]["status"], report["control"]
