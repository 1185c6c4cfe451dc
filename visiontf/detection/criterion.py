"""DETR's set prediction loss (facebookresearch/detr ``models/detr.py``, ``SetCriterion``).

After Hungarian matching, matched queries are supervised with their target's class and box, and
every other query with the "no object" class (down-weighted by ``eos_coef``). Box losses are
summed over matched pairs and divided by the average number of target boxes per rank. The same
loss is applied to every auxiliary decoder output, with the suffix ``_<layer>``.

``class_loss="focal"`` gives Deformable DETR's loss (fundamentalvision/Deformable-DETR): K sigmoid
logits, no "no object" class, a sigmoid focal loss over one-hot targets normalised by the number
of boxes (``mean over queries, summed, / num_boxes * Q``), default weights class 2, L1 5, GIoU 2;
two-stage proposals (``enc_outputs``) are matched and supervised class-agnostically (every label
0) under the suffix ``_enc``.
"""
from __future__ import annotations

import logging
from typing import Dict, Mapping, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn
from torchvision.ops import box_convert, generalized_box_iou, sigmoid_focal_loss

from visiontf.detection.matcher import HungarianMatcher, Indices

logger = logging.getLogger(__name__)

DEFAULT_WEIGHTS: Dict[str, float] = {"loss_ce": 1.0, "loss_bbox": 5.0, "loss_giou": 2.0}
#: Deformable DETR's defaults (``main.py``: cls_loss_coef 2, bbox 5, giou 2)
FOCAL_DEFAULT_WEIGHTS: Dict[str, float] = {"loss_ce": 2.0, "loss_bbox": 5.0, "loss_giou": 2.0}
SUPPORTED_LOSSES = ("labels", "boxes", "cardinality")
CLASS_LOSSES = ("ce", "focal")
#: outputs that are not the final predictions: each is matched and supervised separately
_EXTRA_OUTPUTS = ("aux_outputs", "enc_outputs")

# GIoU of each matched pair: torchvision's pairwise GIoU vmapped over the pairs equals the diagonal
# of the full matrix the original builds, without the (M, M) intermediate.
_paired_giou = torch.vmap(lambda a, b: generalized_box_iou(a[None], b[None])[0, 0])


@torch.no_grad()
def _top1_accuracy(logits: Tensor, target: Tensor) -> Tensor:
    """Top-1 accuracy in percent, 0 when there is nothing to score (as DETR's ``util.misc``)."""
    if target.numel() == 0:
        return torch.zeros([], device=logits.device)
    pred = logits.topk(1, dim=1, largest=True, sorted=True).indices[:, 0]
    return pred.eq(target).float().sum() * (100.0 / target.numel())


def _world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


class SetCriterion(nn.Module):
    """Hungarian-matched set loss of DETR.

    Args:
        num_classes: number of object classes K, without "no object" (logits have K+1 entries).
        matcher: module returning per-image ``(query_idx, target_idx)``; usually
            :class:`~visiontf.detection.matcher.HungarianMatcher`.
        weight_dict: weight of each loss term in ``loss``; defaults to ce 1, bbox 5, giou 2. The
            same weight applies to the auxiliary ``_i`` versions of a term.
        eos_coef: class weight of "no object" in the cross-entropy (``"ce"`` only).
        losses: which of ``"labels"``, ``"boxes"``, ``"cardinality"`` to compute.
        class_loss: ``"ce"`` (DETR: softmax cross-entropy over K + 1 logits) or ``"focal"``
            (Deformable DETR: sigmoid focal loss over K logits; its default weights and matcher
            are class 2 / L1 5 / GIoU 2 with the focal matching cost).
        focal_alpha, focal_gamma: of the focal loss.

    ``forward(outputs, targets)`` returns the unweighted terms (``loss_ce``, ``class_error``,
    ``loss_bbox``, ``loss_giou``, ``cardinality_error`` and their ``_i`` versions for
    ``aux_outputs[i]`` and ``_enc`` versions for two-stage ``enc_outputs``; ``class_error`` only
    for the last layer, as the original) plus ``loss``, the weighted sum. All terms are float32
    whatever the dtype of the predictions.
    """

    def __init__(
        self,
        num_classes: int,
        matcher: Optional[nn.Module] = None,
        weight_dict: Optional[Mapping[str, float]] = None,
        eos_coef: float = 0.1,
        losses: Sequence[str] = SUPPORTED_LOSSES,
        class_loss: str = "ce",
        focal_alpha: float = 0.25,
        focal_gamma: float = 2.0,
    ):
        super().__init__()
        if num_classes < 1:
            raise ValueError(f"SetCriterion: num_classes must be >= 1, got {num_classes}")
        unknown = [name for name in losses if name not in SUPPORTED_LOSSES]
        if unknown:
            raise ValueError(
                f"SetCriterion: unknown losses {unknown}; choose from {list(SUPPORTED_LOSSES)}"
            )
        if class_loss not in CLASS_LOSSES:
            raise ValueError(f"SetCriterion: class_loss must be one of {CLASS_LOSSES}, got {class_loss!r}")
        focal = class_loss == "focal"
        if matcher is None:
            matcher = HungarianMatcher(cost_class=2.0, class_cost="focal", focal_alpha=focal_alpha, focal_gamma=focal_gamma) if focal else HungarianMatcher()
        if getattr(matcher, "class_cost", "focal" if focal else "softmax") != ("focal" if focal else "softmax"):
            raise ValueError(
                f"SetCriterion(class_loss={class_loss!r}) needs a matcher with class_cost="
                f"{'focal' if focal else 'softmax'!r}, got {matcher.class_cost!r}: the two must agree on the logits' layout"
            )
        self.num_classes = num_classes
        self.matcher = matcher
        self.weight_dict = dict((FOCAL_DEFAULT_WEIGHTS if focal else DEFAULT_WEIGHTS) if weight_dict is None else weight_dict)
        self.eos_coef = eos_coef
        self.losses = tuple(losses)
        self.class_loss = class_loss
        self.focal_alpha = focal_alpha
        self.focal_gamma = focal_gamma
        empty_weight = torch.ones(num_classes + 1)
        empty_weight[-1] = eos_coef
        self.register_buffer("empty_weight", empty_weight)

    @property
    def num_logits(self) -> int:
        """Logits per query the predictions must have: K + 1 ("ce") or K ("focal")."""
        return self.num_classes + (1 if self.class_loss == "ce" else 0)

    # -- individual terms -------------------------------------------------------------------
    @staticmethod
    def _src_permutation_idx(indices: Indices) -> Tuple[Tensor, Tensor]:
        batch_idx = torch.cat([torch.full_like(src, i) for i, (src, _) in enumerate(indices)])
        src_idx = torch.cat([src for src, _ in indices])
        return batch_idx, src_idx

    def loss_labels(
        self, outputs, targets, indices: Indices, num_boxes: float, log: bool = True
    ) -> Dict[str, Tensor]:
        """Weighted cross-entropy (or focal loss) over all queries; ``class_error`` on the matched ones."""
        src_logits = outputs["pred_logits"].float()
        device = src_logits.device
        idx = tuple(i.to(device) for i in self._src_permutation_idx(indices))
        target_classes_o = torch.cat(
            [t["labels"][j.to(t["labels"].device)].to(device) for t, (_, j) in zip(targets, indices)]
        ).long()
        if self.class_loss == "focal":
            # one-hot over the K classes; unmatched queries are all-negative
            onehot = torch.zeros_like(src_logits)
            onehot[idx + (target_classes_o,)] = 1.0
            focal = sigmoid_focal_loss(src_logits, onehot, alpha=self.focal_alpha, gamma=self.focal_gamma, reduction="none")
            # the original's normalisation: mean over queries, summed, / num_boxes, times Q
            loss_ce = focal.mean(1).sum() / num_boxes * src_logits.shape[1]
        else:
            target_classes = torch.full(
                src_logits.shape[:2], self.num_classes, dtype=torch.int64, device=device
            )
            target_classes[idx] = target_classes_o
            loss_ce = F.cross_entropy(
                src_logits.transpose(1, 2), target_classes, self.empty_weight.float()
            )
        losses = {"loss_ce": loss_ce}
        if log:
            losses["class_error"] = 100 - _top1_accuracy(src_logits[idx], target_classes_o)
        return losses

    @torch.no_grad()
    def loss_cardinality(self, outputs, targets, indices: Indices, num_boxes: float) -> Dict[str, Tensor]:
        """Absolute error in the number of non-"no object" predictions; a metric, no gradient."""
        logits = outputs["pred_logits"]
        tgt_lengths = torch.as_tensor(
            [len(t["labels"]) for t in targets], dtype=torch.float32, device=logits.device
        )
        card_pred = (logits.argmax(-1) != logits.shape[-1] - 1).sum(1)
        return {"cardinality_error": F.l1_loss(card_pred.float(), tgt_lengths)}

    def loss_boxes(self, outputs, targets, indices: Indices, num_boxes: float) -> Dict[str, Tensor]:
        """L1 and 1 - GIoU of the matched boxes, summed and divided by ``num_boxes``."""
        pred_boxes = outputs["pred_boxes"].float()
        device = pred_boxes.device
        idx = tuple(i.to(device) for i in self._src_permutation_idx(indices))
        src_boxes = pred_boxes[idx]
        target_boxes = torch.cat(
            [
                t["boxes"].reshape(-1, 4)[j.to(t["boxes"].device)].to(device, torch.float32)
                for t, (_, j) in zip(targets, indices)
            ]
        )
        loss_bbox = F.l1_loss(src_boxes, target_boxes, reduction="none")
        giou = _paired_giou(
            box_convert(src_boxes, "cxcywh", "xyxy"), box_convert(target_boxes, "cxcywh", "xyxy")
        )
        return {
            "loss_bbox": loss_bbox.sum() / num_boxes,
            "loss_giou": (1 - giou).sum() / num_boxes,
        }

    def get_loss(self, name: str, outputs, targets, indices: Indices, num_boxes: float, **kwargs):
        """Compute one named group of terms (``labels``, ``boxes`` or ``cardinality``)."""
        fn = {
            "labels": self.loss_labels,
            "boxes": self.loss_boxes,
            "cardinality": self.loss_cardinality,
        }[name]
        return fn(outputs, targets, indices, num_boxes, **kwargs)

    # -- full criterion ---------------------------------------------------------------------
    def num_boxes(self, targets: Sequence[Mapping[str, Tensor]], device: torch.device, sync: bool = True) -> float:
        """Average number of target boxes per rank (all-reduced under DDP when ``sync``), at least 1."""
        total = torch.as_tensor(
            [float(sum(len(t["labels"]) for t in targets))], dtype=torch.float32, device=device
        )
        world = _world_size() if sync else 1
        if world > 1:
            dist.all_reduce(total)
        return torch.clamp(total / world, min=1).item()

    def _check(self, outputs: Mapping[str, Tensor], targets: Sequence[Mapping[str, Tensor]]) -> None:
        logits = outputs["pred_logits"]
        if logits.shape[-1] != self.num_logits:
            layout = "classes + 'no object'" if self.class_loss == "ce" else "sigmoid classes, no 'no object'"
            raise ValueError(
                f"SetCriterion(num_classes={self.num_classes}, class_loss={self.class_loss!r}) expects pred_logits with "
                f"{self.num_logits} entries ({layout}), got {logits.shape[-1]}; "
                "build the model and the criterion with the same num_classes and the class loss of the model's family"
            )
        if len(targets) != logits.shape[0]:
            raise ValueError(
                f"got {len(targets)} target dicts for a batch of {logits.shape[0]} images"
            )

    def forward(
        self, outputs: Mapping[str, object], targets: Sequence[Mapping[str, Tensor]], sync_num_boxes: bool = True
    ) -> Dict[str, Tensor]:
        """Loss terms for the final and auxiliary decoder outputs plus their weighted sum ``loss``.

        ``sync_num_boxes=False`` keeps the normaliser local to this rank: evaluation steps must not
        run collectives, since ranks may see different numbers of batches there.
        """
        main = {k: v for k, v in outputs.items() if k not in _EXTRA_OUTPUTS}
        self._check(main, targets)
        num_boxes = self.num_boxes(targets, main["pred_logits"].device, sync=sync_num_boxes)

        terms: Dict[str, Tensor] = {}
        weighted = []

        def add(group: Dict[str, Tensor], suffix: str) -> None:
            for key, value in group.items():
                terms[key + suffix] = value
                # Original-style dicts name aux weights explicitly ("loss_ce_0"); else share the base.
                weight = self.weight_dict.get(key + suffix, self.weight_dict.get(key, 0.0))
                if weight:
                    weighted.append(weight * value)

        indices = self.matcher(main, targets)
        for name in self.losses:
            add(self.get_loss(name, main, targets, indices, num_boxes), "")

        for i, aux in enumerate(outputs.get("aux_outputs", ()) or ()):
            self._check(aux, targets)
            indices = self.matcher(aux, targets)
            for name in self.losses:
                # The original logs class_error for the last layer only.
                kwargs = {"log": False} if name == "labels" else {}
                add(self.get_loss(name, aux, targets, indices, num_boxes, **kwargs), f"_{i}")

        enc = outputs.get("enc_outputs")
        if enc is not None:
            # two-stage proposals: class-agnostic, every target is class 0
            agnostic = [{**t, "labels": torch.zeros_like(t["labels"])} for t in targets]
            self._check(enc, agnostic)
            indices = self.matcher(enc, agnostic)
            for name in self.losses:
                kwargs = {"log": False} if name == "labels" else {}
                add(self.get_loss(name, enc, agnostic, indices, num_boxes, **kwargs), "_enc")

        if weighted:
            terms["loss"] = torch.stack(weighted).sum()
        else:
            terms["loss"] = main["pred_logits"].float().sum() * 0.0
        return terms
