"""DETR's set prediction loss (facebookresearch/detr ``models/detr/detr.py``, ``SetCriterion``).

After Hungarian matching, matched queries are supervised with their target's class and box, and
every other query with the "no object" class (down-weighted by ``eos_coef``). Box losses are
summed over matched pairs and divided by the average number of target boxes per rank. The same
loss is applied to every auxiliary decoder output, with the suffix ``_<layer>``.

``class_loss="focal"`` gives Deformable DETR's loss (fundamentalvision/Deformable-DETR): K sigmoid
logits, no "no object" class, a sigmoid focal loss over one-hot targets normalised by the number
of boxes (``mean over queries, summed, / num_boxes * Q``), default weights class 2, L1 5, GIoU 2;
two-stage proposals (``enc_outputs``) are matched and supervised class-agnostically (every label
0) under the suffix ``_enc``.

Options of the DINO line, each used only when the model's outputs carry its entries:

* ``class_loss="vfl"`` (varifocal, RT-DETR / D-FINE), ``"ia_bce"`` (RF-DETR's IoU-aware BCE) or ``"mal"``
  (DEIM's matchability-aware loss): sigmoid class losses whose target is the IoU of the matched box (:mod:`visiontf.set_prediction.losses`);
* ``interm_outputs`` (DINO's mixed query selection: the selected encoder proposals): matched and
  supervised with the class labels under the suffix ``_interm`` (DINO's ``SetCriterion``);
* ``num_query_groups`` G (Group DETR): the G * Q queries are matched one-to-one per group, and the
  normaliser becomes ``num_boxes * G`` (as LW-DETR / RF-DETR);
* ``one_to_many_outputs`` (H-DETR's hybrid matching, Jia et al., CVPR 2023): an auxiliary set of queries matched
  to each image's ground truth repeated ``one_to_many_repeats`` times (H-DETR's k, 6), so that up to k queries
  learn each object; its terms, normalised by ``num_boxes * k``, are ``_o2m`` (its last layer) and ``_o2m_<layer>``,
  weighted by their base term's weight times ``one_to_many_weight`` (H-DETR's lambda, 1);
* ``dn_outputs`` with ``dn_meta`` (contrastive denoising): the positive denoising queries are
  supervised with their own ground truth (fixed assignment, no matching), negatives and padding as
  "no object", normalised by ``num_boxes * dn_groups``, under ``_dn`` and ``_dn_<layer>`` (DINO);
  a batch without boxes gives zero ``_dn`` terms.

The weight of a suffixed term defaults to its base term's (``loss_ce_dn`` weighs as ``loss_ce``).
"""
from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn
from torchvision.ops import box_convert, box_iou, generalized_box_iou, sigmoid_focal_loss

from visiontf.models.contract import check_detection_targets
from visiontf.models.deformable_detr.denoising import denoising_match_indices
from visiontf.models.matched_masks import MASK_LOGITS_OF
from visiontf.set_prediction.losses import ia_bce_loss, matchability_aware_loss, varifocal_loss
from visiontf.set_prediction.mask_losses import loss_masks
from visiontf.set_prediction.matcher import HungarianMatcher, Indices

logger = logging.getLogger(__name__)

DEFAULT_WEIGHTS: dict[str, float] = {"loss_ce": 1.0, "loss_bbox": 5.0, "loss_giou": 2.0}
#: Deformable DETR's defaults (``main.py``: cls_loss_coef 2, bbox 5, giou 2)
FOCAL_DEFAULT_WEIGHTS: dict[str, float] = {"loss_ce": 2.0, "loss_bbox": 5.0, "loss_giou": 2.0}
SUPPORTED_LOSSES = ("labels", "boxes", "cardinality")
#: terms a criterion computes only when asked (``losses``) and only on outputs that have them: DETR's mask
#: losses on ``pred_masks`` (the final layer's; auxiliary and other outputs have none)
OPTIONAL_LOSSES = ("masks",)
CLASS_LOSSES = ("ce", "focal", "vfl", "ia_bce", "mal")
#: IoU-aware sigmoid class losses: the matched class's target is the box's IoU
_IOU_AWARE = {"vfl": varifocal_loss, "ia_bce": ia_bce_loss, "mal": matchability_aware_loss}
#: outputs that are not the final predictions: each is matched and supervised separately
_EXTRA_OUTPUTS = ("aux_outputs", "enc_outputs", "interm_outputs", "dn_outputs", "dn_meta", "num_query_groups",
                  "one_to_many_outputs")
#: denoising terms of a batch without any box (zero, so that every step logs the same names)
_DN_TERMS = ("loss_ce_dn", "loss_bbox_dn", "loss_giou_dn")

# GIoU of each matched pair: torchvision's pairwise GIoU vmapped over the pairs equals the diagonal
# of the full matrix the original builds, without the (M, M) intermediate.
_paired_giou = torch.vmap(lambda a, b: generalized_box_iou(a[None], b[None])[0, 0])
_paired_iou = torch.vmap(lambda a, b: box_iou(a[None], b[None])[0, 0])


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
            :class:`~visiontf.set_prediction.matcher.HungarianMatcher`.
        weight_dict: weight of each loss term in ``loss``; defaults to ce 1, bbox 5, giou 2. The
            same weight applies to the auxiliary ``_i`` versions of a term.
        eos_coef: class weight of "no object" in the cross-entropy (``"ce"`` only).
        losses: which of ``"labels"``, ``"boxes"``, ``"cardinality"`` and ``"masks"`` (DETR's focal and dice
            mask losses ``loss_mask``, ``loss_dice`` on ``pred_masks``: :mod:`visiontf.set_prediction.mask_losses`) to
            compute; ``"masks"`` applies to the outputs that have ``pred_masks`` (the final layer's).
        class_loss: ``"ce"`` (DETR: softmax cross-entropy over K + 1 logits) or ``"focal"``
            (Deformable DETR: sigmoid focal loss over K logits; its default weights and matcher
            are class 2 / L1 5 / GIoU 2 with the focal matching cost), or an IoU-aware sigmoid
            loss: ``"vfl"`` (:func:`~visiontf.set_prediction.losses.varifocal_loss`, alpha 0.75) or
            ``"ia_bce"`` (:func:`~visiontf.set_prediction.losses.ia_bce_loss`, alpha ``focal_alpha``) or
            ``"mal"`` (:func:`~visiontf.set_prediction.losses.matchability_aware_loss`, no alpha; DEIM uses
            ``focal_gamma`` 1.5); the sigmoid losses share the focal matching cost and normalisation.
        focal_alpha, focal_gamma: of the focal loss (gamma of every sigmoid loss, alpha also of IA-BCE).
        one_to_many_repeats: k, how many times each target is repeated for the ``one_to_many_outputs`` (H-DETR 6).
        one_to_many_weight: the one-to-many terms' weight relative to their base terms' (H-DETR's lambda, 1).

    ``forward(outputs, targets)`` returns the unweighted terms (``loss_ce``, ``class_error``,
    ``loss_bbox``, ``loss_giou``, ``cardinality_error`` and their ``_i`` versions for
    ``aux_outputs[i]`` and ``_enc`` versions for two-stage ``enc_outputs``; ``class_error`` only
    for the last layer, as the original) plus ``loss``, the weighted sum. All terms are float32
    whatever the dtype of the predictions.
    """

    def __init__(
        self,
        num_classes: int,
        matcher: nn.Module | None = None,
        weight_dict: Mapping[str, float] | None = None,
        eos_coef: float = 0.1,
        losses: Sequence[str] = SUPPORTED_LOSSES,
        class_loss: str = "ce",
        focal_alpha: float = 0.25,
        focal_gamma: float = 2.0,
        one_to_many_repeats: int = 6,
        one_to_many_weight: float = 1.0,
    ):
        super().__init__()
        if isinstance(one_to_many_repeats, bool) or not isinstance(one_to_many_repeats, int) or one_to_many_repeats < 1:
            raise ValueError(f"SetCriterion: one_to_many_repeats must be a whole number >= 1 (H-DETR 6), got {one_to_many_repeats!r}")
        if isinstance(one_to_many_weight, bool) or not isinstance(one_to_many_weight, (int, float)) or not one_to_many_weight >= 0:
            raise ValueError(f"SetCriterion: one_to_many_weight must be a number >= 0 (H-DETR 1), got {one_to_many_weight!r}")
        if num_classes < 1:
            raise ValueError(f"SetCriterion: num_classes must be >= 1, got {num_classes}")
        unknown = [name for name in losses if name not in SUPPORTED_LOSSES + OPTIONAL_LOSSES]
        if unknown:
            raise ValueError(
                f"SetCriterion: unknown losses {unknown}; choose from {list(SUPPORTED_LOSSES + OPTIONAL_LOSSES)}"
            )
        if class_loss not in CLASS_LOSSES:
            raise ValueError(f"SetCriterion: class_loss must be one of {CLASS_LOSSES}, got {class_loss!r}")
        focal = class_loss != "ce"  # every sigmoid loss matches with the focal cost
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
        self.one_to_many_repeats = one_to_many_repeats
        self.one_to_many_weight = float(one_to_many_weight)
        empty_weight = torch.ones(num_classes + 1)
        empty_weight[-1] = eos_coef
        self.register_buffer("empty_weight", empty_weight)

    @property
    def num_logits(self) -> int:
        """Logits per query the predictions must have: K + 1 ("ce") or K ("focal")."""
        return self.num_classes + (1 if self.class_loss == "ce" else 0)

    # -- individual terms -------------------------------------------------------------------
    @staticmethod
    def _src_permutation_idx(indices: Indices) -> tuple[Tensor, Tensor]:
        batch_idx = torch.cat([torch.full_like(src, i) for i, (src, _) in enumerate(indices)])
        src_idx = torch.cat([src for src, _ in indices])
        return batch_idx, src_idx

    def loss_labels(
        self, outputs, targets, indices: Indices, num_boxes: float, log: bool = True
    ) -> dict[str, Tensor]:
        """Weighted cross-entropy (or focal loss) over all queries; ``class_error`` on the matched ones."""
        src_logits = outputs["pred_logits"].float()
        device = src_logits.device
        idx = tuple(i.to(device) for i in self._src_permutation_idx(indices))
        target_classes_o = torch.cat(
            [t["labels"][j.to(t["labels"].device)].to(device) for t, (_, j) in zip(targets, indices)]
        ).long()
        if self.class_loss in _IOU_AWARE:
            target_classes = torch.full(src_logits.shape[:2], self.num_classes, dtype=torch.int64, device=device)
            target_classes[idx] = target_classes_o
            iou = torch.zeros(src_logits.shape[:2], dtype=torch.float32, device=device)
            if len(target_classes_o):
                iou[idx] = self._matched_iou(outputs, targets, indices, idx)
            # vfl: its own alpha 0.75; mal: DEIM's (no alpha); ia_bce: focal_alpha
            kwargs = {"gamma": self.focal_gamma} if self.class_loss in ("vfl", "mal") else {"alpha": self.focal_alpha, "gamma": self.focal_gamma}
            loss_ce = _IOU_AWARE[self.class_loss](src_logits, target_classes, iou, num_boxes, **kwargs)
        elif self.class_loss == "focal":
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

    @staticmethod
    @torch.no_grad()
    def _matched_iou(outputs, targets, indices: Indices, idx: tuple[Tensor, Tensor]) -> Tensor:
        """IoU of every matched (prediction, target) pair, in the order of ``idx``."""
        pred = outputs["pred_boxes"].float()[idx]
        tgt = torch.cat([t["boxes"].reshape(-1, 4)[j.to(t["boxes"].device)].to(pred.device, torch.float32) for t, (_, j) in zip(targets, indices)])
        return _paired_iou(box_convert(pred, "cxcywh", "xyxy"), box_convert(tgt, "cxcywh", "xyxy")).nan_to_num(0.0)

    @torch.no_grad()
    def loss_cardinality(self, outputs, targets, indices: Indices, num_boxes: float) -> dict[str, Tensor]:
        """Absolute error in the number of non-"no object" predictions; a metric, no gradient."""
        logits = outputs["pred_logits"]
        tgt_lengths = torch.as_tensor(
            [len(t["labels"]) for t in targets], dtype=torch.float32, device=logits.device
        )
        card_pred = (logits.argmax(-1) != logits.shape[-1] - 1).sum(1)
        return {"cardinality_error": F.l1_loss(card_pred.float(), tgt_lengths)}

    def loss_boxes(self, outputs, targets, indices: Indices, num_boxes: float) -> dict[str, Tensor]:
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
            "masks": loss_masks,
        }[name]
        return fn(outputs, targets, indices, num_boxes, **kwargs)

    # -- full criterion ---------------------------------------------------------------------
    def num_boxes(self, targets: Sequence[Mapping[str, Tensor]], device: torch.device, sync: bool = True) -> float:
        """Average number of target boxes per rank (all-reduced under DDP when ``sync``), at least 1."""
        count = float(sum(len(t["labels"]) for t in targets))
        world = _world_size() if sync else 1
        if world == 1:
            return max(count, 1.0)  # on the host: no device tensor to read back (a wait for the GPU)
        total = torch.as_tensor([count], dtype=torch.float32, device=device)
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
        check_detection_targets(targets, logits.shape[0], "SetCriterion")

    def match_groups(self, outputs: Mapping[str, Tensor], targets: Sequence[Mapping[str, Tensor]], groups: int) -> Indices:
        """Hungarian matching of each of ``groups`` query groups on its own (Group DETR).

        ``outputs`` hold G * Q queries per image, group-major; the groups are folded into the batch
        so that one matcher call solves all of them, and the indices come back per image over all
        G * Q queries (each target matched once per group).
        """
        if groups == 1:
            return self.matcher(outputs, targets)
        logits, boxes = outputs["pred_logits"], outputs["pred_boxes"]
        B, N = logits.shape[:2]
        if N % groups:
            raise ValueError(f"num_query_groups={groups} does not divide the {N} queries of the outputs")
        Q = N // groups
        folded = {"pred_logits": logits.reshape(B * groups, Q, -1), "pred_boxes": boxes.reshape(B * groups, Q, 4)}
        found = self.matcher(folded, [t for t in targets for _ in range(groups)])
        indices: Indices = []
        for b in range(B):
            per_group = found[b * groups : (b + 1) * groups]
            indices.append((
                torch.cat([q + g * Q for g, (q, _) in enumerate(per_group)]),
                torch.cat([t for _, t in per_group]),
            ))
        return indices

    def _losses_for(self, outputs: Mapping[str, object]) -> list[str]:
        """The terms of ``self.losses`` that ``outputs`` can give (mask losses need ``pred_masks`` or a
        training forward's ``mask_logits_of``)."""
        return [name for name in self.losses if name != "masks" or "pred_masks" in outputs or MASK_LOGITS_OF in outputs]

    def _add_denoising(self, dn_outputs, meta, targets, num_boxes: float, add, terms: dict[str, Tensor]) -> None:
        """Denoising terms: fixed assignment of the positive queries, ``num_boxes * dn_groups`` normaliser."""
        losses = [name for name in self._losses_for(dn_outputs) if name != "cardinality"]  # a count of noised copies means nothing
        if meta.pad_size == 0:
            zero = dn_outputs["pred_logits"].float().sum() * 0.0
            add({name: zero for name in _DN_TERMS}, "")
            for i, _ in enumerate(dn_outputs.get("aux_outputs", ()) or ()):
                add({name: zero for name in _DN_TERMS}, f"_{i}")
            return
        indices = denoising_match_indices(meta)
        normaliser = num_boxes * meta.num_groups
        for name in losses:
            add(self.get_loss(name, dn_outputs, targets, indices, normaliser, **({"log": False} if name == "labels" else {})), "_dn")
        for i, aux in enumerate(dn_outputs.get("aux_outputs", ()) or ()):
            for name in losses:
                add(self.get_loss(name, aux, targets, indices, normaliser, **({"log": False} if name == "labels" else {})), f"_dn_{i}")

    def _add_one_to_many(self, many: Mapping[str, object], targets: Sequence[Mapping[str, Tensor]], num_boxes: float, add) -> None:
        """Hybrid matching's terms: each layer of ``many`` matched one-to-one to the targets repeated k times (so up to
        k queries an object), normalised by ``num_boxes * k``, weighted by ``one_to_many_weight``."""
        k = self.one_to_many_repeats
        repeated = [{"labels": t["labels"].repeat(k), "boxes": t["boxes"].reshape(-1, 4).repeat(k, 1)} for t in targets]
        layers = [*(many.get("aux_outputs", ()) or ()), many]
        for i, out in enumerate(layers):
            self._check(out, repeated)
            indices = self.matcher(out, repeated)
            suffix = "_o2m" if i == len(layers) - 1 else f"_o2m_{i}"
            for name in self._losses_for(out):
                if name == "cardinality":  # k copies of each object: a count of detections against it means nothing
                    continue
                kwargs = {"log": False} if name == "labels" else {}
                add(self.get_loss(name, out, repeated, indices, num_boxes * k, **kwargs), suffix, self.one_to_many_weight)

    def forward(
        self, outputs: Mapping[str, object], targets: Sequence[Mapping[str, Tensor]], sync_num_boxes: bool = True
    ) -> dict[str, Tensor]:
        """Loss terms for the final and auxiliary decoder outputs plus their weighted sum ``loss``.

        ``sync_num_boxes=False`` keeps the normaliser local to this rank: evaluation steps must not
        run collectives, since ranks may see different numbers of batches there.
        """
        main = {k: v for k, v in outputs.items() if k not in _EXTRA_OUTPUTS}
        self._check(main, targets)
        num_boxes = self.num_boxes(targets, main["pred_logits"].device, sync=sync_num_boxes)

        terms: dict[str, Tensor] = {}
        weighted = []

        def add(group: dict[str, Tensor], suffix: str, scale: float = 1.0) -> None:
            for key, value in group.items():
                terms[key + suffix] = value
                # Original-style dicts name aux weights explicitly ("loss_ce_0"); else share the base.
                weight = self.weight_dict.get(key + suffix, self.weight_dict.get(key, 0.0)) * scale
                if weight:
                    weighted.append(weight * value)

        # Group DETR: G groups of queries, each matched one-to-one on its own
        groups = int(outputs.get("num_query_groups", 1) or 1)
        group_boxes = num_boxes * groups
        indices = self.match_groups(main, targets, groups)
        for name in self._losses_for(main):
            add(self.get_loss(name, main, targets, indices, group_boxes), "")

        for i, aux in enumerate(outputs.get("aux_outputs", ()) or ()):
            self._check(aux, targets)
            indices = self.match_groups(aux, targets, groups)
            for name in self._losses_for(aux):
                # The original logs class_error for the last layer only.
                kwargs = {"log": False} if name == "labels" else {}
                add(self.get_loss(name, aux, targets, indices, group_boxes, **kwargs), f"_{i}")

        interm = outputs.get("interm_outputs")
        if interm is not None:
            # DINO's mixed query selection: the selected proposals, matched with their classes
            self._check(interm, targets)
            indices = self.matcher(interm, targets)
            for name in self._losses_for(interm):
                kwargs = {"log": False} if name == "labels" else {}
                add(self.get_loss(name, interm, targets, indices, num_boxes, **kwargs), "_interm")

        if outputs.get("dn_meta") is not None:
            self._add_denoising(outputs["dn_outputs"], outputs["dn_meta"], targets, num_boxes, add, terms)

        many = outputs.get("one_to_many_outputs")
        if many is not None:
            self._add_one_to_many(many, targets, num_boxes, add)

        enc = outputs.get("enc_outputs")
        if enc is not None:
            # two-stage proposals: class-agnostic, every target is class 0
            agnostic = [{**t, "labels": torch.zeros_like(t["labels"])} for t in targets]
            self._check(enc, agnostic)
            indices = self.matcher(enc, agnostic)
            for name in self._losses_for(enc):
                kwargs = {"log": False} if name == "labels" else {}
                add(self.get_loss(name, enc, agnostic, indices, num_boxes, **kwargs), "_enc")

        if weighted:
            terms["loss"] = torch.stack(weighted).sum()
        else:
            terms["loss"] = main["pred_logits"].float().sum() * 0.0
        return terms
