"""The set loss of a detector, chosen by its class-head convention (``model.class_head``).

DETR (``"softmax"``: K + 1 logits, the last "no object") and Deformable DETR and its successors
(``"sigmoid"``: K logits, focal loss) match and supervise their predictions differently. Their
published defaults are data in :data:`SET_LOSS_BY_CLASS_HEAD`; :func:`build_criterion` builds the
matcher and criterion of a model from its entry with any overrides on top, so a task never compares
family names and a new family adds one entry (as it adds one to
:data:`~visiontf.set_prediction.postprocess.POSTPROCESS_BY_CLASS_HEAD`).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from visiontf.models.set_loss_options import FineGrainedLossOptions, OwnSetLoss
from visiontf.set_prediction.criterion import SUPPORTED_LOSSES, SetCriterion
from visiontf.set_prediction.fine_grained import FineGrainedCriterion
from visiontf.set_prediction.mask_losses import MASK_LOSS_WEIGHTS
from visiontf.set_prediction.matcher import HungarianMatcher


@dataclass(frozen=True)
class SetLossDefaults:
    """One class-head convention's matcher and criterion settings.

    Attributes:
        matcher: :class:`HungarianMatcher` keyword arguments.
        criterion: :class:`SetCriterion` keyword arguments other than ``num_classes``, ``matcher``
            and ``weight_dict``.
        weight_dict: the weight of each loss term in the total (aux ``_i``, ``_enc`` and other
            suffixed terms share their base term's weight unless named).
        criterion_class: :class:`SetCriterion`, or the criterion of a family with more terms
            (:class:`~visiontf.set_prediction.fine_grained.FineGrainedCriterion`: D-FINE's and DEIM's).
    """

    matcher: Mapping[str, Any]
    criterion: Mapping[str, Any] = field(default_factory=dict)
    weight_dict: Mapping[str, float] = field(default_factory=dict)
    criterion_class: type[SetCriterion] = SetCriterion


#: defaults by ``model.class_head``: DETR's (facebookresearch/detr ``main.py``) and Deformable DETR's
#: (fundamentalvision/Deformable-DETR ``main.py``: set_cost_class 2, cls_loss_coef 2, focal_alpha 0.25)
SET_LOSS_BY_CLASS_HEAD: dict[str, SetLossDefaults] = {
    "softmax": SetLossDefaults(
        matcher={"class_cost": "softmax", "cost_class": 1.0, "cost_bbox": 5.0, "cost_giou": 2.0},
        criterion={"class_loss": "ce", "eos_coef": 0.1},
        weight_dict={"loss_ce": 1.0, "loss_bbox": 5.0, "loss_giou": 2.0},
    ),
    "sigmoid": SetLossDefaults(
        matcher={"class_cost": "focal", "cost_class": 2.0, "cost_bbox": 5.0, "cost_giou": 2.0},
        criterion={"class_loss": "focal", "focal_alpha": 0.25},
        weight_dict={"loss_ce": 2.0, "loss_bbox": 5.0, "loss_giou": 2.0},
    ),
}


def set_loss_defaults(model: nn.Module) -> SetLossDefaults:
    """The entry of ``model.class_head`` (:class:`~visiontf.models.contract.Detector` declares DETR's ``"softmax"``),
    or the family's own settings where the model has them (:class:`~visiontf.models.set_loss_options.OwnSetLoss`:
    RT-DETR's varifocal loss)."""
    if isinstance(model, OwnSetLoss):
        options = model.set_loss_options()
        # a box head of edge distributions (D-FINE, DEIM) adds its terms to the set loss
        criterion_class = FineGrainedCriterion if isinstance(options, FineGrainedLossOptions) else SetCriterion
        return SetLossDefaults(matcher=options.matcher_kwargs(), criterion=options.criterion_kwargs(), weight_dict=options.weight_dict(),
                               criterion_class=criterion_class)
    head = model.class_head
    if head not in SET_LOSS_BY_CLASS_HEAD:
        raise ValueError(
            f"{type(model).__name__}.class_head = {head!r}: no set-loss defaults for it "
            f"(known: {sorted(SET_LOSS_BY_CLASS_HEAD)}); add an entry to SET_LOSS_BY_CLASS_HEAD"
        )
    return SET_LOSS_BY_CLASS_HEAD[head]


def build_criterion(
    model: nn.Module,
    num_classes: int,
    matcher_kwargs: Mapping[str, Any] | None = None,
    criterion_kwargs: Mapping[str, Any] | None = None,
) -> SetCriterion:
    """The :class:`SetCriterion` (with its :class:`HungarianMatcher`) for ``model``'s class head.

    Args:
        model: a detector with a ``class_head`` attribute; one with a mask head (``mask_options``) also gets
            DETR's mask losses (``loss_mask`` focal and ``loss_dice``, weights 1 and 1 as the original).
        num_classes: object classes K (without "no object").
        matcher_kwargs: over the family's matcher settings (``cost_class``, ``cost_bbox``, ...).
        criterion_kwargs: over the family's criterion settings, passed to :class:`SetCriterion`
            (any keyword it takes, including options added later); a ``weight_dict`` here is merged
            into the family's weights term by term rather than replacing them.
    """
    defaults = set_loss_defaults(model)
    masks = model.mask_options is not None
    criterion = {**defaults.criterion, **({"losses": SUPPORTED_LOSSES + ("masks",)} if masks else {}), **(criterion_kwargs or {})}
    weights = {**defaults.weight_dict, **(MASK_LOSS_WEIGHTS if masks else {})}
    criterion["weight_dict"] = {**weights, **(criterion.get("weight_dict") or {})}
    matcher = HungarianMatcher(**{**defaults.matcher, **(matcher_kwargs or {})})
    return defaults.criterion_class(num_classes, matcher, **criterion)
