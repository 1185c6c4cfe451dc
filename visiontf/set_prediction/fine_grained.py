"""D-FINE's set loss (Peng et al., ICLR 2025) and DEIM's (Huang et al., CVPR 2025), for box heads that predict each
edge as a distribution (:mod:`visiontf.models.dfine.fdr`).

On top of RT-DETR's class term (varifocal; DEIM: matchability-aware), L1 and GIoU, every decoder layer whose outputs
carry edge logits (``pred_corners``) and the reference box they refine (``ref_points``) gets two terms:

* **Fine-grained localisation** (``loss_fgl``): each target edge, as an offset from the reference in the
  weighting function's units, falls between two bins (:func:`box_to_distance`); the edge's distribution is pulled
  to both by cross-entropies weighted by the edge's closeness to each, times the box's IoU, summed and divided by
  the box count (:func:`localization_loss`).
* **Decoupled distillation** (``loss_ddf``, GO-LSD): every layer but the last learns the last layer's
  distributions, a KL divergence at temperature ``T`` (times ``T^2``) per edge, weighted by the last layer's
  confidence (the IoU for matched queries, the best class score for the others); matched and unmatched edges are
  averaged apart and mixed in proportion to the square roots of their counts (:func:`distillation_loss`).

Matching: the class term of each output uses that output's own Hungarian matching; the box and distribution terms use
the *union* of the matchings of every layer, the first layer's extra box (``pre_outputs``) and the selected
proposals (:func:`union_matching`: each query with the target it was matched to most often), normalised by the
union's size (``union_matching=True``, both originals' default). The denoising queries have their fixed assignment.

Names (visiontf's, the originals' in brackets): the last layer ``loss_ce`` (``loss_vfl``/``loss_mal``),
``loss_bbox``, ``loss_giou``, ``loss_fgl``; layer ``i`` ``..._i`` (``_aux_i``) with ``loss_ddf_i``; the first layer's
extra box ``_pre``; the proposals ``_interm`` (``_enc_0``); the denoising queries ``_dn`` (last layer), ``_dn_i`` and
``_dn_pre``. Two departures, both of terms that are zero in the originals: no ``loss_ddf`` for a layer against itself
(the last layer's denoising queries: D-FINE logs 0, DEIM nothing), and a batch without boxes gives zero denoising terms.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor
from torchvision.ops import box_convert

from visiontf.models.deformable_detr.denoising import denoising_match_indices
from visiontf.models.dfine.fdr import weighting_function
from visiontf.set_prediction.criterion import SUPPORTED_LOSSES, SetCriterion, _paired_iou, _world_size
from visiontf.set_prediction.matcher import Indices

__all__ = ["FineGrainedCriterion", "box_to_distance", "distillation_loss", "localization_loss", "union_matching"]

#: what the originals scale the batch to when they weigh matched against unmatched edges in the distillation
DDF_BATCH = 8
#: the distribution terms of a batch without boxes (zero, so that every step logs the same names)
_DN_TERMS = ("loss_ce_dn", "loss_bbox_dn", "loss_giou_dn", "loss_fgl_dn")


def union_matching(matchings: Sequence[Indices]) -> Indices:
    """The union of several matchings of the same images: per image, every (query, target) pair any of them made,
    counted; ordered by count (most first), each query keeps the first target it appears with."""
    images = len(matchings[0])
    out: Indices = []
    for b in range(images):
        pairs = torch.cat([torch.stack([m[b][0].long(), m[b][1].long()], 1) for m in matchings])
        if not len(pairs):
            empty = torch.zeros(0, dtype=torch.int64, device=pairs.device)
            out.append((empty, empty.clone()))
            continue
        unique, counts = torch.unique(pairs, return_counts=True, dim=0)
        chosen: dict[int, int] = {}
        for query, target in unique[torch.argsort(counts, descending=True)].tolist():
            chosen.setdefault(query, target)
        out.append((torch.tensor(list(chosen), dtype=torch.int64, device=pairs.device),
                    torch.tensor(list(chosen.values()), dtype=torch.int64, device=pairs.device)))
    return out


@torch.no_grad()
def box_to_distance(reference: Tensor, target: Tensor, reg_max: int, reg_scale: float, up: float, eps: float = 0.1,
                    ) -> tuple[Tensor, Tensor, Tensor]:
    """Where the target edges fall among the bins: ``(position, right weight, left weight)``, each (M * 4,), edges in
    the order (left, top, right, bottom) of each box.

    Args:
        reference: (M, 4) cxcywh, the boxes the edge offsets are measured from.
        target: (M, 4) xyxy target boxes.
        reg_max, reg_scale, up: the weighting function's (:func:`~visiontf.models.dfine.fdr.weighting_function`).
        eps: positions stay below ``reg_max - eps``.

    An edge's offset ``(distance from the centre) / (size / reg_scale) - reg_scale / 2`` lies between bin ``i`` (the
    last at or below it) and ``i + 1``: its position is ``i`` and the two weights split 1 in proportion to its
    closeness to each. Beyond the outer bins, all the weight is on the outermost one.
    """
    scale = abs(float(reg_scale))
    cx, cy, w, h = reference.unbind(-1)
    x0, y0, x1, y1 = target.unbind(-1)
    unit_w, unit_h = w / scale + 1e-16, h / scale + 1e-16
    half = 0.5 * scale
    offsets = torch.stack([(cx - x0) / unit_w - half, (cy - y0) / unit_h - half, (x1 - cx) / unit_w - half, (y1 - cy) / unit_h - half],
                          -1).reshape(-1)
    values = weighting_function(reg_max, torch.tensor([float(up)], dtype=offsets.dtype, device=offsets.device),
                                torch.tensor([scale], dtype=offsets.dtype, device=offsets.device))
    position = ((values[None, :] - offsets[:, None]) <= 0).sum(1).to(offsets.dtype) - 1
    right = torch.zeros_like(position)
    left = torch.zeros_like(position)
    inside = (position >= 0) & (position < reg_max)
    at = position[inside].long()
    below_gap = (offsets[inside] - values[at]).abs()
    above_gap = (values[at + 1] - offsets[inside]).abs()
    right[inside] = below_gap / (below_gap + above_gap)
    left[inside] = 1.0 - right[inside]
    under = position < 0
    right[under], left[under], position[under] = 0.0, 1.0, 0.0
    over = position >= reg_max
    right[over], left[over], position[over] = 1.0, 0.0, reg_max - 0.1
    return position.clamp(0, reg_max - eps), right, left


def localization_loss(corners: Tensor, position: Tensor, right: Tensor, left: Tensor, weight: Tensor, num_boxes: float) -> Tensor:
    """The fine-grained localisation loss: ``sum(weight * (CE(bin i) * left + CE(bin i + 1) * right)) / num_boxes``
    over edges (``corners`` (E, bins) logits; the rest (E,) as :func:`box_to_distance` gives them; ``weight`` each
    edge's box IoU)."""
    lower = position.long()
    loss = F.cross_entropy(corners, lower, reduction="none") * left + F.cross_entropy(corners, lower + 1, reduction="none") * right
    return (loss * weight.float()).sum() / num_boxes


def distillation_loss(student: Tensor, teacher: Tensor, weight: Tensor, matched: Tensor, balance: tuple[Tensor, Tensor],
                      temperature: float = 5.0) -> Tensor:
    """The decoupled distillation: per edge ``weight * T^2 * KL(softmax(teacher / T) || softmax(student / T))``; the
    mean over ``matched`` edges and the mean over the others, mixed as ``(m * pos + u * neg) / (pos + neg)`` with
    ``balance = (pos, neg)``. ``student``, ``teacher``: (E, bins) logits; ``weight``, ``matched``: (E,)."""
    kl = F.kl_div(F.log_softmax(student / temperature, 1), F.softmax(teacher.detach() / temperature, 1), reduction="none").sum(-1)
    per_edge = weight * temperature ** 2 * kl
    on = per_edge[matched].mean() if matched.any() else per_edge.new_zeros(())
    off = per_edge[~matched].mean() if (~matched).any() else per_edge.new_zeros(())
    pos, neg = balance
    return (on * pos + off * neg) / (pos + neg)


def _mean_count(count: int, device: torch.device, sync: bool) -> float:
    """A count averaged over the ranks (under DDP when ``sync``), at least 1."""
    world = _world_size() if sync else 1
    if world == 1:
        return max(float(count), 1.0)
    import torch.distributed as dist

    total = torch.as_tensor([float(count)], device=device)
    dist.all_reduce(total)
    return torch.clamp(total / world, min=1).item()


class FineGrainedCriterion(SetCriterion):
    """D-FINE's and DEIM's set loss (see the module docstring); a :class:`~visiontf.set_prediction.SetCriterion` whose class,
    L1 and GIoU terms it reuses.

    Args:
        num_classes, matcher, weight_dict, eos_coef, losses, focal_alpha: as :class:`SetCriterion`'s (``weight_dict``
            also weighs ``loss_fgl`` and ``loss_ddf``).
        class_loss: ``"vfl"`` (D-FINE) or ``"mal"`` (DEIM); ``focal_gamma`` is its gamma (D-FINE 2, DEIM 1.5).
        reg_max, reg_scale, up: the model's distribution head.
        ddf_temperature: the distillation's temperature (5).
        union_matching: box and distribution terms on the union of all layers' matchings (the originals' default).
    """

    def __init__(self, num_classes: int, matcher=None, weight_dict: Mapping[str, float] | None = None, eos_coef: float = 0.1,
                 losses: Sequence[str] = SUPPORTED_LOSSES, class_loss: str = "vfl", focal_alpha: float = 0.25, focal_gamma: float = 2.0,
                 reg_max: int = 32, reg_scale: float = 4.0, up: float = 0.5, ddf_temperature: float = 5.0, union_matching: bool = True) -> None:
        if class_loss in ("ce", "focal"):
            raise ValueError(f"FineGrainedCriterion: class_loss must be IoU-aware ('vfl', 'mal', 'ia_bce'), got {class_loss!r}")
        weights = {"loss_ce": 1.0, "loss_bbox": 5.0, "loss_giou": 2.0, "loss_fgl": 0.15, "loss_ddf": 1.5}
        super().__init__(num_classes, matcher, weights if weight_dict is None else weight_dict, eos_coef, losses, class_loss, focal_alpha,
                         focal_gamma)
        self.reg_max, self.reg_scale, self.up = int(reg_max), float(reg_scale), float(up)
        self.ddf_temperature = float(ddf_temperature)
        self.union_matching = bool(union_matching)
        self._balance: tuple[Tensor, Tensor] | None = None

    # -- the distribution terms ------------------------------------------------------------------
    def loss_distribution(self, outputs: Mapping[str, Tensor], targets, indices: Indices, num_boxes: float,
                          teacher: Mapping[str, Tensor] | None = None, denoising: bool = False) -> dict[str, Tensor]:
        """``loss_fgl`` of an output with edge logits, and ``loss_ddf`` towards ``teacher`` (the last layer's outputs)."""
        corners = outputs["pred_corners"].float()
        B, N = corners.shape[:2]
        bins = self.reg_max + 1
        device = corners.device
        idx = tuple(i.to(device) for i in self._src_permutation_idx(indices))
        tgt = torch.cat([t["boxes"].reshape(-1, 4)[j.to(t["boxes"].device)].to(device, torch.float32) for t, (_, j) in zip(targets, indices)])
        reference = outputs["ref_points"].float()[idx].detach()
        position, right, left = box_to_distance(reference, box_convert(tgt, "cxcywh", "xyxy"), self.reg_max, self.reg_scale, self.up)
        with torch.no_grad():
            iou = _paired_iou(box_convert(outputs["pred_boxes"].float()[idx], "cxcywh", "xyxy"), box_convert(tgt, "cxcywh", "xyxy"))
        out = {"loss_fgl": localization_loss(corners[idx].reshape(-1, bins), position, right, left, iou.repeat_interleave(4), num_boxes)}
        if teacher is None:
            return out
        with torch.no_grad():
            confidence = teacher["pred_logits"].float().sigmoid().amax(-1)
            confidence[idx] = iou
            matched = torch.zeros(B, N, dtype=torch.bool, device=device)
            matched[idx] = True
            weight = confidence.repeat_interleave(4, dim=1).reshape(-1)
            matched = matched.repeat_interleave(4, dim=1).reshape(-1)
        if not denoising or self._balance is None:
            # the originals weigh with the matching queries' counts, and reuse them for the denoising queries
            scale = DDF_BATCH / B
            count = matched.sum().to(torch.float32)
            self._balance = ((count * scale) ** 0.5, ((matched.numel() - count) * scale) ** 0.5)
        out["loss_ddf"] = distillation_loss(corners.reshape(-1, bins), teacher["pred_corners"].float().reshape(-1, bins), weight, matched,
                                            self._balance, self.ddf_temperature)
        return out

    # -- the whole criterion ---------------------------------------------------------------------
    def forward(self, outputs: Mapping[str, object], targets: Sequence[Mapping[str, Tensor]], sync_num_boxes: bool = True) -> dict[str, Tensor]:
        """Every term (unweighted) and ``loss``, their weighted sum; the terms are float32 whatever the predictions' dtype."""
        extra = ("aux_outputs", "pre_outputs", "interm_outputs", "enc_outputs", "dn_outputs", "dn_meta")
        if "one_to_many_outputs" in outputs:
            raise ValueError("FineGrainedCriterion has no one-to-many terms (hybrid matching is RT-DETR's option); the "
                             "outputs hold one_to_many_outputs: build the model with decoder.num_one_to_many_queries=0")
        main = {k: v for k, v in outputs.items() if k not in extra}
        self._check(main, targets)
        device = main["pred_logits"].device
        num_boxes = self.num_boxes(targets, device, sync=sync_num_boxes)
        layers = list(outputs.get("aux_outputs", ()) or ())
        pre, interm = outputs.get("pre_outputs"), outputs.get("interm_outputs")
        own = [self.matcher(main, targets)] + [self.matcher(layer, targets) for layer in layers]
        own_pre = self.matcher(pre, targets) if pre is not None else None
        own_interm = self.matcher(interm, targets) if interm is not None else None
        union, union_boxes = None, num_boxes
        if self.union_matching and layers:
            union = union_matching([*own, *(m for m in (own_pre, own_interm) if m is not None)])
            union_boxes = _mean_count(sum(len(q) for q, _ in union), device, sync_num_boxes)
        self._balance = None

        terms: dict[str, Tensor] = {}
        weighted: list[Tensor] = []

        def add(group: dict[str, Tensor], suffix: str) -> None:
            for key, value in group.items():
                terms[key + suffix] = value
                weight = self.weight_dict.get(key + suffix, self.weight_dict.get(key, 0.0))
                if weight:
                    weighted.append(weight * value)

        def supervise(out: Mapping, matched: Indices, suffix: str, teacher: Mapping | None = None, log: bool = False) -> None:
            self._check(out, targets)
            boxes_idx, boxes_n = (union, union_boxes) if union is not None else (matched, num_boxes)
            add(self.loss_labels(out, targets, matched, num_boxes, log=log), suffix)
            add(self.loss_boxes(out, targets, boxes_idx, boxes_n), suffix)
            if "pred_corners" in out:
                add(self.loss_distribution(out, targets, boxes_idx, boxes_n, teacher), suffix)

        supervise(main, own[0], "", log=True)
        if "cardinality" in self.losses:
            add(self.loss_cardinality(main, targets, own[0], num_boxes), "")
        for i, layer in enumerate(layers):
            supervise(layer, own[i + 1], f"_{i}", teacher=main)
        if pre is not None:
            supervise(pre, own_pre, "_pre")
        if interm is not None:
            supervise(interm, own_interm, "_interm")
        if outputs.get("dn_meta") is not None:
            self._add_denoising(outputs["dn_outputs"], outputs["dn_meta"], targets, num_boxes, add)
        terms["loss"] = torch.stack(weighted).sum() if weighted else main["pred_logits"].float().sum() * 0.0
        return terms

    def _add_denoising(self, dn: Mapping, meta, targets, num_boxes: float, add) -> None:
        """The denoising queries' terms: their fixed assignment, normalised by ``num_boxes * groups``."""
        layers = [*(dn.get("aux_outputs", ()) or ()), dn]
        if meta.pad_size == 0:
            zero = dn["pred_logits"].float().sum() * 0.0
            for i in range(len(layers)):
                add({name: zero for name in _DN_TERMS}, "" if i == len(layers) - 1 else f"_{i}")
            return
        indices = denoising_match_indices(meta)
        n = num_boxes * meta.num_groups
        for i, layer in enumerate(layers):
            last = i == len(layers) - 1
            suffix = "_dn" if last else f"_dn_{i}"
            add(self.loss_labels(layer, targets, indices, n, log=False), suffix)
            add(self.loss_boxes(layer, targets, indices, n), suffix)
            if "pred_corners" in layer:
                add(self.loss_distribution(layer, targets, indices, n, None if last else dn, denoising=True), suffix)
        if dn.get("pre_outputs") is not None:
            add(self.loss_labels(dn["pre_outputs"], targets, indices, n, log=False), "_dn_pre")
            add(self.loss_boxes(dn["pre_outputs"], targets, indices, n), "_dn_pre")
