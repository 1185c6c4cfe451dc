"""The set loss of a detector, chosen by its class-head convention (one table, no family if-chains).

``SET_LOSS_BY_CLASS_HEAD[model.class_head]`` gives the criterion's and the matcher's class-term
settings: DETR's softmax over K + 1 logits, or the focal loss and focal matching cost of the
sigmoid families (Deformable DETR, DINO). Extra settings (IoU-aware losses, weights) come on top
through ``criterion_kwargs`` / ``matcher_kwargs``.
"""
from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Tuple

from torch import nn

from visiontf.detection.criterion import SetCriterion
from visiontf.detection.matcher import HungarianMatcher

#: class head -> (SetCriterion kwargs, HungarianMatcher kwargs)
SET_LOSS_BY_CLASS_HEAD: Dict[str, Tuple[Dict[str, Any], Dict[str, Any]]] = {
    "softmax": ({"class_loss": "ce"}, {"class_cost": "softmax"}),
    "sigmoid": ({"class_loss": "focal"}, {"class_cost": "focal"}),
}


def build_set_criterion(
    model: nn.Module,
    num_classes: int,
    weight_dict: Optional[Mapping[str, float]] = None,
    matcher_kwargs: Optional[Mapping[str, Any]] = None,
    criterion_kwargs: Optional[Mapping[str, Any]] = None,
) -> SetCriterion:
    """The :class:`SetCriterion` (with its :class:`HungarianMatcher`) for ``model``'s class head."""
    head = getattr(model, "class_head", "softmax")
    if head not in SET_LOSS_BY_CLASS_HEAD:
        raise ValueError(
            f"{type(model).__name__}.class_head = {head!r}: no set loss for it (known: {sorted(SET_LOSS_BY_CLASS_HEAD)}); "
            "add an entry to SET_LOSS_BY_CLASS_HEAD"
        )
    crit_defaults, match_defaults = SET_LOSS_BY_CLASS_HEAD[head]
    matcher = HungarianMatcher(**{**match_defaults, **(matcher_kwargs or {})})
    return SetCriterion(num_classes, matcher, weight_dict=weight_dict, **{**crit_defaults, **(criterion_kwargs or {})})


__all__ = ["SET_LOSS_BY_CLASS_HEAD", "build_set_criterion"]
