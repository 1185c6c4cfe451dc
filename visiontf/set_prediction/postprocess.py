"""Turn raw detector outputs into per-image detections: DETR's softmax ``PostProcess`` and Deformable DETR's sigmoid top-k.

Both take the same options (:class:`~visiontf.models.postprocess_options.PostprocessOptions`), which a
model carries and :func:`set_postprocess` replaces at evaluation or prediction time.
"""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torchvision.ops import batched_nms, box_convert, nms

from visiontf.models.postprocess_options import PostprocessOptions
from visiontf.nn.indexing import gather_rows

logger = logging.getLogger(__name__)


class _DetectionPostProcess(nn.Module):
    """What both post-processings share: input checks, boxes in absolute xyxy, NMS and the score threshold."""

    def __init__(self, num_top: int | None = None, nms_iou_threshold: float | None = None,
                 nms_class_agnostic: bool = True) -> None:
        super().__init__()
        self.options = PostprocessOptions(num_top, nms_iou_threshold, nms_class_agnostic)

    # read by tests and callers as plain attributes
    num_top = property(lambda self: self.options.num_top)
    nms_iou_threshold = property(lambda self: self.options.nms_iou_threshold)
    nms_class_agnostic = property(lambda self: self.options.nms_class_agnostic)

    @staticmethod
    def _checked_sizes(logits: Tensor, target_sizes: Tensor | Sequence[Sequence[int]], top_k: int | None) -> Tensor:
        sizes = torch.as_tensor(target_sizes, device=logits.device)
        if sizes.dim() != 2 or sizes.shape[1] != 2:
            raise ValueError(f"target_sizes must be (B, 2) as (h, w), got shape {tuple(sizes.shape)}")
        if len(logits) != len(sizes):
            raise ValueError(f"target_sizes has {len(sizes)} rows for a batch of {len(logits)} predictions")
        if top_k is not None and top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {top_k}")
        return sizes

    @staticmethod
    def _absolute_xyxy(boxes: Tensor, sizes: Tensor) -> Tensor:
        """Normalised cxcywh (B, Q, 4) -> xyxy in the pixels of each image's ``(h, w)``, float32."""
        img_h, img_w = sizes.float().unbind(1)
        return box_convert(boxes.float(), "cxcywh", "xyxy") * torch.stack([img_w, img_h, img_w, img_h], dim=1)[:, None, :]

    def _suppress(self, s: Tensor, l: Tensor, b: Tensor, score_threshold: float | None, q: Tensor) -> dict[str, Tensor]:
        if self.options.nms_iou_threshold is not None:
            # both return the kept indices sorted by decreasing score
            keep = (nms(b, s, self.options.nms_iou_threshold) if self.options.nms_class_agnostic
                    else batched_nms(b, s, l, self.options.nms_iou_threshold))
            s, l, b, q = s[keep], l[keep], b[keep], q[keep]
        if score_threshold is not None:
            keep = s > score_threshold
            s, l, b, q = s[keep], l[keep], b[keep], q[keep]
        # queries: which query each detection is, to pick its mask (visiontf.set_prediction.mask_postprocess)
        return {"scores": s, "labels": l, "boxes": b, "queries": q}


class PostProcess(_DetectionPostProcess):
    """Scores, labels and absolute xyxy boxes for every query, as the COCO API expects.

    Per query: softmax over the K+1 logits, drop "no object", take the max as score and label.
    Boxes go from normalised cxcywh to xyxy scaled by each image's ``(h, w)``. The options
    (``num_top``, NMS) are off by default, as in the original DETR.
    """

    @torch.no_grad()
    def forward(
        self,
        outputs: Mapping[str, Tensor],
        target_sizes: Tensor | Sequence[Sequence[int]],
        score_threshold: float | None = None,
        top_k: int | None = None,
    ) -> list[dict[str, Tensor]]:
        """Decode a batch.

        Args:
            outputs: ``pred_logits`` (B, Q, K+1) and ``pred_boxes`` (B, Q, 4) normalised cxcywh.
            target_sizes: (B, 2) as ``(h, w)``: the original image size for evaluation, the
                augmented size before padding for visualisation.
            score_threshold: keep only detections with ``score > score_threshold``.
            top_k: keep only the ``top_k`` highest-scoring detections, sorted by score (default: ``num_top``).

        Returns:
            One dict per image with ``scores`` (float32), ``labels`` (int64) and ``boxes`` (float32
            absolute xyxy), sorted by score; with no option and no threshold, all Q queries in query
            order, as the original. ``queries`` (int64) says which query each detection is.
        """
        logits, boxes = outputs["pred_logits"], outputs["pred_boxes"]
        sizes = self._checked_sizes(logits, target_sizes, top_k)
        # float32 so bf16 models produce COCO-ready scores and boxes.
        scores, labels = logits.float().softmax(-1)[..., :-1].max(-1)
        xyxy = self._absolute_xyxy(boxes, sizes)
        top_k = self.options.num_top if top_k is None else top_k
        # sorted by score whenever something is kept or dropped by score; all queries in query order otherwise
        sort = top_k is not None or self.options.nms_iou_threshold is not None or score_threshold is not None
        results = []
        for s, l, b in zip(scores, labels, xyxy):
            q = torch.arange(len(s), device=s.device)
            if sort:
                order = s.argsort(descending=True, stable=True)[:top_k]
                s, l, b, q = s[order], l[order], b[order], q[order]
            results.append(self._suppress(s, l, b, score_threshold, q))
        return results


class DeformablePostProcess(_DetectionPostProcess):
    """Deformable DETR's post-processing (fundamentalvision/Deformable-DETR ``PostProcess``).

    Sigmoid scores of every (query, class) pair; the ``num_top`` best pairs over queries x classes
    (a query may appear with several classes), label = class index, box = the query's box in
    absolute xyxy scaled by each image's ``(h, w)``. Sorted by score.

    DINO's ``PostProcess`` (IDEA-Research/DINO ``models/dino/dino.py``) can also run NMS on those
    pairs (its ``nms_iou_threshold``, off by default): a detector trained for a few epochs still
    puts two queries on one object, and each duplicate above a true positive of another image costs
    precision. DINO's NMS ignores the labels; ``nms_class_agnostic=False`` suppresses only within a
    class, so a box may keep a second label (the pair top-k's hedge) and overlapping objects of
    different classes survive.

    Args:
        num_top: pairs kept per image (the original: 100); clamped to queries x classes.
        nms_iou_threshold: suppress a pair whose box overlaps a higher-scoring kept one by more
            than this IoU, after the top-k; None (the default, as in Deformable DETR and DINO's
            ``-1``) keeps every pair.
        nms_class_agnostic: DINO's NMS over all labels (True) or one NMS per label (False).
    """

    def __init__(self, num_top: int = 100, nms_iou_threshold: float | None = None, nms_class_agnostic: bool = True) -> None:
        if num_top is None or num_top < 1:
            raise ValueError(f"num_top must be >= 1, got {num_top}")
        super().__init__(num_top, nms_iou_threshold, nms_class_agnostic)

    @torch.no_grad()
    def forward(
        self,
        outputs: Mapping[str, Tensor],
        target_sizes: Tensor | Sequence[Sequence[int]],
        score_threshold: float | None = None,
        top_k: int | None = None,
    ) -> list[dict[str, Tensor]]:
        """Decode a batch.

        Args:
            outputs: ``pred_logits`` (B, Q, K) sigmoid logits and ``pred_boxes`` (B, Q, 4)
                normalised cxcywh.
            target_sizes: (B, 2) as ``(h, w)``, as for :class:`PostProcess`.
            score_threshold: keep only detections with ``score > score_threshold``.
            top_k: keep this many pairs instead of ``num_top``.

        Returns:
            One dict per image with ``scores`` (float32), ``labels`` (int64), ``boxes`` (float32
            absolute xyxy) and ``queries`` (the query of each pair), sorted by score. With NMS, the pairs it keeps.
        """
        logits, boxes = outputs["pred_logits"], outputs["pred_boxes"]
        sizes = self._checked_sizes(logits, target_sizes, top_k)
        B, Q, K = logits.shape
        k = min(self.options.num_top if top_k is None else top_k, Q * K)
        prob = logits.float().sigmoid().view(B, Q * K)
        scores, index = torch.topk(prob, k, dim=1)
        query = torch.div(index, K, rounding_mode="floor")
        labels = index % K
        xyxy = gather_rows(self._absolute_xyxy(boxes, sizes), query)
        return [self._suppress(s, l, b, score_threshold, q) for s, l, b, q in zip(scores, labels, xyxy, query)]


#: post-processing by class-head convention (a model's ``class_head`` attribute)
POSTPROCESS_BY_CLASS_HEAD: dict[str, type] = {"softmax": PostProcess, "sigmoid": DeformablePostProcess}


def build_postprocess(model: nn.Module) -> nn.Module:
    """The post-processing that matches ``model``'s class head, with the model's ``postprocess_options``.

    ``"softmax"`` (DETR: K + 1 logits, the last meaning "no object") gives :class:`PostProcess`;
    ``"sigmoid"`` (Deformable DETR and its successors: K sigmoid logits) gives
    :class:`DeformablePostProcess`. A family with another convention adds its entry to
    :data:`POSTPROCESS_BY_CLASS_HEAD`.
    """
    head = model.class_head
    if head not in POSTPROCESS_BY_CLASS_HEAD:
        raise ValueError(
            f"{type(model).__name__}.class_head = {head!r}: no post-processing for it "
            f"(known: {sorted(POSTPROCESS_BY_CLASS_HEAD)}); add an entry to POSTPROCESS_BY_CLASS_HEAD"
        )
    options = {k: v for k, v in dataclasses.asdict(postprocess_options(model)).items() if v is not None}
    return POSTPROCESS_BY_CLASS_HEAD[head](**options)


def postprocess_options(model: nn.Module) -> PostprocessOptions:
    """``model.postprocess_options`` (:class:`~visiontf.models.contract.Detector` declares the defaults: every query, no NMS)."""
    return model.postprocess_options


#: the options :func:`set_postprocess` takes (the fields of ``PostprocessOptions``)
POSTPROCESS_OPTIONS = tuple(f.name for f in dataclasses.fields(PostprocessOptions))


def set_postprocess(model: nn.Module, **overrides: Any) -> PostprocessOptions:
    """Replace some of ``model``'s post-processing options (no weight changes); returns the new options.

    ``None`` leaves an option as it is (the checkpoint's), so command-line defaults change nothing;
    an ``nms_iou_threshold`` of 0 or below (DINO's -1) turns NMS off. Every later
    :func:`build_postprocess` of the model, in the task, the Predictor or an export, uses them.
    """
    unknown = sorted(set(overrides) - set(POSTPROCESS_OPTIONS))
    if unknown:
        raise ValueError(f"unknown post-processing option(s) {unknown}; known: {list(POSTPROCESS_OPTIONS)}")
    changes = {k: v for k, v in overrides.items() if v is not None}
    if changes.get("nms_iou_threshold", 1.0) <= 0:
        changes["nms_iou_threshold"] = None
    current = postprocess_options(model)
    if not changes:
        return current
    options = dataclasses.replace(current, **changes)
    if options != current:
        logger.info("post-processing of %s: %s (was %s)", type(model).__name__, options, current)
    model.postprocess_options = options
    return options
