"""Panoptic quality (Kirillov et al., 2019): PQ, SQ and RQ, overall, for things and for stuff, as
cocodataset/panopticapi's ``pq_compute`` counts them.

Per image (:func:`pq_image_stats`): a predicted and a ground-truth segment of one category match when
their IoU is above 0.5, the IoU's union leaving out the predicted segment's unlabelled (void, id 0)
pixels; crowd regions match nothing; an unmatched non-crowd ground truth is a false negative; an
unmatched prediction is a false positive unless more than half of it lies on void or on a crowd region
of its category. Ground-truth areas are the ``segments_info`` ``area``s, predicted ones are counted
in the PNG. Per category (:func:`pq_average`): ``PQ = sum IoU / (TP + FP/2 + FN/2)``, ``SQ = sum IoU /
TP``, ``RQ = TP / (TP + FP/2 + FN/2)``, averaged over the categories with any TP, FP or FN.

:func:`pq_compute` takes panopticapi's files (JSON + PNG folders) and returns its numbers, to the last bit
(``tests/evaluation/test_panoptic_quality.py`` compares them with panopticapi's own, which
``scripts/fixtures/make_panopticapi.py`` records from a checkout of it). numpy and Pillow only, like
:mod:`visiontf.evaluation.coco`.
"""
from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from visiontf.core.errors import UserError
from visiontf.io.coco_fields import panoptic_category_problem, segment_problem
from visiontf.io.image_files import outside_its_folder
from visiontf.io.panoptic_ids import VOID, read_panoptic_png

__all__ = ["OFFSET", "VOID", "PanopticEvalError", "check_panoptic_ground_truth", "format_pq_table", "pq_average", "pq_compute",
           "pq_image_stats", "pq_summary"]

#: panopticapi's: a (ground truth id, predicted id) pair as one integer; id 0 is unlabelled (VOID)
OFFSET = 256 * 256 * 256

#: per category: [sum of matched IoUs, TP, FP, FN]
Stats = dict[int, list[float]]


class PanopticEvalError(UserError, ValueError):
    """Panoptic predictions or ground truth that cannot be scored; the message names the image and the fix."""


def check_panoptic_ground_truth(data: Any, name: str | Path) -> None:
    """Refuse a panoptic ground truth whose fields PQ would read wrongly or fail on (the dataset's rules,
    :mod:`visiontf.io.coco_fields`): ``isthing`` and ``iscrowd`` other than 0/1 (a ``"1"`` or ``2`` is neither a thing
    nor a crowd region to PQ), ids that are not integers, and an ``area`` (PQ's union) that is missing or not a
    pixel count."""
    if not isinstance(data, dict) or not isinstance(data.get("categories"), list) or not isinstance(data.get("annotations"), list):
        raise PanopticEvalError(f"{name}: not a COCO panoptic file ('annotations' and 'categories' lists)")
    for i, category in enumerate(data["categories"]):
        problem = panoptic_category_problem(category) if isinstance(category, dict) else "no object"
        if problem is not None:
            raise PanopticEvalError(f"{name}: categories[{i}] has {problem}")
    for i, ann in enumerate(data["annotations"]):
        if not isinstance(ann, dict) or not isinstance(ann.get("segments_info"), list):
            raise PanopticEvalError(f"{name}: annotations[{i}] needs 'image_id', 'file_name' and a 'segments_info' list")
        for segment in ann["segments_info"]:
            problem = segment_problem(segment)
            if problem is None and "area" not in segment:
                problem = f"segment {segment['id']} without 'area' (its pixel count, PQ's union)"
            if problem is not None:
                raise PanopticEvalError(f"{name}: image id {ann.get('image_id')} has {problem}")


def pq_image_stats(gt_ids: np.ndarray, gt_segments: Iterable[Mapping[str, Any]], pred_ids: np.ndarray,
                   pred_segments: Iterable[Mapping[str, Any]], categories: Iterable[int], image_id: Any = None) -> Stats:
    """One image's per-category ``[IoU sum, TP, FP, FN]`` (see the module docstring).

    ``gt_ids``/``pred_ids``: (H, W) segment ids; ``*_segments``: ``segments_info`` (``id``, ``category_id``;
    ground truth also ``iscrowd`` and ``area``). Raises :class:`PanopticEvalError` where panopticapi
    raises: a predicted id missing from the segments or the PNG, an unknown category.

    Every count is read from one table, the pixels of each (ground-truth id, predicted id) pair: a single
    ``bincount`` over the two maps' id indices combined. A category is in the result once it has a TP, FP
    or FN, and its IoUs add up in the order of the pairs' ids (ground truth, then prediction), as panopticapi's.
    """
    if gt_ids.shape != pred_ids.shape:
        raise PanopticEvalError(f"image {image_id}: prediction {pred_ids.shape} and ground truth {gt_ids.shape} differ in size")
    known = set(categories)
    gt_info = {int(s["id"]): s for s in gt_segments}
    pred_info = {int(s["id"]): s for s in pred_segments}

    # rows: the ids of the ground-truth map, columns: those of the prediction (both sorted)
    gt_present, gt_index = np.unique(gt_ids, return_inverse=True)
    pred_present, pred_index = np.unique(pred_ids, return_inverse=True)
    n_rows, n_cols = len(gt_present), len(pred_present)
    table = np.bincount(gt_index.ravel() * n_cols + pred_index.ravel(), minlength=n_rows * n_cols).reshape(n_rows, n_cols)
    pred_area = table.sum(axis=0)
    row_ids, col_ids = gt_present.tolist(), pred_present.tolist()

    # the prediction's consistency, in the order of its ids
    for pid in col_ids:
        if pid not in pred_info:
            if pid == VOID:
                continue
            raise PanopticEvalError(f"image {image_id}: segment id {pid} is in the PNG but not in segments_info")
        if pred_info[pid]["category_id"] not in known:
            raise PanopticEvalError(f"image {image_id}: segment {pid} has unknown category_id {pred_info[pid]['category_id']}")
    absent = sorted(set(pred_info) - set(col_ids))
    if absent:
        raise PanopticEvalError(f"image {image_id}: segment ids {absent} are in segments_info but not in the PNG")
    # the ground truth's too: panopticapi leaves its unlisted ids out without a word, which hides a broken
    # annotation (those pixels would count as neither a segment nor void)
    unlisted = [gid for gid in row_ids if gid != VOID and gid not in gt_info]
    if unlisted:
        raise PanopticEvalError(f"image {image_id}: the ground truth's PNG has segment id(s) {unlisted[:5]} that its "
                                "segments_info does not list; list them with their category, or paint them 0 (unlabelled)")

    # a column is a predicted segment when listed; a row can match when listed and not a crowd region
    col_listed = np.array([pid in pred_info for pid in col_ids], dtype=bool)
    col_cat = np.array([pred_info[pid]["category_id"] if pid in pred_info else 0 for pid in col_ids], dtype=np.int64)
    row_of = {gid: r for r, gid in enumerate(row_ids)}
    row_open = np.zeros(n_rows, dtype=bool)
    row_cat = np.zeros(n_rows, dtype=np.int64)
    row_area = np.zeros(n_rows, dtype=np.float64)
    gt_pixels = table.sum(axis=1)
    for gid, info in gt_info.items():
        r = row_of.get(gid)
        if r is not None and info["area"] != gt_pixels[r]:
            # panopticapi takes the file's area as the union's: another number moves every IoU of the segment
            raise PanopticEvalError(f"image {image_id}: ground-truth segment {gid} has area {info['area']}, but its PNG "
                                    f"has {int(gt_pixels[r])} pixels of it; area is the segment's pixel count")
        if r is not None and info.get("iscrowd", 0) != 1:
            row_open[r], row_cat[r], row_area[r] = True, info["category_id"], info["area"]
    void_row = row_of.get(VOID)
    on_void = table[void_row] if void_row is not None else np.zeros(n_cols, dtype=table.dtype)

    # TP: overlapping pairs of one category whose IoU, with the prediction's void pixels out of the union, is above 0.5
    pairs = (table > 0) & row_open[:, None] & col_listed[None, :] & (row_cat[:, None] == col_cat[None, :])
    union = pred_area[None, :] + row_area[:, None] - table - on_void[None, :]
    iou = np.divide(table, union, out=np.zeros(table.shape), where=pairs)
    hit_rows, hit_cols = np.nonzero(pairs & (iou > 0.5))

    stats: Stats = {}

    def add(cat: Any, column: int, amount: float) -> None:
        stats.setdefault(cat, [0.0, 0, 0, 0])[column] += amount

    for r, c in zip(hit_rows.tolist(), hit_cols.tolist()):
        add(gt_info[row_ids[r]]["category_id"], 0, float(iou[r, c]))
        add(gt_info[row_ids[r]]["category_id"], 1, 1)
    matched_gt = {row_ids[r] for r in hit_rows.tolist()}

    # FN: the listed segments that matched nothing, crowd regions aside (those listed but absent from the PNG too)
    missed = [info["category_id"] for gid, info in gt_info.items() if info.get("iscrowd", 0) != 1 and gid not in matched_gt]
    for cat in missed:
        add(cat, 3, 1)

    # FP: the listed predictions that matched nothing, but those lying more than half on void or on the crowd region
    # of their category (of several such regions, the one listed last)
    crowd_of = {info["category_id"]: row_of.get(gid) for gid, info in gt_info.items() if info.get("iscrowd", 0) == 1}
    crowd_rows = np.array([-1 if crowd_of.get(cat) is None else crowd_of[cat] for cat in col_cat.tolist()], dtype=np.int64)
    on_crowd = np.where(crowd_rows >= 0, table[np.maximum(crowd_rows, 0), np.arange(n_cols)], 0)
    unmatched = col_listed.copy()
    unmatched[hit_cols] = False
    false_positive = unmatched & ((on_void + on_crowd) / pred_area <= 0.5)
    for c in np.flatnonzero(false_positive).tolist():
        add(pred_info[col_ids[c]]["category_id"], 2, 1)
    return stats


def pq_average(stats: Mapping[int, list[float]], categories: Mapping[int, Mapping[str, Any]],
               isthing: bool | None = None) -> tuple[dict[str, float], dict[int, dict[str, float]]]:
    """``({"pq", "sq", "rq", "n"}, per-category {"pq", "sq", "rq"})`` over ``categories`` (``isthing``: only things
    (True) or stuff (False)). A category nobody annotated nor predicted scores 0 and is left out of the means;
    with none left, the means are -1 (where panopticapi divides by zero)."""
    per_class: dict[int, dict[str, float]] = {}
    counted: list[dict[str, float]] = []
    for cat, info in categories.items():
        if isthing is not None and (info["isthing"] == 1) != isthing:
            continue
        iou_sum, tp, fp, fn = stats.get(cat, (0.0, 0, 0, 0))
        # PQ's denominator: matched segments, plus half of the unmatched ones on either side
        weight = tp + (fp + fn) / 2
        scores = {"pq": 0.0, "sq": 0.0, "rq": 0.0}
        if weight > 0:
            scores = {"pq": iou_sum / weight, "sq": iou_sum / tp if tp else 0.0, "rq": tp / weight}
            counted.append(scores)
        per_class[cat] = scores
    if not counted:
        return {"pq": -1.0, "sq": -1.0, "rq": -1.0, "n": 0}, per_class
    # the means add the categories in order, one at a time, as panopticapi does (the last bits agree)
    means = {key: sum(scores[key] for scores in counted) / len(counted) for key in ("pq", "sq", "rq")}
    return {**means, "n": len(counted)}, per_class


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
    check_panoptic_ground_truth(gt_json, gt_json_file)
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
        for file, entry in ((gt_json_file, gt), (pred_json_file, pred)):
            if (why := outside_its_folder(entry["file_name"])) is not None:
                raise PanopticEvalError(f"{file}: the annotation of image id {entry['image_id']} names its PNG "
                                        f"{entry['file_name']!r}, {why}; a PNG is named relative to its folder")
        image = pq_image_stats(read_panoptic_png(gt_folder / gt["file_name"]), gt["segments_info"],
                               read_panoptic_png(pred_folder / pred["file_name"]), pred["segments_info"], categories,
                               gt["image_id"])
        for cat, s in image.items():
            stats[cat] = [a + b for a, b in zip(stats[cat], s)]
    return pq_summary(stats, categories)
