"""DETR's mask losses (facebookresearch/detr ``SetCriterion.loss_masks``): sigmoid focal loss and dice loss
between each matched query's mask logits and its target's mask.

Every target mask of the batch is zero-padded to the largest target (h, w) of the batch (the
original's ``NestedTensor``; padded pixels count as background), the predictions (H/4 of the padded
images) are upsampled to that size (bilinear), and both losses are divided by the number of boxes
(the criterion's normaliser). Only the final decoder layer predicts masks.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor
from torchvision.ops import sigmoid_focal_loss

from visiontf.models.matched_masks import MASK_LOGITS_OF
from visiontf.set_prediction.matcher import Indices

__all__ = ["MASK_LOSS_WEIGHTS", "dice_loss", "loss_masks", "mask_focal_loss"]

#: the original's defaults (``main.py``: mask_loss_coef 1, dice_loss_coef 1)
MASK_LOSS_WEIGHTS: dict[str, float] = {"loss_mask": 1.0, "loss_dice": 1.0}


def dice_loss(inputs: Tensor, targets: Tensor, num_boxes: float) -> Tensor:
    """(M, P) logits and (M, P) {0, 1} targets: ``sum over masks of 1 - (2 |p t| + 1) / (|p| + |t| + 1)``, / num_boxes."""
    prob = inputs.sigmoid().flatten(1)
    numerator = 2 * (prob * targets).sum(1)
    denominator = prob.sum(-1) + targets.sum(-1)
    return (1 - (numerator + 1) / (denominator + 1)).sum() / num_boxes


def mask_focal_loss(inputs: Tensor, targets: Tensor, num_boxes: float, alpha: float = 0.25, gamma: float = 2.0) -> Tensor:
    """torchvision's sigmoid focal loss per pixel, averaged over each mask's pixels, summed, / num_boxes."""
    return sigmoid_focal_loss(inputs, targets, alpha=alpha, gamma=gamma, reduction="none").mean(1).sum() / num_boxes


def _target_masks(targets: Sequence[Mapping[str, Tensor]], indices: Indices, device: torch.device) -> Tensor:
    """The matched targets' masks in matching order, zero-padded to the batch's largest target (h, w)."""
    missing = [i for i, t in enumerate(targets) if "masks" not in t]
    if missing:
        raise ValueError(
            f"the model predicts masks but target(s) {missing[:5]} have no 'masks': load the data with its masks "
            "(CocoDataModule(masks=True), data.init_args.masks: true, or the panoptic data module)"
        )
    H = max(int(t["masks"].shape[-2]) for t in targets)
    W = max(int(t["masks"].shape[-1]) for t in targets)
    parts = []
    for t, (_, j) in zip(targets, indices):
        m = t["masks"][j.to(t["masks"].device)]
        parts.append(F.pad(m.to(device, torch.float32), (0, W - m.shape[-1], 0, H - m.shape[-2])))
    return torch.cat(parts) if parts else torch.zeros((0, H, W), device=device)


def loss_masks(outputs: Mapping[str, Tensor], targets: Sequence[Mapping[str, Tensor]], indices: Indices,
               num_boxes: float) -> dict[str, Tensor]:
    """``loss_mask`` (focal) and ``loss_dice`` of the matched queries' ``pred_masks`` (B, Q, h, w), or of
    the masks a training forward's ``mask_logits_of`` makes for them
    (:class:`~visiontf.models.matched_masks.MatchedMaskLogits`: the same values).

    Targets hold ``masks`` (n_i, h_i, w_i) in {0, 1} at their image's size (before padding)."""
    batch = torch.cat([torch.full_like(src, i) for i, (src, _) in enumerate(indices)])
    queries = torch.cat([src for src, _ in indices])
    if "pred_masks" in outputs:
        pred = outputs["pred_masks"]
        src = pred[batch.to(pred.device), queries.to(pred.device)]
    else:
        src = outputs[MASK_LOGITS_OF](batch, queries)
    target = _target_masks(targets, indices, src.device)
    src = src.float()
    src = F.interpolate(src[:, None], size=target.shape[-2:], mode="bilinear", align_corners=False)[:, 0].flatten(1)
    target = target.flatten(1)
    return {"loss_mask": mask_focal_loss(src, target, num_boxes), "loss_dice": dice_loss(src, target, num_boxes)}
