"""Per-class COCO numbers equal slices of pycocotools' own accumulated arrays, on real COCO annotations.

The ground truth is the 100 real val2017 images of CompVis/taming-transformers (742 annotations, 67
of COCO's 80 categories present, 11 crowd regions: ``tests/fixtures/coco_real/boxes``). The detections are
made from it with a seeded generator: jittered boxes, swapped classes, duplicates, misses, background
boxes and detections of categories that have no object, so every branch of COCOeval is taken.
"""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from readout_data import ANN_100, assert_rows_equal, make_detections, pycocotools_eval, reference_rows

from visiontf.evaluation.coco import evaluate_coco
from visiontf.evaluation.readouts.per_class import CocoArrays, format_per_class_table, per_class_json, per_class_rows

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def real():
    gt = json.loads(ANN_100.read_text())
    dets = make_detections(gt)
    return gt, dets, pycocotools_eval(ANN_100, dets)


def test_the_real_annotations_are_what_the_test_needs(real):
    gt, dets, ev = real
    assert len(gt["images"]) == 100 and len(gt["annotations"]) == 742 and len(gt["categories"]) == 80
    assert sum(a["iscrowd"] for a in gt["annotations"]) == 11
    present = {a["category_id"] for a in gt["annotations"]}
    assert len(present) == 67 and max(present) == 88  # ids above 80: COCO's gaps
    # classes without objects, with and without detections: COCOeval's -1 (NaN here) on both
    assert {d["category_id"] for d in dets} - present
    assert 0.05 < ev.stats[0] < 0.95, "a degenerate AP would prove little"


@pytest.mark.parametrize("backend", ["pycocotools", "faster_coco_eval"])
def test_per_class_rows_equal_pycocotools_slices_on_real_coco(real, backend):
    gt, dets, ev = real
    stats = evaluate_coco(ANN_100, dets, backend=backend)
    rows = per_class_rows(stats.arrays, gt)
    assert_rows_equal(rows, reference_rows(ev))
    # the summary's AP / AP50 / AP75 / AR@100 are the means of the per-class numbers over classes with objects
    for key, stat in (("AP", "AP"), ("AP50", "AP50"), ("AP75", "AP75"), ("AR100", "AR_100")):
        values = [r[key] for r in rows if not math.isnan(r[key])]
        assert np.mean(values) == pytest.approx(stats[stat], abs=1e-12)
    assert len([r for r in rows if not math.isnan(r["AP"])]) == 67
    assert sum(r["num_gt"] for r in rows) == 742 - 11


@pytest.mark.parametrize("backend", ["pycocotools", "faster_coco_eval"])
def test_both_backends_give_the_same_arrays(real, backend):
    _, dets, ev = real
    arrays = evaluate_coco(ANN_100, dets, backend=backend).arrays
    np.testing.assert_allclose(arrays.precision, ev.eval["precision"], rtol=0, atol=1e-12)
    np.testing.assert_array_equal(arrays.recall, ev.eval["recall"])
    assert arrays.cat_ids == tuple(ev.params.catIds) and arrays.max_dets == (1, 10, 100)
    assert arrays.iou_index(0.5) == 0 and arrays.iou_index(0.75) == 5


def test_per_class_rows_on_an_image_subset(real):
    gt, dets, _ = real
    ids = sorted(im["id"] for im in gt["images"])[::3]
    ev = pycocotools_eval(ANN_100, dets, img_ids=ids)
    stats = evaluate_coco(ANN_100, dets, backend="faster_coco_eval", img_ids=ids)
    assert_rows_equal(per_class_rows(stats.arrays, gt, ids), reference_rows(ev))


def test_table_and_json(real):
    gt, dets, _ = real
    rows = per_class_rows(evaluate_coco(ANN_100, dets, backend="pycocotools").arrays, gt)
    table = format_per_class_table(rows).splitlines()
    assert table[0] == table[2] == table[-1] and table[0].startswith("+-") and len(table) == 80 + 4
    assert [c.strip() for c in table[1].strip("|").split("|")] == ["category", "AP", "AP50", "AP75", "AR@100", "GT"]
    person = next(line for line in table if line.startswith("| person "))
    row = rows[0]
    assert [c.strip() for c in person.strip("|").split("|")][1:] == [f"{round(row[k], 3)}" for k in ("AP", "AP50", "AP75", "AR100")] + [
        str(row["num_gt"])]
    absent = next(r for r in rows if r["num_gt"] == 0)
    assert f"| {absent['name']} " in format_per_class_table(rows) and "nan" in format_per_class_table([absent])
    payload = per_class_json(rows)
    json.dumps(payload, allow_nan=False)  # NaN would be invalid JSON
    assert next(r for r in payload if r["category_id"] == absent["category_id"])["AP"] is None


def test_arrays_refuse_an_iou_that_was_not_evaluated(real):
    arrays: CocoArrays = evaluate_coco(ANN_100, real[1], backend="pycocotools").arrays
    with pytest.raises(ValueError, match="not one of the evaluated thresholds"):
        arrays.iou_index(0.6001)


def test_results_file_cli_prints_per_class_and_writes_readouts(real, tmp_path):
    """``tools/eval.py --annotations A --predictions P --per_class --readouts D``: the table, the JSON, every file;
    still without torch."""
    gt, dets, ev = real
    res = tmp_path / "results.json"
    res.write_text(json.dumps(dets))
    out = tmp_path / "stats.json"
    code = ("import runpy, sys; sys.argv = ['eval.py', '--annotations', sys.argv[1], '--predictions', sys.argv[2], "
            "'--per_class', '--readouts', sys.argv[3], '--output', sys.argv[4]]; "
            "sys.modules['torch'] = None; runpy.run_path('tools/eval.py', run_name='__main__')")
    proc = subprocess.run([sys.executable, "-c", code, str(ANN_100), str(res), str(tmp_path / "readouts"), str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| category " in proc.stdout and "| person " in proc.stdout
    payload = json.loads(out.read_text())
    ref = reference_rows(ev)
    rows = [{k: (float("nan") if v is None else v) for k, v in r.items()} for r in payload["per_class"]]
    assert_rows_equal(rows, ref)
    files = sorted(p.name for p in (tmp_path / "readouts").iterdir())
    assert files == ["confusion_matrix.json", "confusion_matrix.png", "confusion_matrix_normalized.png", "per_class.json",
                     "per_class.txt", "pr_curves.json", "pr_curves_iou50.png", "pr_curves_iou75.png", "tide.json", "tide.png"]
    curves = json.loads((tmp_path / "readouts" / "pr_curves.json").read_text())
    np.testing.assert_allclose(curves["precision"]["0.50"]["person"], ev.eval["precision"][0, :, 0, 0, 2], atol=1e-6)
    np.testing.assert_allclose(curves["precision"]["0.75"]["person"], ev.eval["precision"][5, :, 0, 0, 2], atol=1e-6)


@pytest.mark.parametrize("backend", ["pycocotools", "faster_coco_eval"])
def test_coco_metric_over_two_ranks_gives_pycocotools_per_class_rows(real, backend, monkeypatch):
    """CocoMetric's per-class rows after two ranks' states are merged as DDP's gather merges them (an image
    seen on both ranks counts once), on the real annotations, with either backend; its readouts equal the
    confusion matrix and TIDE of the same detections."""
    import torch

    import visiontf.tasks.detection.coco_metric as cm
    from visiontf.evaluation.readouts.confusion import detection_confusion_matrix
    from visiontf.evaluation.readouts.tide import tide_errors

    gt, dets, _ = real
    # quarter pixels survive CocoMetric's float32 xyxy round trip exactly, so IoUs cannot move
    dets = [{**d, "bbox": [float(np.round(v * 4) / 4) for v in d["bbox"]]} for d in dets]
    dets = [d for d in dets if d["bbox"][2] > 0 and d["bbox"][3] > 0]
    cat_ids = sorted(c["id"] for c in gt["categories"])
    ids = [im["id"] for im in gt["images"]]
    half = len(ids) // 2
    metrics = []
    for rank, subset in enumerate([ids[:half] + [ids[half]], ids[half:] + [ids[0]]]):
        monkeypatch.setattr(cm, "_rank", lambda r=rank: r)
        metric = cm.CocoMetric(ANN_100, cat_ids, backend=backend)
        for i in subset:
            ds = [d for d in dets if d["image_id"] == i]
            xywh = torch.tensor([d["bbox"] for d in ds], dtype=torch.float32).reshape(-1, 4)
            metric.update([{"boxes": torch.cat([xywh[:, :2], xywh[:, :2] + xywh[:, 2:]], 1),
                            "scores": torch.tensor([d["score"] for d in ds]),
                            "labels": torch.tensor([cat_ids.index(d["category_id"]) for d in ds], dtype=torch.int64)}], [i])
        metrics.append(metric)
    metrics[0].merge_state(metrics[1])
    metrics[0].compute()
    ev = pycocotools_eval(ANN_100, dets)
    assert_rows_equal(metrics[0].last_per_class, reference_rows(ev), tol=1e-6)
    report = metrics[0].readouts(full=True, score_threshold=0.4)
    np.testing.assert_array_equal(report.confusion.matrix, detection_confusion_matrix(gt, dets, 0.4).matrix)
    assert report.tide.main == pytest.approx(tide_errors(gt, dets).main, abs=1e-9)
