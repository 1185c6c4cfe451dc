"""Evaluation does not depend on the batch size or the number of processes: COCO stats and the
logged validation losses.

A mixed-size validation set (7 images of 3 sizes, odd so that 2 ranks get 4 and 3). Zero padding
in a mixed batch changes what the backbone's convolutions and the deformable sampling see, so
before size-bucketed evaluation batches the COCO stats of one checkpoint moved with the batch size.
Now every evaluation batch holds images of one size only (:class:`visiontf.data.batching.SizeBucketBatchSampler`)
and the Predictor runs each size apart, so the stats at batch 1, 2 and 8, on 1 or 2 processes, and
the Predictor's detections at any batch size are equal up to float rounding. The losses are each
image's own loss averaged with a sample-weighted ``MeanMetric`` (``BaseTask.log_eval_mean``), not
Lightning's ``sync_dist`` epoch mean, which weighted the 2 ranks' unequal shares wrongly;
``class_error`` weighs each image by its boxes. Every stat ``tools/eval.py`` writes is compared, not a list.

The truth is the checkpoint's own detections (``own_detections_as_truth``), so a few-step model
scores far from 0 and every image moves the stats; SETR's truth is its own batch-1 label maps.
Cost: about 4 minutes on 2 shared cores (three fits in one process; each test's evaluations, 1 and 2
processes, in one launch of tests/ddp_utils.py).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from cli_runner import run_tools
from ddp_utils import ddp_args, launch_runs
from handmade_data import own_detections_as_truth

pytestmark = pytest.mark.slow

CONFIGS = {"detr": "configs/detr/detr_tiny_shapes.yaml", "dino": "configs/deformable_detr/deformable_detr_tiny_shapes.yaml"}
MODELS = {
    "detr": "--model.init_args.model_kwargs={arch: {hidden_dim: 32, nheads: 2, enc_layers: 1, dec_layers: 2, "
            "dim_feedforward: 32, num_queries: 10}, backbone: {frozen_bn: false, freeze_stem: false}}",
    "dino": "--model.init_args.model_kwargs={arch: {hidden_dim: 32, nheads: 2, enc_layers: 1, dec_layers: 2, "
            "dim_feedforward: 32, num_queries: 12}, dino: {num_denoising: 6, distinct_query_iou: 0.8, distinct_between_layers: true}}",
}
DATA = ["--data.init_args.num_workers=0", "--data.init_args.batch_size=2", "--data.init_args.scales=[64]",
        "--data.init_args.max_size=96", "--data.init_args.crop_scales=[64]", "--data.init_args.val_size=64",
        "--precision_without_native_bf16=null", "--trainer.precision=32-true"]
#: the evaluations run under the recipes' own mixed precision (bf16 is emulated on a CPU without native bf16,
#: rounding all the same): evaluation computes in float32 unless --eval_precision trainer
EVAL_PRECISION = "--trainer.precision=bf16-mixed"
#: (height, width) of the 7 validation images: three sizes, so that batches of 2 and 8 mix them
VAL_SIZES = [(64, 80), (80, 64), (64, 80), (72, 72), (64, 80), (80, 64), (64, 80)]
COCO_KEYS = ["map", "map_50", "map_75", "mar_1", "mar_10", "mar_100"]


def _mixed_sizes(img_dir: Path, ann_file: Path) -> None:
    """Resize the val images to :data:`VAL_SIZES` (boxes scaled with them)."""
    from PIL import Image

    data = json.loads(ann_file.read_text())
    assert len(data["images"]) == len(VAL_SIZES)
    scale = {}
    for img, (h, w) in zip(data["images"], VAL_SIZES):
        path = img_dir / img["file_name"]
        im = Image.open(path).convert("RGB")
        scale[img["id"]] = (w / im.width, h / im.height)
        im.resize((w, h), Image.BILINEAR).save(path, quality=95)
        img["width"], img["height"] = w, h
    for a in data["annotations"]:
        sx, sy = scale[a["image_id"]]
        x, y, bw, bh = a["bbox"]
        a["bbox"], a["area"] = [x * sx, y * sy, bw * sx, bh * sy], bw * sx * bh * sy
    ann_file.write_text(json.dumps(data))


@pytest.fixture(scope="module")
def fits(tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    """detr_tiny and dino_tiny on mixed-size detection data, and SETR on mixed-size segmentation data, each fitted
    2 steps, all in one process: name -> (data root, checkpoint)."""
    from PIL import Image

    from visiontf.tasks.detection.detection_synthetic import make_detection_dataset
    from visiontf.tasks.segmentation.segmentation_synthetic import make_segmentation_dataset

    base = tmp_path_factory.mktemp("invariance")
    paths = make_detection_dataset(base / "data", num_train=4, num_val=len(VAL_SIZES), image_size=(64, 80), num_classes=3)
    _mixed_sizes(paths["val_images"], paths["val_ann"])
    seg_root = make_segmentation_dataset(base / "seg", num_train=4, num_val=len(SETR_SIZES), num_classes=4,
                                         image_size=(48, 48))
    for path, (h, w) in zip(sorted((seg_root / "images" / "val").iterdir()), SETR_SIZES):
        Image.open(path).convert("RGB").resize((w, h), Image.BILINEAR).save(path, quality=95)
        mask = seg_root / "masks" / "val" / f"{path.stem}.png"
        Image.open(mask).resize((w, h), Image.NEAREST).save(mask)
    cases = [{"argv": ["tools/train.py", "fit", "--config", CONFIGS[f], f"--data.init_args.root={paths['root']}", MODELS[f],
                       *DATA, "--trainer.devices=1", "--trainer.strategy=auto", "--trainer.max_steps=2",
                       "--trainer.limit_val_batches=0", "--trainer.enable_progress_bar=false", "--trainer.callbacks=[]",
                       f"--trainer.default_root_dir={base / f}"]} for f in CONFIGS]
    cases.append({"argv": ["tools/train.py", "fit", "--config", SETR_CONFIG, f"--data.init_args.root={seg_root}", *SETR_MODEL,
                           *SETR_DATA, "--trainer.devices=1", "--trainer.max_steps=2", "--trainer.limit_val_batches=0",
                           "--trainer.enable_progress_bar=false", "--trainer.callbacks=[]", "--checkpoint.monitor=null",
                           f"--trainer.default_root_dir={base / 'setr'}"]})
    for r in run_tools(cases, base):
        assert r["code"] == 0, r["stderr"][-3000:]
    return {f: (paths["root"], base / f / "checkpoints" / "last.ckpt") for f in CONFIGS} | {
        "setr": (seg_root, base / "setr" / "checkpoints" / "last.ckpt")}


@pytest.fixture(scope="module")
def fitted(fits, tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    """The detectors: family -> (data with the checkpoint's own detections as truth, checkpoint)."""
    base = tmp_path_factory.mktemp("own_truth")
    return {f: (own_detections_as_truth(fits[f][1], fits[f][0], base / f"data_{f}"), fits[f][1]) for f in CONFIGS}


def _evaluations(config: str, ckpt: Path, overrides: list[str], singles: dict, ddp: list[str], out: Path) -> dict:
    """``tools/eval.py`` once per entry of ``singles`` on 1 process and once with ``ddp`` on 2, all in one launch
    (tests/ddp_utils.py): name -> the stats it wrote (the 2-process one under "ddp")."""
    common = ["--config", config, *overrides, "--trainer.enable_progress_bar=false", "--trainer.logger=false", "--ckpt_path", ckpt]
    cases = [{"argv": [*common, *extra, "--trainer.devices=1", "--output", out / f"{name}.json"], "processes": 1}
             for name, extra in singles.items()]
    cases.append({"argv": [*common, *ddp, *ddp_args(), "--output", out / "ddp.json"], "processes": 2})
    launch_runs(cases, out / "runs.json", timeout=600)
    return {name: json.loads((out / f"{name}.json").read_text()) for name in [*singles, "ddp"]}


#: validation losses every family logs: each image's own loss averaged over the set (class_error weighted by boxes)
LOSS_KEYS = ["val/loss", "val/loss_ce", "val/loss_bbox", "val/loss_giou", "val/class_error"]
#: more that each family logs (the test compares every logged stat; these must be among them)
FAMILY_KEYS = {"detr": ["val/cardinality_error"],
               "dino": ["val/loss_ce_interm", "val/loss_bbox_interm", "val/loss_giou_interm", "val/dup_rate"]}


def _assert_same(ref: dict, other: dict, keys: list[str], what: str, tol: float = 1e-6) -> None:
    for k in keys:
        assert k in ref and k in other, f"{what}: {k} missing"
        assert math.isclose(ref[k], other[k], rel_tol=0, abs_tol=tol), f"{what}: {k} {other[k]} != {ref[k]} (batch 1)"


def _assert_every_stat_same(ref: dict, other: dict, what: str) -> None:
    """Every stat ``tools/eval.py`` wrote (stats.json: the logged metrics and the COCO report) is there and equal:
    COCO's within 1e-6, the losses and the rest within 1e-5 (float32 sums in another order)."""
    assert set(other) == set(ref), f"{what}: stats differ in names: {sorted(set(other) ^ set(ref))}"
    for k in ref:
        tol = 1e-6 if k.split("/")[-1] in COCO_KEYS or k.split("/")[-1].lower() == "map" else 1e-5
        _assert_same(ref, other, [k], what, tol)


@pytest.mark.parametrize("family", list(CONFIGS))
def test_eval_stats_equal_at_batch_1_2_8_and_on_2_processes(fitted, family, tmp_path):
    """Under bf16-mixed, as the recipes train: evaluation computes in float32 (``--eval_precision float32``, the
    default), so every stat is float32's at any batch size and process count. With ``--eval_precision trainer``
    it computes in bf16 and the stats are others (the option is what makes the difference)."""
    root, ckpt = fitted[family]
    overrides = [f"--data.init_args.root={root}", MODELS[family], *DATA, EVAL_PRECISION, "--trainer.callbacks=[]"]
    singles = {b: ["--trainer.strategy=auto", f"--data.init_args.val_batch_size={b}"] for b in (1, 2, 8)}
    singles["bf16_1"] = ["--trainer.strategy=auto", "--eval_precision=trainer", "--data.init_args.val_batch_size=1"]
    # 2 ranks of 4 and 3 images: Lightning's sync_dist epoch mean inflated every loss (x7/6 at batch 1)
    stats = _evaluations(CONFIGS[family], ckpt, overrides, singles, ["--data.init_args.val_batch_size=2"], tmp_path)
    in_bf16 = [k for k in stats[1] if not math.isclose(stats[1][k], stats["bf16_1"][k], abs_tol=1e-6)]
    assert in_bf16, "--eval_precision trainer should compute in bf16 and give other stats than float32"
    keys = [f"val/{k}" for k in COCO_KEYS]
    # the truth is the batch-1 detections: 1 here, and whatever a padded batch changes is lost
    assert stats[1]["val/map"] > 0.9, stats[1]
    assert stats[1]["val/loss"] > 0.1, stats[1]
    assert set(keys + LOSS_KEYS + FAMILY_KEYS[family]) <= set(stats[1]), sorted(stats[1])
    # a sigmoid head's cardinality_error (queries whose top class is not the last) is a training diagnostic only
    assert ("val/cardinality_error" in stats[1]) == (family == "detr"), sorted(stats[1])
    for b in (2, 8):
        _assert_every_stat_same(stats[1], stats[b], f"batch {b}")
    _assert_every_stat_same(stats[1], stats["ddp"], "2 processes, batch 2")


@pytest.mark.parametrize("family", list(CONFIGS))
def test_predictor_detections_equal_at_any_batch_size(fitted, family):
    import torch

    from visiontf.inference.predictor import Predictor

    root, ckpt = fitted[family]
    images = sorted((root / "val2017").glob("*.jpg"))
    one = Predictor.from_checkpoint(ckpt, device="cpu", batch_size=1)(images, score_threshold=None)
    for batch_size in (2, 8):
        many = Predictor.from_checkpoint(ckpt, device="cpu", batch_size=batch_size)(images, score_threshold=None)
        for a, b in zip(one, many):
            assert a["labels"].tolist() == b["labels"].tolist(), (batch_size, a["source"])
            torch.testing.assert_close(b["scores"], a["scores"], rtol=0, atol=1e-5)
            torch.testing.assert_close(b["boxes"], a["boxes"], rtol=0, atol=1e-3)  # pixels


# ---- SETR (segmentation): sliding-window inference over mixed-size validation images -------------

SETR_CONFIG = "configs/setr/setr_tiny_synthetic.yaml"
SETR_MODEL = ["--model.init_args.model_kwargs={encoder: {img_size: 32, drop_path_rate: 0.0, "
              "kwargs: {patch_size: 8, depth: 4, embed_dim: 48, num_heads: 3}}}",
              "--model.init_args.crop_size=32", "--model.init_args.stride=16"]
#: no eval resize: each image is scored at its own size, so the model's own batch-1 maps can be the truth
SETR_DATA = ["--data.init_args.num_workers=0", "--data.init_args.batch_size=2", "--data.init_args.crop_size=32",
             "--data.init_args.base_size=[48, 48]", "--data.init_args.val_resize=false"]
SETR_SIZES = [(40, 56), (56, 40), (40, 56), (48, 48), (40, 56), (56, 40), (40, 56)]
SEG_KEYS = ["val/mIoU", "val/mAcc", "val/aAcc"]


def _setr_own_maps_as_truth(ckpt: Path, root: Path) -> None:
    """Each val mask replaced by the checkpoint's own prediction for that image alone (batch 1), so the
    batch-1 evaluation scores 1.0 and any pixel a padded batch changes lowers the scores."""
    import numpy as np
    import torch
    from PIL import Image

    from visiontf.tasks.segmentation.segmentation_data import SegmentationDataModule
    from visiontf.tasks.segmentation.segmentation_task import SegmentationTask

    task = SegmentationTask.load_from_checkpoint(ckpt, map_location="cpu", weights_only=False).eval()
    dm = SegmentationDataModule(root, num_classes=task.hparams.num_classes, crop_size=32, base_size=(48, 48),
                                val_resize=False, num_workers=0)
    dm.setup("validate")
    with torch.no_grad():
        for i, (_, mask_path) in enumerate(dm.val_dataset.pairs):
            image, _ = dm.val_dataset[i]
            labels = task.predict_logits(image[None]).argmax(dim=1)[0].numpy().astype(np.uint8)
            assert len(np.unique(labels)) > 1, "a constant map would hide what padding changes"
            Image.fromarray(labels).save(mask_path)


@pytest.fixture(scope="module")
def setr_fitted(fits) -> tuple[Path, Path]:
    """setr_naive_vit_tiny_patch16 (4 narrow blocks) fitted 2 steps; validation images of 3 sizes, masks its own maps."""
    root, ckpt = fits["setr"]
    _setr_own_maps_as_truth(ckpt, root)
    return root, ckpt


def test_setr_eval_stats_equal_at_batch_1_2_8_and_on_2_processes(setr_fitted, tmp_path):
    """Sliding-window SETR over zero-padded mixed-size batches scored other pixels than image by image
    (the windows see the padding); size-bucketed evaluation batches leave nothing padded."""
    root, ckpt = setr_fitted
    overrides = [f"--data.init_args.root={root}", *SETR_MODEL, *SETR_DATA, "--trainer.callbacks=[]",
                 "--precision_without_native_bf16=null", EVAL_PRECISION]
    stats = _evaluations(SETR_CONFIG, ckpt, overrides, {b: [f"--data.init_args.val_batch_size={b}"] for b in (1, 2, 8)},
                         ["--data.init_args.val_batch_size=2"], tmp_path)
    assert stats[1]["val/mIoU"] == 1.0 and stats[1]["val/aAcc"] == 1.0, stats[1]  # the truth is the batch-1 maps
    assert set(SEG_KEYS + ["val/loss"]) <= set(stats[1]), sorted(stats[1])
    for b in (2, 8):
        _assert_every_stat_same(stats[1], stats[b], f"batch {b}")
    _assert_every_stat_same(stats[1], stats["ddp"], "2 processes, batch 2")
