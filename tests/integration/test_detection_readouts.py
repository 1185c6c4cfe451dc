"""The readouts of a trained detector through the command lines: ``tools/eval.py --per_class`` equals
pycocotools on the very detections it scored, with either backend; the readout files agree with the
functions that make them; TensorBoard holds the per-class table, the pictures and the PR curves; and the
default path imports neither W&B, MLflow nor Gradio.

The checkpoint is test_ddp's "demo-like" one: the tiny DETR fitted 2 steps on generated shapes, its box
head pinned near a centred box that every validation image has, so that each image adds true and false
positives ranked by the model's own class scores (mAP neither 0 nor 1).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from ddp_utils import ROOT, run, subprocess_env
from readout_data import assert_rows_equal, pycocotools_eval, reference_rows
from test_ddp import DET_CONFIG, NUM_VAL, _det_overrides, _pin_box_head, _prepare_val_split

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def fitted(tmp_path_factory) -> dict:
    """A 2-step fit with the default loggers (CSV + TensorBoard) and readouts pictures at its validation, run
    through tests/import_watch.py; then the pinned checkpoint."""
    from visiontf.tasks.detection.detection_synthetic import make_detection_dataset

    tmp = tmp_path_factory.mktemp("readouts")
    paths = make_detection_dataset(tmp / "data", num_train=8, num_val=NUM_VAL, image_size=(64, 64), num_classes=2)
    _prepare_val_split(paths["val_images"], paths["val_ann"])
    overrides = _det_overrides(paths["root"])
    imports = tmp / "imports.json"
    run(["tests/import_watch.py", str(imports), "tools/train.py", "fit", "--config", DET_CONFIG, *overrides,
         "--trainer.max_epochs=1", "--trainer.limit_train_batches=2", "--trainer.check_val_every_n_epoch=1",
         "--model.init_args.warmup_steps=0", "--checkpoint.monitor=null", "--checkpoint.mode=min",
         f"--trainer.default_root_dir={tmp / 'run'}", "--trainer.enable_progress_bar=false",
         "--readouts.pictures_every_n_epochs=1"], timeout=600)
    last = tmp / "run" / "checkpoints" / "last.ckpt"
    return {"tmp": tmp, "paths": paths, "overrides": overrides, "run": tmp / "run", "imports": json.loads(imports.read_text()),
            "ckpt": _pin_box_head(last, tmp / "eval.ckpt")}


def _eval(fitted: dict, backend: str) -> tuple[dict, Path]:
    """``tools/eval.py --per_class`` with the readouts written: its stats JSON and the readouts folder (one run
    per backend, shared by the tests)."""
    if backend not in fitted.setdefault("evals", {}):
        out = fitted["tmp"] / f"eval_{backend}"
        args = ["tools/eval.py", "--config", DET_CONFIG, "--ckpt_path", str(fitted["ckpt"]), *fitted["overrides"],
                f"--model.init_args.eval_backend={backend}", "--trainer.enable_progress_bar=false", "--trainer.logger=false",
                "--trainer.devices=1", "--per_class", f"--readouts.out_dir={out / 'readouts'}", "--output", str(out / "stats.json")]
        proc = run(args, timeout=600, env=subprocess_env())
        assert "| category " in proc.stdout, proc.stdout[-2000:]
        fitted["evals"][backend] = (json.loads((out / "stats.json").read_text()), out / "readouts" / "val")
    return fitted["evals"][backend]


@pytest.mark.parametrize("backend", ["pycocotools", "faster_coco_eval"])
def test_eval_per_class_equals_pycocotools_on_the_detections_it_scored(fitted, backend):
    stats, folder = _eval(fitted, backend)
    detections = json.loads((folder / "detections.json").read_text())
    ann = fitted["paths"]["val_ann"]
    ev = pycocotools_eval(ann, detections)
    rows = [{k: (math.nan if v is None else v) for k, v in r.items()} for r in stats["per_class"]]
    assert_rows_equal(rows, reference_rows(ev))
    assert stats["val/map"] == pytest.approx(ev.stats[0], abs=1e-6)
    assert any(0 < r["AP"] < 1 for r in rows), f"degenerate per-class AP proves little: {rows}"
    assert not any("/per_class/" in k for k in stats)  # the rows carry them, not flat keys
    assert json.loads((folder / "per_class.json").read_text())["rows"] == stats["per_class"]


def test_readout_files_are_what_the_functions_make(fitted):
    from visiontf.evaluation.readouts.confusion import detection_confusion_matrix
    from visiontf.evaluation.readouts.tide import tide_errors

    _, folder = _eval(fitted, "faster_coco_eval")
    gt = json.loads(Path(fitted["paths"]["val_ann"]).read_text())
    detections = json.loads((folder / "detections.json").read_text())
    assert {d["image_id"] for d in detections} <= {im["id"] for im in gt["images"]} and len(detections) > NUM_VAL
    confusion = json.loads((folder / "confusion_matrix.json").read_text())
    assert confusion["matrix"] == detection_confusion_matrix(gt, detections).matrix.tolist()
    assert sum(map(sum, confusion["matrix"][:-1])) == sum(1 for a in gt["annotations"] if not a["iscrowd"])
    tide = json.loads((folder / "tide.json").read_text())
    assert tide["dAP"] == pytest.approx(tide_errors(gt, detections).main) and tide["counts"]["Miss"] >= 0
    from PIL import Image

    for name in ("pr_curves_iou50", "pr_curves_iou75", "confusion_matrix", "confusion_matrix_normalized", "tide"):
        with Image.open(folder / f"{name}.png") as im:
            assert im.size[0] > 300 and im.size[1] > 200


def test_tensorboard_holds_the_table_pictures_and_pr_curves(fitted):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (events,) = (fitted["run"] / "tb").glob("version_*")
    acc = EventAccumulator(str(events), size_guidance={"images": 0, "tensors": 0, "scalars": 0})
    acc.Reload()
    tags = acc.Tags()
    assert {"val/readouts/pr_curves_iou50", "val/readouts/confusion_matrix", "val/readouts/tide"} <= set(tags["images"])
    assert {"val_pr_iou50/circle", "val_pr_iou75/square", "val/per_class/text_summary"} <= set(tags["tensors"])
    assert {"val/per_class/AP/square", "val/per_class/AR100/circle"} & set(tags["scalars"])
    table = acc.Tensors("val/per_class/text_summary")[0].tensor_proto.string_val[0].decode()
    assert table.startswith("| category_id | name | AP |") and "| circle |" in table
    # the PR curve's precision row is COCO's interpolated precision, in TensorBoard's order (recall falling)
    import numpy as np
    from tensorboard.util import tensor_util

    curve = tensor_util.make_ndarray(acc.Tensors("val_pr_iou50/circle")[0].tensor_proto)  # [6, thresholds]
    pr = json.loads((fitted["run"] / "readouts" / "val" / "pr_curves.json").read_text())
    np.testing.assert_allclose(curve[4], np.array(pr["precision"]["0.50"]["circle"])[::-1], atol=1e-6)
    np.testing.assert_allclose(curve[5], np.array(pr["recall"])[::-1], atol=1e-6)
    csv = (fitted["run"] / "csv" / "version_0" / "metrics.csv").read_text().splitlines()[0]
    assert "val/per_class/AP/circle" in csv  # the CSV logger gets the per-class scalars too


def test_the_default_path_imports_no_tracker_and_no_web_app(fitted):
    """Only timm's own ``try: import wandb`` (timm/utils/summary.py) may import W&B, and only when it is installed."""
    importers = {(f["module"], Path(f["importer"]).as_posix().split("site-packages/")[-1] if f["importer"] else None)
                 for f in fitted["imports"]}
    assert not {m for m, _ in importers} & {"mlflow", "gradio"}, importers
    assert importers <= {("wandb", "timm/utils/summary.py")}, importers
    assert not any(str(ROOT / "visiontf") in (f["importer"] or "") for f in fitted["imports"])
