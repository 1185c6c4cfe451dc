"""Hungarian matching between DETR's predictions and the ground-truth boxes of each image.

The cost is the one of the original DETR (facebookresearch/detr, ``models/matcher.py``):
``cost_bbox * L1 - cost_class * softmax_prob[target class] - cost_giou * GIoU``, solved per image
with :func:`scipy.optimize.linear_sum_assignment`. With ``class_cost="focal"`` (Deformable DETR and
its successors: sigmoid logits, no "no object" class) the class term is the focal cost
``alpha (1-p)^gamma (-log p) - (1-alpha) p^gamma (-log(1-p))`` at the target class.

Unlike the original, which builds one ``(B*Q) x sum(N)`` matrix for the whole batch and then
throws away every off-diagonal block, only the ``Q x N_i`` block of each image is computed. The
blocks are laid out target-major as one ``(sum(N), Q)`` tensor (row ``t`` holds the cost of target
``t`` against every query of its own image), so the whole batch is a handful of vectorised kernels
on the model's device and a single device-to-host copy.
"""
from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment
from torch import Tensor, nn
from torchvision.ops import box_convert, generalized_box_iou

logger = logging.getLogger(__name__)

Indices = list[tuple[Tensor, Tensor]]

# vmap turns torchvision's pairwise GIoU into a batched one without writing our own box maths.
_batched_giou = torch.vmap(generalized_box_iou)


def _check_outputs(outputs: dict[str, Tensor], batch_size: int) -> tuple[Tensor, Tensor]:
    if "pred_logits" not in outputs or "pred_boxes" not in outputs:
        raise KeyError(
            f"outputs must contain 'pred_logits' and 'pred_boxes', got keys {sorted(outputs)}"
        )
    logits, boxes = outputs["pred_logits"], outputs["pred_boxes"]
    if logits.dim() != 3 or boxes.dim() != 3 or boxes.shape[-1] != 4:
        raise ValueError(
            "expected pred_logits (B, Q, K+1) and pred_boxes (B, Q, 4), got "
            f"{tuple(logits.shape)} and {tuple(boxes.shape)}"
        )
    if logits.shape[:2] != boxes.shape[:2]:
        raise ValueError(
            f"pred_logits {tuple(logits.shape)} and pred_boxes {tuple(boxes.shape)} disagree on (B, Q)"
        )
    if logits.shape[0] != batch_size:
        raise ValueError(
            f"got {batch_size} target dicts for a batch of {logits.shape[0]} predictions; "
            "pass exactly one target dict per image"
        )
    return logits, boxes


def _check_targets(targets: Sequence[dict[str, Tensor]]) -> list[int]:
    sizes = []
    for i, t in enumerate(targets):
        if "labels" not in t or "boxes" not in t:
            raise KeyError(f"targets[{i}] must contain 'labels' and 'boxes', got keys {sorted(t)}")
        n = len(t["labels"])
        if t["boxes"].shape != (n, 4) and not (n == 0 and t["boxes"].numel() == 0):
            raise ValueError(
                f"targets[{i}]: 'boxes' must have shape ({n}, 4) to match its {n} labels, "
                f"got {tuple(t['boxes'].shape)}"
            )
        sizes.append(n)
    return sizes


CLASS_COSTS = ("softmax", "focal")


def focal_class_cost(logits: Tensor, alpha: float = 0.25, gamma: float = 2.0) -> Tensor:
    """Focal matching cost of every class, float32, same shape as ``logits`` (Deformable DETR's matcher).

    ``alpha (1-p)^gamma (-log(p + 1e-8)) - (1-alpha) p^gamma (-log(1 - p + 1e-8))`` with p the sigmoid.
    """
    prob = logits.float().sigmoid()
    neg = (1 - alpha) * (prob**gamma) * (-(1 - prob + 1e-8).log())
    pos = alpha * ((1 - prob) ** gamma) * (-(prob + 1e-8).log())
    return pos - neg


class HungarianMatcher(nn.Module):
    """One-to-one assignment of queries to ground-truth boxes, per image.

    Args:
        cost_class: weight of the class cost (Deformable DETR uses 2).
        cost_bbox: weight of the L1 distance between normalised cxcywh boxes.
        cost_giou: weight of ``-GIoU`` between the boxes in xyxy.
        class_cost: ``"softmax"`` (DETR: ``-softmax_prob[target class]`` over K + 1 logits, the
            last meaning "no object") or ``"focal"`` (sigmoid logits over K classes, see
            :func:`focal_class_cost`).
        focal_alpha, focal_gamma: of the focal cost.
    """

    def __init__(
        self,
        cost_class: float = 1.0,
        cost_bbox: float = 5.0,
        cost_giou: float = 2.0,
        class_cost: str = "softmax",
        focal_alpha: float = 0.25,
        focal_gamma: float = 2.0,
    ):
        super().__init__()
        if cost_class == 0 and cost_bbox == 0 and cost_giou == 0:
            raise ValueError("HungarianMatcher: cost_class, cost_bbox and cost_giou cannot all be 0")
        if class_cost not in CLASS_COSTS:
            raise ValueError(f"HungarianMatcher: class_cost must be one of {CLASS_COSTS}, got {class_cost!r}")
        self.cost_class = cost_class
        self.cost_bbox = cost_bbox
        self.cost_giou = cost_giou
        self.class_cost = class_cost
        self.focal_alpha = focal_alpha
        self.focal_gamma = focal_gamma

    @property
    def num_extra_logits(self) -> int:
        """Logits beyond the K classes: 1 ("no object") for softmax, 0 for focal."""
        return 1 if self.class_cost == "softmax" else 0

    def extra_repr(self) -> str:
        focal = f", focal_alpha={self.focal_alpha}, focal_gamma={self.focal_gamma}" if self.class_cost == "focal" else ""
        return f"cost_class={self.cost_class}, cost_bbox={self.cost_bbox}, cost_giou={self.cost_giou}, class_cost={self.class_cost!r}{focal}"

    @torch.no_grad()
    def cost_blocks(
        self, outputs: dict[str, Tensor], targets: Sequence[dict[str, Tensor]]
    ) -> tuple[Tensor, list[int], Tensor]:
        """Cost of every target against every query of its own image, on the model's device.

        Returns:
            ``(cost, sizes, flags)``: ``cost`` is float32 ``(sum(N), Q)``, rows grouped by image
            in batch order; ``sizes`` the number of targets per image; ``flags`` a float32 (2,)
            tensor, ``[predictions contain NaN/inf, a label is outside [0, K)]``, kept on device so
            the caller fetches it with the costs in one transfer instead of syncing per check.
        """
        sizes = _check_targets(targets)
        logits, boxes = _check_outputs(outputs, len(targets))
        device = logits.device
        batch, queries = logits.shape[:2]

        # One softmax (or focal cost) for the whole batch; float32 so bf16 models match like float32 ones.
        logits = logits.float()
        boxes = boxes.float()
        num_classes = logits.shape[-1] - self.num_extra_logits
        nonfinite = ~(torch.isfinite(logits).all() & torch.isfinite(boxes).all())
        if sum(sizes) == 0:
            flags = torch.stack([nonfinite, torch.zeros_like(nonfinite)]).float()
            return logits.new_zeros((0, queries)), sizes, flags
        if self.class_cost == "softmax":
            class_cost = -logits.softmax(-1)
        else:
            class_cost = focal_class_cost(logits, self.focal_alpha, self.focal_gamma)

        tgt_ids = torch.cat([t["labels"] for t in targets]).to(device=device, dtype=torch.long)
        bad_label = ((tgt_ids < 0) | (tgt_ids >= num_classes)).any()
        flags = torch.stack([nonfinite, bad_label]).float()
        # Clamped only so a bad label cannot trigger a device-side assert before we can raise.
        tgt_ids = tgt_ids.clamp(0, logits.shape[-1] - 1)
        tgt_boxes = torch.cat([t["boxes"].reshape(-1, 4) for t in targets]).to(
            device=device, dtype=torch.float32
        )
        image_of_target = torch.repeat_interleave(
            torch.arange(batch, device=device), torch.as_tensor(sizes, device=device)
        )

        # (T, Q): class cost of target t's class at every query of target t's image.
        cost_class = class_cost[image_of_target, :, tgt_ids]
        pred = boxes[image_of_target]  # (T, Q, 4)
        tgt = tgt_boxes[:, None, :]  # (T, 1, 4)
        cost_bbox = torch.cdist(pred, tgt, p=1)[..., 0]
        giou = _batched_giou(
            box_convert(pred, "cxcywh", "xyxy"), box_convert(tgt, "cxcywh", "xyxy")
        )[..., 0]
        # 0/0 only happens when a predicted and a target box both have zero area (no union);
        # treat such a pair as non-overlapping instead of letting NaN reach the solver.
        giou = torch.nan_to_num(giou, nan=0.0)
        cost_giou = -giou

        # Same term order as the original so the float32 costs round identically.
        cost = self.cost_bbox * cost_bbox + self.cost_class * cost_class + self.cost_giou * cost_giou
        return cost, sizes, flags

    @torch.no_grad()
    def forward(self, outputs: dict[str, Tensor], targets: Sequence[dict[str, Tensor]]) -> Indices:
        """Match predictions to targets.

        Args:
            outputs: ``pred_logits`` (B, Q, K+1), or (B, Q, K) for the focal cost, and
                ``pred_boxes`` (B, Q, 4) normalised cxcywh.
            targets: one dict per image with ``labels`` int64 (N,) and ``boxes`` (N, 4) normalised
                cxcywh; N may be 0.

        Returns:
            Per image, ``(query_idx, target_idx)`` int64 CPU tensors of length ``min(Q, N)``,
            sorted by query index. Images without targets get two empty tensors.

        Raises:
            ValueError: if the predictions or target boxes contain NaN/inf, or a label is outside
                ``[0, K)``.
        """
        cost, sizes, flags = self.cost_blocks(outputs, targets)
        queries = outputs["pred_logits"].shape[1]
        # A single device-to-host copy for the whole batch: the flags ride along with the costs.
        packed = torch.cat([cost.flatten(), flags]).cpu().numpy()
        if packed[-2] != 0:
            raise ValueError(
                "HungarianMatcher: the predictions (pred_logits / pred_boxes) contain non-finite "
                "values (NaN or inf); the model has diverged - lower the learning rate, check the "
                "gradient clipping or look for NaN in the inputs"
            )
        if packed[-1] != 0:
            num_classes = outputs["pred_logits"].shape[-1] - self.num_extra_logits
            bad = [
                i
                for i, t in enumerate(targets)
                if len(t["labels"]) and (t["labels"].min() < 0 or t["labels"].max() >= num_classes)
            ]
            layout = f"{num_classes} classes + 'no object'" if self.num_extra_logits else f"{num_classes} sigmoid classes"
            raise ValueError(
                f"HungarianMatcher: targets of images {bad} have labels outside [0, {num_classes}) "
                f"(pred_logits has {layout}); build the model with "
                "num_classes = max label + 1"
            )
        cost_np = packed[:-2].reshape(-1, queries)
        if not np.isfinite(cost_np).all():
            bad = [i for i, t in enumerate(targets) if not torch.isfinite(t["boxes"]).all()]
            raise ValueError(
                f"HungarianMatcher: target boxes of images {bad} contain non-finite values (NaN or "
                "inf); fix or drop those annotations in the dataset"
            )

        empty = torch.empty(0, dtype=torch.int64)
        indices: Indices = []
        start = 0
        for n in sizes:
            if n == 0:
                indices.append((empty, empty.clone()))
                continue
            block = cost_np[start : start + n].T  # (Q, N_i), the orientation the original solves
            start += n
            rows, cols = linear_sum_assignment(block)
            indices.append(
                (torch.as_tensor(rows, dtype=torch.int64), torch.as_tensor(cols, dtype=torch.int64))
            )
        return indices
