"""Panoptic quality (Kirillov et al., 2019): PQ, SQ and RQ, overall, for things and for stuff, as
cocodataset/panopticapi's ``pq_compute`` counts them.

Per image (:func:`pq_image_stats`): a predicted and a ground-truth segment of one category match when
their IoU is above 0.5, the IoU's union leaving out the predicted segment's unlabelled (void, id 0)
pixels; crowd regions match nothing; an unmatched non-crowd ground truth is a false negative; an
unmatched prediction is a false positive unless more than half of it lies on void or on a crowd region
of its category. Ground-truth areas are the ``segments_info`` ``area``s, predicted ones are counted
in the PNG. Per category (:func:`pq_average`): ``PQ = sum IoU / (TP + FP/2 + FN/2)``, ``SQ = sum IoU /
TP``, ``RQ = TP / (TP + FP/2 + FN/2)``, averaged over the categories with any TP, FP or FN.

:func:`pq_compute` takes panopticapi's files (JSON + PNG folders) and returns its numbers
(``tests/test_panoptic_quality.py`` holds panopticapi's own on fixed files; ``benchmarks/panoptic_parity.py``
runs a checkout of it). numpy and Pillow only, like :mod:`visiontf.evaluation.coco`.
"""
from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from visiontf.core.errors import UserError
from visiontf.io.panoptic_ids import read_panoptic_png

__all__ = ["OFFSET", "VOID", "PanopticEvalError", "format_pq_table", "pq_average", "pq_compute", "pq_image_stats",
           "pq_summary"]

#: panopticapi's: a (ground truth id, predicted id) pair as one integer; id 0 is unlabelled
OFFSET = 256 * 256 * 256
VOID = 0

#: per category: [sum of matched IoUs, TP, FP, FN]
Stats = dict[int, list[float]]


class PanopticEvalError(UserError, ValueError):
    """Panoptic predictions or ground truth that cannot be scored; the message names the image and the fix."""


def pq_image_stats(gt_ids: np.ndarray, gt_segments: Iterable[Mapping[str, Any]], pred_ids: np.ndarray,
                   pred_segments: Iterable[Mapping[str, Any]], categories: Iterable[int], image_id: Any = None) -> Stats:
    """One image's per-category ``[IoU sum, TP, FP, FN]`` (see the module docstring).

    ``gt_ids``/``pred_ids``: (H, W) segment ids; ``*_segments``: ``segments_info`` (``id``, ``category_id``;
    ground truth also ``iscrowd`` and ``area``). Raises :class:`PanopticEvalError` where panopticapi
    raises: a predicted id missing from the segments or the PNG, an unknown category.
    """
    if gt_ids.shape != pred_ids.shape:
        raise PanopticEvalError(f"image {image_id}: prediction {pred_ids.shape} and ground truth {gt_ids.shape} differ in size")
    known = set(categories)
    gt_segms = {int(s["id"]): dict(s) for s in gt_segments}
    pred_segms = {int(s["id"]): dict(s) for s in pred_segments}
    labels, counts = np.unique(pred_ids, return_counts=True)
    unlisted = set(pred_segms)
    for label, count in zip(labels.tolist(), counts.tolist()):
        if label not in pred_segms:
            if label == VOID:
                continue
            raise PanopticEvalError(f"image {image_id}: segment id {label} is in the PNG but not in segments_info")
        pred_segms[label]["area"] = count
        unlisted.discard(label)
        if pred_segms[label]["category_id"] not in known:
            raise PanopticEvalError(f"image {image_id}: segment {label} has unknown category_id {pred_segms[label]['category_id']}")
    if unlisted:
        raise PanopticEvalError(f"image {image_id}: segment ids {sorted(unlisted)} are in segments_info but not in the PNG")

    pairs, inter = np.unique(gt_ids.astype(np.uint64) * OFFSET + pred_ids.astype(np.uint64), return_counts=True)
    gt_pred = {(int(p // OFFSET), int(p % OFFSET)): int(n) for p, n in zip(pairs.tolist(), inter.tolist())}
    stats: Stats = defaultdict(lambda: [0.0, 0, 0, 0])
    gt_matched, pred_matched = set(), set()
    for (gt_label, pred_label), intersection in gt_pred.items():
        if gt_label not in gt_segms or pred_label not in pred_segms:
            continue
        gt, pred = gt_segms[gt_label], pred_segms[pred_label]
        if gt["iscrowd"] == 1 or gt["category_id"] != pred["category_id"]:
            continue
        union = pred["area"] + gt["area"] - intersection - gt_pred.get((VOID, pred_label), 0)
        iou = intersection / union
        if iou > 0.5:
            s = stats[gt["category_id"]]
            s[1] += 1
            s[0] += iou
            gt_matched.add(gt_label)
            pred_matched.add(pred_label)
    crowd_of_category = {}
    for gt_label, gt in gt_segms.items():
        if gt_label in gt_matched:
            continue
        if gt["iscrowd"] == 1:
            crowd_of_category[gt["category_id"]] = gt_label
            continue
        stats[gt["category_id"]][3] += 1
    for pred_label, pred in pred_segms.items():
        if pred_label in pred_matched:
            continue
        intersection = gt_pred.get((VOID, pred_label), 0)
        if pred["category_id"] in crowd_of_category:
            intersection += gt_pred.get((crowd_of_category[pred["category_id"]], pred_label), 0)
        if intersection / pred["area"] > 0.5:
            continue
        stats[pred["category_id"]][2] += 1
    return dict(stats)


def pq_average(stats: Mapping[int, list[float]], categories: Mapping[int, Mapping[str, Any]],
               isthing: bool | None = None) -> tuple[dict[str, float], dict[int, dict[str, float]]]:
    """``({"pq", "sq", "rq", "n"}, per-category {"pq", "sq", "rq"})`` over ``categories`` (``isthing``: only things
    (True) or stuff (False)). With no category to average, the averages are -1 (panopticapi divides by zero)."""
    total = [0.0, 0.0, 0.0]
    n, per_class = 0, {}
    for cat, info in categories.items():
        if isthing is not None and (info["isthing"] == 1) != isthing:
            continue
        iou, tp, fp, fn = stats.get(cat, [0.0, 0, 0, 0])
        if tp + fp + fn == 0:
            per_class[cat] = {"pq": 0.0, "sq": 0.0, "rq": 0.0}
            continue
        n += 1
        denom = tp + 0.5 * fp + 0.5 * fn
        values = (iou / denom, iou / tp if tp != 0 else 0, tp / denom)
        per_class[cat] = dict(zip(("pq", "sq", "rq"), values))
        total = [t + v for t, v in zip(total, values)]
    if n == 0:
        return {"pq": -1.0, "sq": -1.0, "rq": -1.0, "n": 0}, per_class
    return {"pq": total[0] / n, "sq": total[1] / n, "rq": total[2] / n, "n": n}, per_class


def pq_summary(stats: Mapping[int, list[float]], categories: Mapping[int, Mapping[str, Any]]) -> dict[str, Any]:
    """panopticapi's result: ``{"All", "Things", "Stuff": {"pq", "sq", "rq", "n"}, "per_class": {...}}``."""
    results: dict[str, Any] = {}
    for name, isthing in (("All", None), ("Things", True), ("Stuff", False)):
        results[name], per_class = pq_average(stats, categories, isthing)
        if name == "All":
            results["per_class"] = per_class
    return results


def format_pq_table(results: Mapping[str, Any]) -> str:
    """The table panopticapi prints (PQ, SQ, RQ in percent and the category count per row)."""
    lines = ["{:10s}| {:>5s}  {:>5s}  {:>5s} {:>5s}".format("", "PQ", "SQ", "RQ", "N"), "-" * (10 + 7 * 4)]
    for name in ("All", "Things", "Stuff"):
        r = results[name]
        lines.append("{:10s}| {:5.1f}  {:5.1f}  {:5.1f} {:5d}".format(name, 100 * r["pq"], 100 * r["sq"], 100 * r["rq"], r["n"]))
    return "\n".join(lines)


def _load(path: Path) -> dict:
    if not Path(path).is_file():
        raise PanopticEvalError(f"{path}: panoptic JSON not found")
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def pq_compute(gt_json_file: str | Path, pred_json_file: str | Path, gt_folder: str | Path | None = None,
               pred_folder: str | Path | None = None) -> dict[str, Any]:
    """panopticapi's ``pq_compute`` on its files: every ground-truth image needs a prediction; the folders
    default to the JSON paths without ``.json``. Returns :func:`pq_summary`'s dict."""
    gt_json, pred_json = _load(Path(gt_json_file)), _load(Path(pred_json_file))
    gt_folder = Path(gt_folder) if gt_folder is not None else Path(str(gt_json_file).replace(".json", ""))
    pred_folder = Path(pred_folder) if pred_folder is not None else Path(str(pred_json_file).replace(".json", ""))
    for folder in (gt_folder, pred_folder):
        if not folder.is_dir():
            raise PanopticEvalError(f"{folder}: folder of panoptic PNGs not found")
    categories = {c["id"]: c for c in gt_json["categories"]}
    preds = {a["image_id"]: a for a in pred_json["annotations"]}
    stats: dict[int, list[float]] = defaultdict(lambda: [0.0, 0, 0, 0])
    for gt in gt_json["annotations"]:
        pred = preds.get(gt["image_id"])
        if pred is None:
            raise PanopticEvalError(f"{pred_json_file}: no prediction for the image with id {gt['image_id']}")
        image = pq_image_stats(read_panoptic_png(gt_folder / gt["file_name"]), gt["segments_info"],
                               read_panoptic_png(pred_folder / pred["file_name"]), pred["segments_info"], categories,
                               gt["image_id"])
        for cat, s in image.items():
            stats[cat] = [a + b for a, b in zip(stats[cat], s)]
    return pq_summary(stats, categories)
