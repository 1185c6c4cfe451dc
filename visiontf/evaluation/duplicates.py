"""How often a detector puts two confident predictions on one object (what NMS would hide).

A set-prediction detector (DETR's one-to-one matching) should not need NMS. This counts the pairs
of predictions of one image and one category that overlap with IoU > ``iou`` while both score more
than ``score``: the duplicates an NMS at that IoU would remove, among detections that matter.
The defaults (IoU 0.7, score 0.3) are those reported beside mAP in docs/record/detection.md ("Duplicates").
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping

import torch
from torchvision.ops import box_convert, box_iou

__all__ = ["duplicate_stats"]


def duplicate_stats(results: Iterable[Mapping], iou: float = 0.7, score: float = 0.3) -> dict[str, float]:
    """Duplicate pairs among COCO-format results (``image_id``, ``category_id``, ``bbox`` xywh, ``score``).

    Returns ``dup_pairs`` (the number of such pairs), ``confident`` (detections scoring > ``score``)
    and ``dup_rate`` = pairs / confident detections (0 when there are none): 0.1 means one
    duplicate pair for every ten confident detections.
    """
    groups: dict[tuple[int, int], list[list[float]]] = defaultdict(list)
    for r in results:
        if r["score"] > score:
            groups[(int(r["image_id"]), int(r["category_id"]))].append(list(r["bbox"]))
    pairs = confident = 0
    for boxes in groups.values():
        confident += len(boxes)
        if len(boxes) < 2:
            continue
        xyxy = box_convert(torch.tensor(boxes, dtype=torch.float64), "xywh", "xyxy")
        pairs += int(torch.triu(box_iou(xyxy, xyxy) > iou, diagonal=1).sum())
    return {"dup_pairs": float(pairs), "confident": float(confident), "dup_rate": pairs / confident if confident else 0.0}
