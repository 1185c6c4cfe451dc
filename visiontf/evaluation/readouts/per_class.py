"""Per-class COCO numbers, read off the arrays COCOeval itself accumulates.

``COCOeval.accumulate()`` leaves ``eval["precision"]`` [T, R, K, A, M] (IoU thresholds, 101 recall
points, categories, area ranges, max-detections settings), ``eval["recall"]`` [T, K, A, M] and
``eval["scores"]`` [T, R, K, A, M]; -1 marks a category without ground truth. The 12 summary stats
are means over these arrays, so the per-class numbers here are the same means over one category's
slice (as mmdetection's ``classwise`` table and detectron2 compute them): AP is the mean of
``precision[:, :, k, all, 100]`` over entries > -1, AP50 and AP75 its rows at IoU 0.5 and 0.75,
AR@100 the mean of ``recall[:, k, all, 100]`` over entries > -1. Both backends (pycocotools,
faster-coco-eval) fill the same arrays.

Like :mod:`visiontf.evaluation.coco`, this module imports numpy only (no torch).
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["PER_CLASS_COLUMNS", "CocoArrays", "format_per_class_table", "per_class_json", "per_class_rows"]

#: the per-class numbers, in table order: (key in rows and JSON, column title)
PER_CLASS_COLUMNS = (("AP", "AP"), ("AP50", "AP50"), ("AP75", "AP75"), ("AR100", "AR@100"), ("num_gt", "GT"))


@dataclass(frozen=True)
class CocoArrays:
    """What ``COCOeval.accumulate()`` leaves, with the axes' values: enough for per-class numbers and PR curves."""

    precision: np.ndarray  # [T, R, K, A, M]; -1: no ground truth of that category
    recall: np.ndarray  # [T, K, A, M]
    scores: np.ndarray  # [T, R, K, A, M]: the score at which each recall point is reached
    iou_thrs: np.ndarray  # [T]
    rec_thrs: np.ndarray  # [R]
    cat_ids: tuple[int, ...]  # [K]
    area_labels: tuple[str, ...]  # [A]
    max_dets: tuple[int, ...]  # [M]

    @classmethod
    def from_eval(cls, ev: Any) -> CocoArrays:
        """From an evaluated and accumulated ``COCOeval`` of pycocotools or faster-coco-eval."""
        p = ev.params
        return cls(precision=np.asarray(ev.eval["precision"], dtype=np.float64),
                   recall=np.asarray(ev.eval["recall"], dtype=np.float64),
                   scores=np.asarray(ev.eval["scores"], dtype=np.float64),
                   iou_thrs=np.asarray(p.iouThrs, dtype=np.float64), rec_thrs=np.asarray(p.recThrs, dtype=np.float64),
                   cat_ids=tuple(int(c) for c in p.catIds), area_labels=tuple(p.areaRngLbl),
                   max_dets=tuple(int(m) for m in p.maxDets))

    def iou_index(self, iou: float) -> int:
        """The index of IoU threshold ``iou`` (0.5 -> 0, 0.75 -> 5 with COCO's thresholds)."""
        hits = np.flatnonzero(np.isclose(self.iou_thrs, iou))
        if not hits.size:
            raise ValueError(f"IoU {iou} is not one of the evaluated thresholds {self.iou_thrs.tolist()}")
        return int(hits[0])

    def class_slices(self, k: int, max_dets: int = 100, area: str = "all") -> tuple[np.ndarray, np.ndarray]:
        """``precision[:, :, k, area, max_dets]`` [T, R] and ``recall[:, k, area, max_dets]`` [T] of category index ``k``."""
        a, m = self.area_labels.index(area), self.max_dets.index(max_dets)
        return self.precision[:, :, k, a, m], self.recall[:, k, a, m]


def _mean_valid(x: np.ndarray) -> float:
    """COCOeval.summarize's mean: over entries > -1; NaN when there are none (no ground truth)."""
    valid = x[x > -1]
    return float(valid.mean()) if valid.size else float("nan")


def gt_counts(gt: Mapping[str, Any], img_ids: Iterable[int] | None = None) -> Counter:
    """Non-crowd ground-truth instances per category id in the evaluated images (what COCOeval counts:
    crowd regions are ignored, and the ``all`` area range takes every area)."""
    keep = None if img_ids is None else set(img_ids)
    return Counter(a["category_id"] for a in gt["annotations"]
                   if not a.get("iscrowd", 0) and (keep is None or a["image_id"] in keep))


def per_class_rows(arrays: CocoArrays, gt: Mapping[str, Any], img_ids: Iterable[int] | None = None) -> list[dict[str, Any]]:
    """One row per category of the evaluation, in ``cat_ids`` order: ``category_id``, ``name``, ``AP``,
    ``AP50``, ``AP75``, ``AR100`` (NaN for a category without ground truth, as COCOeval's -1) and
    ``num_gt`` (non-crowd instances in the evaluated images)."""
    names = {c["id"]: str(c.get("name", c["id"])) for c in gt["categories"]}
    counts = gt_counts(gt, img_ids)
    t50, t75 = arrays.iou_index(0.5), arrays.iou_index(0.75)
    rows = []
    for k, cat_id in enumerate(arrays.cat_ids):
        precision, recall = arrays.class_slices(k)
        rows.append({"category_id": cat_id, "name": names.get(cat_id, str(cat_id)), "AP": _mean_valid(precision),
                     "AP50": _mean_valid(precision[t50]), "AP75": _mean_valid(precision[t75]),
                     "AR100": _mean_valid(recall), "num_gt": int(counts.get(cat_id, 0))})
    return rows


def per_class_json(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` with NaN as ``null`` (JSON has no NaN)."""
    return [{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()} for r in rows]


def format_per_class_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """An ASCII table as mmdetection prints its classwise COCO results (terminaltables' ``AsciiTable``
    layout, values rounded to 3 decimals, ``nan`` for a category without ground truth)."""
    header = ["category", *(title for _, title in PER_CLASS_COLUMNS)]

    def cell(v: Any) -> str:
        if isinstance(v, float):
            return "nan" if math.isnan(v) else f"{round(v, 3)}"
        return str(v)

    body = [[str(r["name"]), *(cell(r[key]) for key, _ in PER_CLASS_COLUMNS)] for r in rows]
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]
    rule = "+" + "+".join("-" * (w + 2) for w in widths) + "+"

    def line(cells: Sequence[str]) -> str:
        return "|" + "|".join(f" {c:<{w}} " for c, w in zip(cells, widths)) + "|"

    return "\n".join([rule, line(header), rule, *(line(b) for b in body), rule])
