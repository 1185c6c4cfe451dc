"""What a detector with a mask head adds to :class:`~visiontf.tasks.detection.detection_task.DetectionTask`'s evaluation.

* Instance masks at each image's original size (DETR's ``PostProcessSegm``) for every detection, scored
  as COCO mask AP (``segm``, :class:`~visiontf.tasks.detection.coco_mask_metric.CocoMaskMetric`) on the data
  module's annotation file when the data has masks (``CocoDataModule(masks=True)``, the panoptic one).
* With thing classes (the model's, or the panoptic data module's ``thing_classes``) and a panoptic
  ground truth (``CocoPanopticDataModule``): DETR's panoptic segments, scored as PQ, SQ and RQ
  (:class:`~visiontf.tasks.detection.panoptic_metric.PanopticMetric`).

Logged as ``<stage>/segm_map``, ``<stage>/segm_map_50``, ... and ``<stage>/pq``, ``pq_things``, ...
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any

import torch

from visiontf.data.base import DetectionDataModule
from visiontf.evaluation.coco import METRIC_NAMES
from visiontf.set_prediction.mask_postprocess import add_instance_masks, panoptic_segments

log = logging.getLogger(__name__)

__all__ = ["MaskEvaluation", "panoptic_predictions", "sync_thing_classes"]


def sync_thing_classes(model: Any, dm: Any, hparams: Any) -> None:
    """Give a mask model without thing classes the data module's (recorded in ``model_kwargs``, so that
    checkpoints rebuild it panoptic); refuse two different lists."""
    options = model.mask_options
    things = dm.thing_classes if isinstance(dm, DetectionDataModule) else None
    if options is None or things is None:
        return
    things = tuple(int(c) for c in things)
    if options.thing_classes is None:
        model.mask_options = dataclasses.replace(options, thing_classes=things)
        hparams.model_kwargs = {**(hparams.model_kwargs or {}), "thing_classes": list(things)}
        log.info("thing classes of the data (%d of %d classes) given to the model's panoptic post-processing",
                 len(things), model.num_classes)
    elif tuple(options.thing_classes) != tuple(sorted(things)):
        raise ValueError(f"the model's thing_classes {list(options.thing_classes)[:10]} differ from the data's "
                         f"{list(things)[:10]}; leave model_kwargs.thing_classes out to take the data's")


def panoptic_predictions(model: Any, outputs: dict, processed_sizes: Any, target_sizes: Any) -> list[tuple[Any, list]]:
    """DETR's panoptic segments of each image: ``(ids (H, W) int64 array, segments_info)``, class indices as
    ``category_id`` (:func:`~visiontf.set_prediction.mask_postprocess.panoptic_segments`)."""
    options = model.mask_options
    is_thing = options.is_thing_map(model.num_classes + 1)
    out = []
    for i, (size, target) in enumerate(zip(torch.as_tensor(processed_sizes).tolist(), torch.as_tensor(target_sizes).tolist())):
        out.append(panoptic_segments(outputs["pred_logits"][i].float(), outputs["pred_masks"][i].float(), tuple(size),
                                     tuple(target), is_thing, options.panoptic_threshold, options.min_area, model.class_head))
    return out


class MaskEvaluation:
    """Mask AP and PQ for one task: ``update(stage, outputs, preds, targets)`` after the box metric's,
    ``compute(stage)`` at the end of the epoch (values to log, tables for the report)."""

    def __init__(self, backend: str = "auto") -> None:
        self.backend = backend
        self.metrics: dict[tuple[str, str], Any] = {}

    def _get(self, kind: str, stage: str, model: Any, dm: Any, num_classes: int | None, device: torch.device) -> Any:
        key = (kind, stage)
        if key not in self.metrics:
            metric = None
            detection = isinstance(dm, DetectionDataModule)
            if kind == "segm" and detection and dm.masks:
                from visiontf.tasks.detection.coco_mask_metric import CocoMaskMetric

                metric = CocoMaskMetric(dm.ann_file(stage), dm.label_to_cat_id, backend=self.backend, num_classes=num_classes)
            elif kind == "pq" and model.mask_options.panoptic and detection and dm.panoptic_files(stage):
                from visiontf.tasks.detection.panoptic_metric import PanopticMetric

                metric = PanopticMetric(*dm.panoptic_files(stage), dm.label_to_cat_id)
            self.metrics[key] = None if metric is None else metric.to(device)
        return self.metrics[key]

    def update(self, stage: str, model: Any, dm: Any, outputs: dict, preds: list[dict], targets: list[dict],
               num_classes: int | None) -> None:
        device = outputs["pred_masks"].device
        processed = torch.stack([t["size"] for t in targets])
        orig = torch.stack([t["orig_size"] for t in targets])
        ids = [int(t["image_id"]) for t in targets]
        segm = self._get("segm", stage, model, dm, num_classes, device)
        if segm is not None:
            segm.update(add_instance_masks(preds, outputs, processed, orig, model.mask_options.mask_threshold), ids)
            for p in preds:  # the RLEs are in the metric; full-size masks are not kept
                p.pop("masks", None)
        pq = self._get("pq", stage, model, dm, num_classes, device)
        if pq is not None:
            pq.update(panoptic_predictions(model, outputs, processed, orig), ids)

    def compute(self, stage: str) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """``(values to log, report entries)``; resets the metrics."""
        values: dict[str, torch.Tensor] = {}
        report: dict[str, Any] = {}
        segm = self.metrics.get(("segm", stage))
        if segm is not None:
            stats = segm.compute()
            values.update({f"segm_{k}": stats[k].float() for k in METRIC_NAMES if k in stats})
            if segm.last_table:
                report["segm_table"] = segm.last_table
            segm.reset()
        pq = self.metrics.get(("pq", stage))
        if pq is not None:
            values.update({k: v.float() for k, v in pq.compute().items()})
            if pq.last_table:
                report["pq_table"] = pq.last_table
            pq.reset()
        return values, report
