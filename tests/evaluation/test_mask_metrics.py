"""Mask AP equals pycocotools' COCOeval ``segm`` on real COCO annotations (polygons and crowd RLE), and both
mask metrics (mask AP, PQ) count an image once when ranks repeat it."""
from __future__ import annotations

import contextlib
import io
import json

import numpy as np
import pytest
import torch
from pycocotools import mask as mask_utils
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

import visiontf.tasks.detection.coco_mask_metric as cmm
import visiontf.tasks.detection.panoptic_metric as pqm
from visiontf.evaluation.coco import evaluate_coco
from visiontf.evaluation.panoptic import pq_compute
from visiontf.io.panoptic_ids import read_panoptic_png
from visiontf.tasks.detection.coco_mask_metric import CocoMaskMetric, encode_masks
from visiontf.tasks.detection.panoptic_metric import PanopticMetric

REAL = "tests/fixtures/coco_real/annotations"


def _predictions(coco: COCO, seed: int = 0) -> dict[int, dict[str, torch.Tensor]]:
    """Per image: masks near the ground truth (shifted, some relabelled), false positives, one on a crowd region."""
    rng = np.random.default_rng(seed)
    cats = sorted(coco.cats)
    preds = {}
    for img_id, img in coco.imgs.items():
        masks, scores, cats_of = [], [], []
        for ann in coco.imgToAnns[img_id]:
            m = coco.annToMask(ann).astype(bool)
            m = np.roll(m, tuple(int(v) for v in rng.integers(-6, 7, size=2)), axis=(0, 1))
            masks.append(m)
            cats_of.append(ann["category_id"] if rng.random() > 0.2 else int(rng.choice(cats)))
            scores.append(float(rng.random()))
        for _ in range(5):  # false positives
            m = np.zeros((img["height"], img["width"]), bool)
            y, x = int(rng.integers(0, img["height"] - 40)), int(rng.integers(0, img["width"] - 40))
            m[y:y + int(rng.integers(5, 40)), x:x + int(rng.integers(5, 40))] = True
            masks.append(m)
            cats_of.append(int(rng.choice(cats)))
            scores.append(float(rng.random()) * 0.5)
        preds[img_id] = {"masks": torch.as_tensor(np.stack(masks)), "scores": torch.tensor(scores),
                         "cat_ids": cats_of}
    return preds


def _pycocotools_segm(ann_file: str, preds: dict, drop=()) -> list[float]:
    gt = COCO(ann_file)
    results = []
    for img_id, p in preds.items():
        for m, s, c in zip(p["masks"].numpy(), p["scores"].tolist(), p["cat_ids"]):
            results.append({"image_id": img_id, "category_id": c, "score": s,
                            "segmentation": mask_utils.encode(np.asfortranarray(m.astype(np.uint8)))})
    with contextlib.redirect_stdout(io.StringIO()):
        ev = COCOeval(gt, gt.loadRes(results), "segm")
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    return [float(v) for v in ev.stats]


@pytest.mark.parametrize("split", ["train", "val"])
@pytest.mark.parametrize("backend", ["pycocotools", "faster_coco_eval"])
def test_mask_ap_equals_pycocotools_segm_on_real_annotations(split, backend):
    ann_file = f"{REAL}/instances_{split}2017.json"
    with contextlib.redirect_stdout(io.StringIO()):
        coco = COCO(ann_file)
    assert any(a["iscrowd"] and isinstance(a["segmentation"], dict) for a in coco.dataset["annotations"])
    preds = _predictions(coco)
    cat_ids = sorted(coco.cats)
    metric = CocoMaskMetric(ann_file, cat_ids, backend=backend)
    for img_id, p in preds.items():
        labels = torch.tensor([cat_ids.index(c) for c in p["cat_ids"]])
        metric.update([{"masks": p["masks"], "scores": p["scores"], "labels": labels}], [img_id])
    got = [float(v) for v in metric.compute().values()]
    want = _pycocotools_segm(ann_file, preds)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    assert 0.05 < want[0] < 0.95  # a score that can move


def test_segm_results_with_boxes_score_with_mask_areas():
    """A results file carrying both bbox and segmentation: the mask's area decides small/medium/large."""
    ann_file = f"{REAL}/instances_val2017.json"
    with contextlib.redirect_stdout(io.StringIO()):
        coco = COCO(ann_file)
    preds = _predictions(coco, seed=1)
    results = []
    for img_id, p in preds.items():
        for m, s, c in zip(p["masks"], p["scores"].tolist(), p["cat_ids"]):
            rle = encode_masks(m[None])[0]
            results.append({"image_id": img_id, "category_id": c, "score": s, "segmentation": rle,
                            "bbox": [0.0, 0.0, float(m.shape[1]), float(m.shape[0])]})  # a box of the whole image
    with_boxes = evaluate_coco(ann_file, results, backend="pycocotools", iou_type="segm")
    np.testing.assert_allclose(list(with_boxes.values()), _pycocotools_segm(ann_file, preds), rtol=0, atol=1e-6)


def test_mask_metric_merges_ranks_and_deduplicates(monkeypatch):
    ann_file = f"{REAL}/instances_val2017.json"
    with contextlib.redirect_stdout(io.StringIO()):
        coco = COCO(ann_file)
    preds = _predictions(coco)
    cat_ids = sorted(coco.cats)
    ids = sorted(preds)
    metrics = []
    for rank, subset in enumerate([ids[:2], ids[1:]]):  # the middle image on both ranks
        monkeypatch.setattr(cmm, "get_rank", lambda r=rank: r)
        m = CocoMaskMetric(ann_file, cat_ids, backend="pycocotools")
        for i in subset:
            p = preds[i]
            m.update([{"masks": p["masks"], "scores": p["scores"],
                       "labels": torch.tensor([cat_ids.index(c) for c in p["cat_ids"]])}], [i])
        metrics.append(m)
    metrics[0].merge_state(metrics[1])
    results, seen = metrics[0].results()
    assert seen == ids and len(results) == sum(len(p["scores"]) for p in preds.values())
    want = _pycocotools_segm(ann_file, preds)
    np.testing.assert_allclose([float(v) for v in metrics[0].compute().values()], want, rtol=0, atol=1e-6)
    _as_synced(metrics[0])  # after a real DDP sync every list state is one tensor
    np.testing.assert_allclose([float(v) for v in metrics[0].compute().values()], want, rtol=0, atol=1e-6)


def _as_synced(metric) -> None:
    from torchmetrics.utilities import dim_zero_cat

    for name in metric._defaults:
        setattr(metric, name, dim_zero_cat(getattr(metric, name)))


def test_panoptic_metric_equals_pq_compute_and_deduplicates(monkeypatch):
    """The fixed files of tests/fixtures/panoptic_small through the metric (ranks overlapping) give pq_compute's numbers."""
    root = "tests/fixtures/panoptic_small"
    pred = json.loads(open(f"{root}/pred.json").read())
    cats = [1, 2, 7, 9]
    metrics = []
    for rank, subset in enumerate([pred["annotations"][:2], pred["annotations"][1:]]):
        monkeypatch.setattr(pqm, "get_rank", lambda r=rank: r)
        m = PanopticMetric(f"{root}/gt.json", f"{root}/gt", dict(enumerate(cats)))
        for ann in subset:
            ids = read_panoptic_png(f"{root}/pred/{ann['file_name']}")
            # the post-processing's form: ids 0..n-1 (0 a segment), class indices; void pixels get an unmapped class
            order = sorted(s["id"] for s in ann["segments_info"])
            dense = np.full(ids.shape, len(order), dtype=np.int64)
            for k, seg_id in enumerate(order):
                dense[ids == seg_id] = k
            by_id = {s["id"]: s for s in ann["segments_info"]}
            info = [{"id": k, "category_id": cats.index(by_id[seg_id]["category_id"])} for k, seg_id in enumerate(order)]
            info.append({"id": len(order), "category_id": 99})  # no category: void
            m.update([(dense, info)], [ann["image_id"]])
        metrics.append(m)
    metrics[0].merge_state(metrics[1])
    _as_synced(metrics[0])
    got = metrics[0].compute()
    want = pq_compute(f"{root}/gt.json", f"{root}/pred.json", f"{root}/gt", f"{root}/pred")
    for suffix, part in (("", "All"), ("_things", "Things"), ("_stuff", "Stuff")):
        for k in ("pq", "sq", "rq"):
            assert got[k + suffix].item() == pytest.approx(want[part][k], abs=1e-6)
    assert metrics[0].last_table.splitlines()[2].startswith("All")
