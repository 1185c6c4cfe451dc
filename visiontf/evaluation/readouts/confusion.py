"""A detection confusion matrix: which class each object was taken for, and what was missed or invented.

Convention (tested on hand-made cases in ``tests/evaluation/test_detection_confusion.py``):

* **Rows** are the truth: the K categories, then ``background`` (detections that match no object:
  false positives). **Columns** are the prediction: the K categories, then ``background`` (objects
  no detection matched: missed). The ``background``/``background`` cell is always 0. Row sums are
  the objects of each class (the last row: the false positives); column sums the detections of each class.
* Only detections with ``score > score_threshold`` take part (``Predictor``'s and supervision's ``>``).
* **Matching is one-to-one, greedy by score, across classes**: detections of an image, highest score
  first, each take the still unmatched object with the highest IoU, if that IoU is >= ``iou_threshold``
  (COCOeval's order and ``>=``; ties go to the object listed first). An object taken by a detection
  of another class is a confusion, not a miss. supervision and ultralytics match greedily by IoU
  instead (the pair of highest IoU first, whatever the scores); here the most confident claim wins,
  as it does for AP.
* Crowd regions (``iscrowd: 1``) are no objects: a detection left unmatched that lies inside one of
  its own category (COCO's crowd IoU, the intersection over the detection's area, >= ``iou_threshold``)
  is not counted at all, as COCOeval ignores it.
* **Normalised**: each row divided by its sum, so a class's row reads "of its objects, the share
  predicted as each class or missed" and the background row "of the false positives, the share
  of each predicted class". A row without any entry stays 0.

numpy and pycocotools' box IoU only (no torch), like the rest of the COCO evaluation.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from pycocotools import mask as mask_utils

__all__ = ["BACKGROUND", "DetectionConfusion", "detection_confusion_matrix"]

BACKGROUND = "background"


@dataclass(frozen=True)
class DetectionConfusion:
    """``matrix`` (K+1, K+1) counts, rows truth and columns prediction, the last of each ``background``."""

    matrix: np.ndarray
    names: tuple[str, ...]  # K category names, then "background"
    cat_ids: tuple[int, ...]  # K category ids
    score_threshold: float
    iou_threshold: float

    def normalized(self) -> np.ndarray:
        """Each row divided by its sum (rows without entries stay 0)."""
        sums = self.matrix.sum(axis=1, keepdims=True)
        return np.divide(self.matrix, sums, out=np.zeros(self.matrix.shape, dtype=np.float64), where=sums > 0)

    @property
    def missed(self) -> np.ndarray:
        """Objects of each class that no detection matched (the background column)."""
        return self.matrix[:-1, -1]

    @property
    def false_positives(self) -> np.ndarray:
        """Detections of each class that matched no object (the background row)."""
        return self.matrix[-1, :-1]

    def to_json(self) -> dict[str, Any]:
        return {"convention": "rows: truth, columns: prediction; last row/column: background (false positives / "
                              "missed); one-to-one matching across classes, greedy by score",
                "score_threshold": self.score_threshold, "iou_threshold": self.iou_threshold,
                "names": list(self.names), "category_ids": list(self.cat_ids),
                "matrix": self.matrix.astype(int).tolist(),
                "normalized": np.round(self.normalized(), 6).tolist()}


def _by_image(items: Iterable[Mapping[str, Any]], keep: set | None) -> dict[Any, list[Mapping[str, Any]]]:
    out: dict[Any, list[Mapping[str, Any]]] = defaultdict(list)
    for item in items:
        if keep is None or item["image_id"] in keep:
            out[item["image_id"]].append(item)
    return out


def detection_confusion_matrix(
    gt: Mapping[str, Any],
    results: Sequence[Mapping[str, Any]],
    score_threshold: float = 0.5,
    iou_threshold: float = 0.5,
    img_ids: Iterable[int] | None = None,
) -> DetectionConfusion:
    """The confusion matrix of COCO ``results`` (``image_id``, ``category_id``, ``bbox`` xywh, ``score``)
    against the COCO annotation dict ``gt``, over ``img_ids`` (default: every image); see the module
    docstring for the convention."""
    cats = sorted(gt["categories"], key=lambda c: c["id"])
    cat_ids = tuple(int(c["id"]) for c in cats)
    index = {c: i for i, c in enumerate(cat_ids)}
    K = len(cat_ids)
    matrix = np.zeros((K + 1, K + 1), dtype=np.int64)
    keep = None if img_ids is None else set(img_ids)
    images = [im["id"] for im in gt["images"] if keep is None or im["id"] in keep]
    truths = _by_image(gt["annotations"], keep)
    dets_of = _by_image((r for r in results if r["score"] > score_threshold), keep)
    for image_id in images:
        objects = [a for a in truths.get(image_id, []) if not a.get("iscrowd", 0)]
        crowds = [a for a in truths.get(image_id, []) if a.get("iscrowd", 0)]
        dets = sorted(dets_of.get(image_id, []), key=lambda d: -d["score"])  # stable: ties keep their order
        taken = np.zeros(len(objects), dtype=bool)
        if dets and objects:
            iou = np.asarray(mask_utils.iou([list(d["bbox"]) for d in dets], [list(a["bbox"]) for a in objects],
                                            [0] * len(objects))).reshape(len(dets), len(objects))
        else:
            iou = np.zeros((len(dets), len(objects)))
        in_crowd = np.zeros(len(dets))
        if dets and crowds:
            ioa = np.asarray(mask_utils.iou([list(d["bbox"]) for d in dets], [list(a["bbox"]) for a in crowds],
                                            [1] * len(crowds))).reshape(len(dets), len(crowds))
            same = np.array([[d["category_id"] == a["category_id"] for a in crowds] for d in dets])
            in_crowd = np.where(same, ioa, 0.0).max(axis=1)
        for i, det in enumerate(dets):
            free = np.where(taken, -1.0, iou[i])
            j = int(free.argmax()) if len(objects) else -1
            if j >= 0 and free[j] >= iou_threshold:
                taken[j] = True
                matrix[index[objects[j]["category_id"]], index[det["category_id"]]] += 1
            elif in_crowd[i] < iou_threshold:
                matrix[K, index[det["category_id"]]] += 1
        for j in np.flatnonzero(~taken):
            matrix[index[objects[j]["category_id"]], K] += 1
    names = tuple(str(c.get("name", c["id"])) for c in cats) + (BACKGROUND,)
    return DetectionConfusion(matrix, names, cat_ids, float(score_threshold), float(iou_threshold))
