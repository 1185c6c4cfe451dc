"""PQ, SQ and RQ of panoptic predictions as a torchmetrics Metric that is exact under DDP.

Each image's per-category counts (:func:`~visiontf.evaluation.panoptic.pq_image_stats`, against its
ground-truth PNG) are computed on the rank that predicted it; every rank's rows are gathered, an
image repeated by Lightning's ``DistributedSampler`` is counted once (by image id, as
:class:`~visiontf.tasks.detection.coco_metric.CocoMetric`), and the sums give panopticapi's numbers.
"""
from __future__ import annotations

import json
import logging
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torchmetrics import Metric
from torchmetrics.utilities import dim_zero_cat

from visiontf.core.distributed import get_rank
from visiontf.evaluation.panoptic import (
    VOID,
    PanopticEvalError,
    check_panoptic_ground_truth,
    format_pq_table,
    pq_image_stats,
    pq_summary,
)
from visiontf.io.image_files import outside_its_folder
from visiontf.io.panoptic_ids import read_panoptic_png

__all__ = ["PQ_METRIC_NAMES", "PanopticMetric"]

log = logging.getLogger(__name__)

_RANK_STRIDE = 1 << 40
#: what :meth:`PanopticMetric.compute` returns (the tasks log them under ``<stage>/``)
PQ_METRIC_NAMES = ("pq", "sq", "rq", "pq_things", "sq_things", "rq_things", "pq_stuff", "sq_stuff", "rq_stuff")


def _cat(state: list[torch.Tensor] | torch.Tensor) -> np.ndarray | None:
    """A list state as one array (after a DDP sync it is already one tensor); None when empty."""
    if isinstance(state, list) and not state:
        return None
    return dim_zero_cat(state).cpu().numpy()


class PanopticMetric(Metric):
    """Panoptic quality of predictions against a COCO panoptic ground truth.

    Args:
        gt_json: the panoptic JSON (``annotations`` with ``segments_info``, ``categories`` with ``isthing``).
        gt_folder: its PNGs.
        label_to_cat_id: class index -> category id of the predictions' ``category_id``.

    ``update(preds, image_ids)``: per image ``(ids, segments_info)``: (H, W) segment ids at the original
    size and ``segments_info`` whose ``category_id`` is a class index (as the post-processing gives).
    A segment of a class with no category is unlabelled (its pixels void) and counted in
    ``last_unmapped``. ``compute()`` returns :data:`PQ_METRIC_NAMES` (fractions; -1 where no category
    counts) and sets ``last_results`` (panopticapi's dict) and ``last_table``.
    """

    is_differentiable = False
    higher_is_better = True
    full_state_update = False

    def __init__(self, gt_json: str | Path, gt_folder: str | Path, label_to_cat_id: Mapping[int, int], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.gt_json, self.gt_folder = Path(gt_json), Path(gt_folder)
        data = json.loads(self.gt_json.read_text())
        check_panoptic_ground_truth(data, gt_json)
        self.categories = {int(c["id"]): c for c in data["categories"]}
        for a in data["annotations"]:
            if (why := outside_its_folder(a["file_name"])) is not None:
                raise PanopticEvalError(f"{gt_json}: the annotation of image id {a['image_id']} names its PNG "
                                        f"{a['file_name']!r}, {why}; a PNG is named relative to its folder")
        self.gt = {a["image_id"]: a for a in data["annotations"]}
        self.label_to_cat_id = {int(k): int(v) for k, v in label_to_cat_id.items()}
        self.last_unmapped = 0
        self.last_results: dict[str, Any] | None = None
        self.last_table: str | None = None
        self._counter = 0
        for name in ("row_keys", "row_cats", "row_tp", "row_fp", "row_fn", "row_iou", "img_ids", "img_keys"):
            self.add_state(name, default=[], dist_reduce_fx="cat")

    def update(self, preds: Sequence[tuple[np.ndarray, Sequence[Mapping[str, Any]]]], image_ids: Sequence[int]) -> None:
        image_ids = torch.as_tensor(image_ids, dtype=torch.int64).reshape(-1).tolist()
        if len(preds) != len(image_ids):
            raise ValueError(f"PanopticMetric.update: {len(preds)} predictions but {len(image_ids)} image ids")
        for (ids, segments), image_id in zip(preds, image_ids):
            gt = self.gt.get(image_id)
            if gt is None:
                raise PanopticEvalError(f"{self.gt_json}: no ground truth for image id {image_id}")
            key = get_rank() * _RANK_STRIDE + self._counter
            self._counter += 1
            stats = pq_image_stats(read_panoptic_png(self.gt_folder / gt["file_name"]), gt["segments_info"],
                                   *self._as_categories(np.asarray(ids), segments), self.categories, image_id)
            cats = sorted(stats)
            values = np.array([stats[c] for c in cats], dtype=np.float64).reshape(-1, 4)
            device = self.device
            self.row_keys.append(torch.full((len(cats),), key, dtype=torch.int64, device=device))
            self.row_cats.append(torch.tensor(cats, dtype=torch.int64, device=device))
            self.row_iou.append(torch.as_tensor(values[:, 0], dtype=torch.float64, device=device))
            for name, col in (("row_tp", 1), ("row_fp", 2), ("row_fn", 3)):
                getattr(self, name).append(torch.as_tensor(values[:, col], dtype=torch.int64, device=device))
            self.img_ids.append(torch.tensor([image_id], dtype=torch.int64, device=device))
            self.img_keys.append(torch.tensor([key], dtype=torch.int64, device=device))

    def _as_categories(self, ids: np.ndarray, segments: Sequence[Mapping[str, Any]]) -> tuple[np.ndarray, list[dict]]:
        """Segment ids shifted by one (0 is void to panopticapi, a segment to DETR), class indices as category ids."""
        lookup = np.zeros(int(ids.max(initial=0)) + 2, dtype=np.int64)
        out = []
        for s in segments:
            cat = self.label_to_cat_id.get(int(s["category_id"]))
            if cat is None:
                self.last_unmapped += 1
                continue
            lookup[int(s["id"])] = int(s["id"]) + 1
            out.append({"id": int(s["id"]) + 1, "category_id": cat})
        return np.where(ids >= 0, lookup[np.clip(ids, 0, None)], VOID), out

    def compute(self) -> dict[str, torch.Tensor]:
        if self.last_unmapped:
            log.info("PanopticMetric: %d predicted segment(s) of classes with no category counted as unlabelled",
                     self.last_unmapped)
        img_ids, img_keys = _cat(self.img_ids), _cat(self.img_keys)
        if img_ids is None or not len(img_ids):
            return {name: torch.tensor(-1.0) for name in PQ_METRIC_NAMES}
        first = {}
        for i, k in sorted(zip(img_ids.tolist(), img_keys.tolist())):
            first.setdefault(i, k)
        stats: dict[int, list[float]] = defaultdict(lambda: [0.0, 0, 0, 0])
        keys = _cat(self.row_keys)
        if keys is not None:
            keep = np.isin(keys, list(first.values()))
            cats = _cat(self.row_cats)[keep]
            cols = [_cat(getattr(self, n))[keep] for n in ("row_iou", "row_tp", "row_fp", "row_fn")]
            for c, iou, tp, fp, fn in zip(cats.tolist(), *(col.tolist() for col in cols)):
                s = stats[c]
                stats[c] = [s[0] + iou, s[1] + tp, s[2] + fp, s[3] + fn]
        # the categories of the images seen (all of the file's, as panopticapi)
        results = pq_summary(stats, self.categories)
        self.last_results, self.last_table = results, format_pq_table(results)
        values = {}
        for suffix, part in (("", "All"), ("_things", "Things"), ("_stuff", "Stuff")):
            for k in ("pq", "sq", "rq"):
                values[k + suffix] = torch.tensor(float(results[part][k]), dtype=torch.float32)
        return values
