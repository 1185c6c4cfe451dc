"""A detector's own matcher and set-loss settings: an optional capability, as :class:`~visiontf.models.contract.AttentionRollout` is.

A detector's ``class_head`` gives the family defaults of its convention
(:data:`visiontf.set_prediction.set_loss.SET_LOSS_BY_CLASS_HEAD`: DETR's softmax, Deformable DETR's focal).
A family trained with other published settings on the same logits (RT-DETR: the varifocal loss with
weights 1 / 5 / 2) says so by implementing :class:`OwnSetLoss`, whose typed :class:`SetLossOptions`
replace the class head's defaults in :func:`visiontf.set_prediction.build_criterion`; a task's ``set_loss``
section still goes on top.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

__all__ = ["FineGrainedLossOptions", "OwnSetLoss", "SetLossOptions"]

CLASS_LOSSES = ("focal", "vfl", "ia_bce", "mal")


@dataclass(frozen=True)
class SetLossOptions:
    """The Hungarian matcher's costs and the set loss of a sigmoid-head detector.

    Args:
        class_loss: the class term (``visiontf.set_prediction.SetCriterion``'s ``class_loss``: ``"focal"``,
            ``"vfl"``, ``"ia_bce"``, ``"mal"``).
        cost_class, cost_bbox, cost_giou: the matching costs (focal class cost).
        focal_alpha, focal_gamma: of the focal matching cost (and of the focal / IA-BCE losses; the
            varifocal loss keeps its own alpha 0.75 and takes ``focal_gamma``).
        loss_class, loss_bbox, loss_giou: the weights of the class, L1 and GIoU terms in the total.
        class_gamma: the class loss's gamma where it differs from the matcher's ``focal_gamma`` (DEIM: 1.5 for the
            matchability-aware loss, its matcher's focal cost keeps 2; None: ``focal_gamma``).
    """

    class_loss: str = "focal"
    cost_class: float = 2.0
    cost_bbox: float = 5.0
    cost_giou: float = 2.0
    focal_alpha: float = 0.25
    focal_gamma: float = 2.0
    loss_class: float = 2.0
    loss_bbox: float = 5.0
    loss_giou: float = 2.0
    class_gamma: float | None = None

    def __post_init__(self) -> None:
        if self.class_loss not in CLASS_LOSSES:
            raise ValueError(f"class_loss must be one of {CLASS_LOSSES}, got {self.class_loss!r}")
        costs = (self.cost_class, self.cost_bbox, self.cost_giou)
        if min(costs) < 0 or max(costs) == 0:
            raise ValueError(f"the matching costs (class, L1, GIoU) must be >= 0 and not all 0, got {costs}")
        if min(self.loss_class, self.loss_bbox, self.loss_giou) < 0:
            raise ValueError("loss weights must be >= 0")
        if self.class_gamma is not None and self.class_gamma < 0:
            raise ValueError(f"class_gamma must be >= 0 or None, got {self.class_gamma}")

    def matcher_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``visiontf.set_prediction.HungarianMatcher``."""
        return {"class_cost": "focal", "cost_class": self.cost_class, "cost_bbox": self.cost_bbox, "cost_giou": self.cost_giou,
                "focal_alpha": self.focal_alpha, "focal_gamma": self.focal_gamma}

    def criterion_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``visiontf.set_prediction.SetCriterion`` other than the weights (its ``focal_gamma`` is
        the class loss's: ``class_gamma`` where given)."""
        gamma = self.focal_gamma if self.class_gamma is None else self.class_gamma
        return {"class_loss": self.class_loss, "focal_alpha": self.focal_alpha, "focal_gamma": gamma}

    def weight_dict(self) -> dict[str, float]:
        return {"loss_ce": self.loss_class, "loss_bbox": self.loss_bbox, "loss_giou": self.loss_giou}


@dataclass(frozen=True)
class FineGrainedLossOptions(SetLossOptions):
    """D-FINE's set loss (Peng et al., ICLR 2025) and DEIM's (Huang et al., CVPR 2025): the class and box terms of
    :class:`SetLossOptions` plus the distribution terms of a box head that predicts each edge as a distribution
    (:class:`visiontf.set_prediction.fine_grained.FineGrainedCriterion` computes them).

    Args:
        loss_fgl: weight of the fine-grained localisation loss (the edges' distributions against the target edges,
            split between the two nearest bins), 0.15.
        loss_ddf: weight of the decoupled distillation (GO-LSD: every layer's distributions towards the last layer's),
            1.5.
        ddf_temperature: the distillation's softmax temperature (5).
        union_matching: the box and distribution terms of every layer use the union of all layers' matchings (the
            originals' "GO" indices); False: each layer its own matching.
        reg_max, reg_scale, up: the distribution head's (set by the model from its decoder).
    """

    class_loss: str = "vfl"
    cost_class: float = 2.0
    loss_class: float = 1.0
    loss_fgl: float = 0.15
    loss_ddf: float = 1.5
    ddf_temperature: float = 5.0
    union_matching: bool = True
    reg_max: int = 32
    reg_scale: float = 4.0
    up: float = 0.5

    def __post_init__(self) -> None:
        super().__post_init__()
        if min(self.loss_fgl, self.loss_ddf) < 0 or self.ddf_temperature <= 0:
            raise ValueError("loss_fgl and loss_ddf must be >= 0 and ddf_temperature > 0")

    def criterion_kwargs(self) -> dict[str, Any]:
        return {**super().criterion_kwargs(), "reg_max": self.reg_max, "reg_scale": self.reg_scale, "up": self.up,
                "ddf_temperature": self.ddf_temperature, "union_matching": self.union_matching}

    def weight_dict(self) -> dict[str, float]:
        return {**super().weight_dict(), "loss_fgl": self.loss_fgl, "loss_ddf": self.loss_ddf}


@runtime_checkable
class OwnSetLoss(Protocol):
    """A detector whose set loss is its family's own (:meth:`set_loss_options`), not its class head's defaults."""

    def set_loss_options(self) -> SetLossOptions: ...
