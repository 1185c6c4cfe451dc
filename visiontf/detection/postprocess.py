"""Turn raw detector outputs into per-image detections: DETR's softmax ``PostProcess`` and Deformable DETR's sigmoid top-k."""
from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor, nn
from torchvision.ops import batched_nms, box_convert, nms

logger = logging.getLogger(__name__)


class PostProcess(nn.Module):
    """Scores, labels and absolute xyxy boxes for every query, as the COCO API expects.

    Per query: softmax over the K+1 logits, drop "no object", take the max as score and label.
    Boxes go from normalised cxcywh to xyxy scaled by each image's ``(h, w)``.
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
            top_k: keep only the ``top_k`` highest-scoring detections, sorted by score.

        Returns:
            One dict per image with ``scores`` (float32), ``labels`` (int64) and ``boxes`` (float32
            absolute xyxy). With neither option, all Q queries in query order, as the original.
        """
        logits, boxes = outputs["pred_logits"], outputs["pred_boxes"]
        sizes = torch.as_tensor(target_sizes, device=logits.device)
        if sizes.dim() != 2 or sizes.shape[1] != 2:
            raise ValueError(f"target_sizes must be (B, 2) as (h, w), got shape {tuple(sizes.shape)}")
        if len(logits) != len(sizes):
            raise ValueError(
                f"target_sizes has {len(sizes)} rows for a batch of {len(logits)} predictions"
            )
        if top_k is not None and top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {top_k}")

        # float32 so bf16 models produce COCO-ready scores and boxes.
        prob = logits.float().softmax(-1)
        scores, labels = prob[..., :-1].max(-1)

        xyxy = box_convert(boxes.float(), "cxcywh", "xyxy")
        img_h, img_w = sizes.float().unbind(1)
        scale = torch.stack([img_w, img_h, img_w, img_h], dim=1)
        xyxy = xyxy * scale[:, None, :]

        results = []
        for s, l, b in zip(scores, labels, xyxy):
            if top_k is not None:
                order = s.argsort(descending=True, stable=True)[:top_k]
                s, l, b = s[order], l[order], b[order]
            if score_threshold is not None:
                keep = s > score_threshold
                s, l, b = s[keep], l[keep], b[keep]
            results.append({"scores": s, "labels": l, "boxes": b})
        return results


class DeformablePostProcess(nn.Module):
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
        super().__init__()
        if num_top < 1:
            raise ValueError(f"num_top must be >= 1, got {num_top}")
        if nms_iou_threshold is not None and not 0.0 < nms_iou_threshold <= 1.0:
            raise ValueError(
                f"nms_iou_threshold must be in (0, 1] or None (no NMS), got {nms_iou_threshold} "
                "(DINO's -1 for 'off' is None here)"
            )
        self.num_top = num_top
        self.nms_iou_threshold = nms_iou_threshold
        self.nms_class_agnostic = nms_class_agnostic

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
            One dict per image with ``scores`` (float32), ``labels`` (int64) and ``boxes`` (float32
            absolute xyxy), sorted by score. With NMS, the pairs it keeps.
        """
        logits, boxes = outputs["pred_logits"], outputs["pred_boxes"]
        sizes = torch.as_tensor(target_sizes, device=logits.device)
        if sizes.dim() != 2 or sizes.shape[1] != 2:
            raise ValueError(f"target_sizes must be (B, 2) as (h, w), got shape {tuple(sizes.shape)}")
        if len(logits) != len(sizes):
            raise ValueError(f"target_sizes has {len(sizes)} rows for a batch of {len(logits)} predictions")
        if top_k is not None and top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {top_k}")
        B, Q, K = logits.shape
        k = min(self.num_top if top_k is None else top_k, Q * K)
        prob = logits.float().sigmoid().view(B, Q * K)
        scores, index = torch.topk(prob, k, dim=1)
        query = torch.div(index, K, rounding_mode="floor")
        labels = index % K
        xyxy = box_convert(boxes.float(), "cxcywh", "xyxy")
        xyxy = torch.gather(xyxy, 1, query.unsqueeze(-1).expand(-1, -1, 4))
        img_h, img_w = sizes.float().unbind(1)
        xyxy = xyxy * torch.stack([img_w, img_h, img_w, img_h], dim=1)[:, None, :]
        results = []
        for s, l, b in zip(scores, labels, xyxy):
            if self.nms_iou_threshold is not None:
                # both return the kept indices sorted by decreasing score
                keep = (nms(b, s, self.nms_iou_threshold) if self.nms_class_agnostic
                        else batched_nms(b, s, l, self.nms_iou_threshold))
                s, l, b = s[keep], l[keep], b[keep]
            if score_threshold is not None:
                keep = s > score_threshold
                s, l, b = s[keep], l[keep], b[keep]
            results.append({"scores": s, "labels": l, "boxes": b})
        return results


#: post-processing by class-head convention (a model's ``class_head`` attribute)
POSTPROCESS_BY_CLASS_HEAD: dict[str, type] = {"softmax": PostProcess, "sigmoid": DeformablePostProcess}


def build_postprocess(model: nn.Module) -> nn.Module:
    """The post-processing that matches ``model``'s class head (its ``class_head`` attribute).

    ``"softmax"`` (DETR: K + 1 logits, the last meaning "no object") gives :class:`PostProcess`;
    ``"sigmoid"`` (Deformable DETR and its successors: K sigmoid logits) gives
    :class:`DeformablePostProcess`. Models without the attribute are taken to be softmax models,
    as every DETR checkpoint is. A family with another convention adds its entry to
    :data:`POSTPROCESS_BY_CLASS_HEAD`. A model's ``postprocess_kwargs`` (e.g. DINO's
    ``{"num_top": 300}``) are passed to the post-processing's constructor.
    """
    head = getattr(model, "class_head", "softmax")
    if head not in POSTPROCESS_BY_CLASS_HEAD:
        raise ValueError(
            f"{type(model).__name__}.class_head = {head!r}: no post-processing for it "
            f"(known: {sorted(POSTPROCESS_BY_CLASS_HEAD)}); add an entry to POSTPROCESS_BY_CLASS_HEAD"
        )
    return POSTPROCESS_BY_CLASS_HEAD[head](**dict(getattr(model, "postprocess_kwargs", None) or {}))
