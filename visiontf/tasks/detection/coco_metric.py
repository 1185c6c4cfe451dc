"""COCO box mAP as a torchmetrics Metric that is exact under DDP.

torchmetrics' ``MeanAveragePrecision`` knows no image ids, so the samples that Lightning's
``DistributedSampler`` repeats to even out ranks are counted twice, and it rebuilds the ground
truth from the (transformed, crowd-less) targets. This metric keeps image ids, gathers every
rank's detections, keeps one copy per image (as DETR's evaluator does), and scores them with
COCOeval against the ORIGINAL annotation file, so areas and crowd regions are COCO's own.
"""
from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torchmetrics import Metric
from torchmetrics.utilities import dim_zero_cat
from torchvision.ops import box_convert

from visiontf.core.distributed import get_rank as _rank
from visiontf.evaluation.coco import METRIC_NAMES, CocoEvalError, CocoStats, evaluate_coco
from visiontf.evaluation.duplicates import duplicate_stats
from visiontf.evaluation.readouts.per_class import per_class_rows
from visiontf.evaluation.readouts.readouts import DetectionReport, detection_readouts

__all__ = ["METRIC_NAMES", "CocoMetric"]

log = logging.getLogger(__name__)

# Sample keys are rank * _RANK_STRIDE + a per-rank counter: unique across ranks after gathering.
_RANK_STRIDE = 1 << 40


def _cat(state: list[torch.Tensor] | torch.Tensor) -> torch.Tensor | None:
    """A list state as one tensor (after a DDP sync it may already be one); None when empty."""
    if isinstance(state, list) and not state:
        return None
    return dim_zero_cat(state)


class CocoMetric(Metric):
    """COCO mAP/mAR (the 12 COCOeval stats) of postprocessed detections.

    Args:
        ann_file: the COCO annotation file the images come from (ground truth, areas, crowd).
        label_to_cat_id: class index -> COCO category id (a mapping, or a list indexed by label).
        backend: ``auto`` | ``pycocotools`` | ``faster_coco_eval`` (see :func:`evaluate_coco`).
        num_classes: the model's class count when it predicts classes that are no category: the
            ``N/A`` gaps of a head indexed by category id (91 outputs for COCO's ids 1..90). Their
            detections are dropped and counted, which is what COCOeval does with them (it scores only
            the file's categories). Without it, a label with no category id is an error (a model of
            another class count than the data).

    ``update(preds, image_ids)``: ``preds`` is one dict per image with ``boxes`` (n, 4) absolute
    ``xyxy`` in ORIGINAL image pixels, ``scores`` (n,), ``labels`` (n,) contiguous; ``image_ids``
    the matching COCO image ids. Only the images seen are evaluated (COCOeval ``imgIds``).
    ``compute()`` returns float tensors named as :data:`METRIC_NAMES`; it also sets ``last_table``
    (COCO's printed summary), ``last_duplicates`` (duplicate pairs per confident detection and
    their counts, :func:`~visiontf.evaluation.duplicates.duplicate_stats`: whether the model needs NMS)
    and ``last_per_class`` (AP, AP50, AP75, AR@100 and instance count per category, slices of COCOeval's
    own arrays: :func:`~visiontf.evaluation.readouts.per_class.per_class_rows`); :meth:`readouts` adds the
    confusion matrix and TIDE's breakdown of the same evaluation.
    """

    is_differentiable = False
    higher_is_better = True
    full_state_update = False

    def __init__(
        self,
        ann_file: str | Path,
        label_to_cat_id: Mapping[int, int] | Sequence[int],
        backend: str = "auto",
        num_classes: int | None = None,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        self.ann_file = Path(ann_file)
        if not self.ann_file.is_file():
            raise FileNotFoundError(f"{self.ann_file}: annotation file for CocoMetric not found")
        if isinstance(label_to_cat_id, Mapping):
            # Keys may arrive as strings after a round trip through YAML/JSON hyperparameters.
            self.label_to_cat_id = {int(k): int(v) for k, v in label_to_cat_id.items()}
        else:
            self.label_to_cat_id = {i: int(c) for i, c in enumerate(label_to_cat_id)}
        self.backend = backend
        self.num_classes = num_classes
        #: detections of a class with no category (``num_classes`` given), dropped at the last compute()
        self.last_unmapped = 0
        self._counter = 0
        self.last_table: str | None = None
        self.last_duplicates: dict[str, float] | None = None
        self.last_per_class: list[dict[str, Any]] | None = None
        # the last compute()'s stats, results and images, for readouts() (kept until the next compute)
        self._last_eval: tuple[CocoStats, list[dict], list[int]] | None = None
        self._boxes_gt: dict | None = None
        for name in ("det_boxes", "det_scores", "det_labels", "det_keys", "img_ids", "img_keys"):
            self.add_state(name, default=[], dist_reduce_fx="cat")

    def update(self, preds: Sequence[Mapping[str, torch.Tensor]], image_ids: Sequence[int] | torch.Tensor) -> None:
        image_ids = torch.as_tensor(image_ids, dtype=torch.int64).reshape(-1).tolist()
        if len(preds) != len(image_ids):
            raise ValueError(f"CocoMetric.update: {len(preds)} predictions but {len(image_ids)} image ids")
        base = _rank() * _RANK_STRIDE
        for pred, image_id in zip(preds, image_ids):
            key = base + self._counter
            self._counter += 1
            boxes = torch.as_tensor(pred["boxes"], device=self.device).reshape(-1, 4).float()
            n = boxes.shape[0]
            self.det_boxes.append(boxes)
            self.det_scores.append(torch.as_tensor(pred["scores"], device=self.device).reshape(-1).float())
            self.det_labels.append(torch.as_tensor(pred["labels"], device=self.device).reshape(-1).long())
            self.det_keys.append(torch.full((n,), key, dtype=torch.int64, device=self.device))
            self.img_ids.append(torch.tensor([image_id], dtype=torch.int64, device=self.device))
            self.img_keys.append(torch.tensor([key], dtype=torch.int64, device=self.device))

    def results(self) -> tuple[list[dict], list[int]]:
        """De-duplicated COCO results (one copy per image id) and the evaluated image ids."""
        img_ids_t = _cat(self.img_ids)
        if img_ids_t is None or img_ids_t.numel() == 0:
            return [], []
        img_ids = img_ids_t.cpu().numpy()
        img_keys = _cat(self.img_keys).cpu().numpy()
        # For each image id keep the sample with the smallest key (one whole copy of its detections).
        order = np.lexsort((img_keys, img_ids))
        first = np.ones(len(order), dtype=bool)
        first[1:] = img_ids[order][1:] != img_ids[order][:-1]
        kept_keys = img_keys[order][first]
        key_to_image = dict(zip(kept_keys.tolist(), img_ids[order][first].tolist()))
        det_keys_t = _cat(self.det_keys)
        if det_keys_t is None or det_keys_t.numel() == 0:
            return [], sorted(key_to_image.values())
        det_keys = det_keys_t.cpu().numpy()
        keep = np.isin(det_keys, kept_keys)
        boxes = box_convert(_cat(self.det_boxes).cpu().double(), "xyxy", "xywh").numpy()[keep]
        scores = _cat(self.det_scores).cpu().double().numpy()[keep]
        labels = _cat(self.det_labels).cpu().numpy()[keep]
        unknown = sorted(set(np.unique(labels).tolist()) - set(self.label_to_cat_id))
        self.last_unmapped = 0
        if unknown and self.num_classes is not None and 0 <= unknown[0] and unknown[-1] < self.num_classes:
            mapped = np.isin(labels, list(self.label_to_cat_id))
            self.last_unmapped = int((~mapped).sum())
            log.info("CocoMetric: %d detection(s) of class indices with no category (e.g. %s) not scored, as COCOeval "
                     "scores only the categories of %s", self.last_unmapped, unknown[:5], self.ann_file)
            keep[np.flatnonzero(keep)[~mapped]] = False
            boxes, scores, labels = boxes[mapped], scores[mapped], labels[mapped]
            unknown = []
        if unknown:
            raise CocoEvalError(
                f"CocoMetric: predicted label(s) {unknown[:5]} have no category id in label_to_cat_id "
                f"(labels 0..{len(self.label_to_cat_id) - 1}); check the model's num_classes against {self.ann_file}"
            )
        cat_ids = np.array([self.label_to_cat_id[int(l)] for l in labels.tolist()], dtype=np.int64)
        image_of_det = [key_to_image[k] for k in det_keys[keep].tolist()]
        # a model's non-finite outputs (a diverging run) are no detections: dropped and counted, since
        # evaluate_coco refuses them (they would score silently wrong) and validation should not stop
        finite = np.isfinite(boxes).all(axis=1) & np.isfinite(scores) & (boxes[:, 2] >= 0) & (boxes[:, 3] >= 0)
        if not finite.all():
            log.warning("CocoMetric: dropped %d of %d detections with non-finite scores or boxes (the model's outputs "
                        "are not finite; check the training loss)", int((~finite).sum()), len(finite))
            boxes, scores, cat_ids = boxes[finite], scores[finite], cat_ids[finite]
            image_of_det = [i for i, ok in zip(image_of_det, finite.tolist()) if ok]
        results = [
            {"image_id": i, "category_id": c, "bbox": b, "score": s}
            for i, c, b, s in zip(image_of_det, cat_ids.tolist(), boxes.tolist(), scores.tolist())
        ]
        return results, sorted(key_to_image.values())

    def compute(self) -> dict[str, torch.Tensor]:
        self.last_duplicates = self.last_per_class = self._last_eval = None
        results, img_ids = self.results()
        if not img_ids:
            return {name: torch.tensor(-1.0) for name in METRIC_NAMES}
        stats = evaluate_coco(self.ann_file, results, backend=self.backend, img_ids=img_ids)
        self.last_table = stats.table  # COCO's printed 12-line summary, for reports
        self.last_duplicates = duplicate_stats(results)
        self._last_eval = (stats, results, img_ids)
        self.last_per_class = per_class_rows(stats.arrays, self.boxes_gt(), img_ids)
        return {name: torch.tensor(value, dtype=torch.float32) for name, value in zip(METRIC_NAMES, stats.values())}

    def boxes_gt(self) -> dict:
        """The annotation file without what box readouts never read (segmentations, image metadata),
        read once: categories, image ids and each annotation's image, category, box and crowd flag."""
        if self._boxes_gt is None:
            data = json.loads(self.ann_file.read_text(encoding="utf-8"))
            keep = ("id", "image_id", "category_id", "bbox", "iscrowd", "area")
            self._boxes_gt = {"images": [{"id": im["id"]} for im in data["images"]],
                              "annotations": [{k: a[k] for k in keep if k in a} for a in data["annotations"]],
                              "categories": data["categories"]}
        return self._boxes_gt

    def readouts(self, full: bool = True, score_threshold: float = 0.5) -> DetectionReport | None:
        """The last compute()'s per-class numbers and, with ``full``, its confusion matrix (at
        ``score_threshold``, IoU 0.5) and TIDE's breakdown; None before any evaluation."""
        if self._last_eval is None:
            return None
        stats, results, img_ids = self._last_eval
        return detection_readouts(self.boxes_gt(), results, stats.arrays, img_ids, full=full,
                                  score_threshold=score_threshold)

    def last_results(self) -> list[dict]:
        """The COCO results the last compute() scored (one copy per image, every rank's)."""
        return [] if self._last_eval is None else self._last_eval[1]

