"""Contrastive denoising queries (DN-DETR, Li et al. 2022; DINO, Zhang et al. 2023).

During training the decoder gets, besides its ``Q`` matching queries, ``Q_dn`` extra queries built
from noised copies of the ground truth. Their assignment to targets is known, so they are
supervised without Hungarian matching; this stabilises matching early in training and teaches
the decoder to refine boxes. DINO's *contrastive* version adds, for every positive copy, a
negative copy noised harder, which has to be classified as "no object".

Sources: DINO's ``models/dino/dn_components.py`` (``prepare_for_cdn``, ``dn_post_process``) and
the denoising branch of ``SetCriterion.forward`` in ``models/dino/dino.py``; RT-DETR's
``src/zoo/rtdetr/denoising.py`` (device-agnostic). Behaviour follows DINO; the code is our own,
vectorised and free of ``.cuda()``.

Layout of the ``Q_dn`` denoising queries (the same for every image of the batch)::

    n_max  = largest number of boxes of one image in the batch
    G      = num_denoising // n_max groups (at least 1)
    group g occupies queries [g * 2 n_max, (g + 1) * 2 n_max):
        first n_max:  positives (image i's box j at offset j; offsets >= n_i are padding)
        last  n_max:  negatives (same boxes, noised harder)
    Q_dn   = 2 * n_max * G  (the "pad size" of DINO)

``num_denoising`` counts the positive slots, as DINO's ``dn_number`` and RT-DETR's
``num_denoising`` do (both default 100): with the negatives a batch gets up to
``2 * num_denoising`` denoising queries, exactly as in those codes.

Noise (DINO's, with box noise scale ``lambda`` = ``box_noise_scale``):

* boxes: each corner of the xyxy box moves by ``s * u * lambda * (w/2, h/2)`` per coordinate,
  ``s`` a random sign, ``u ~ U[0, 1)`` for positives and ``u ~ U[1, 2)`` for negatives; corners
  are clamped to [0, 1]; the result is returned in inverse-sigmoid space.
* labels: each copy's label is replaced, with probability ``label_noise_ratio * 0.5``, by a
  class drawn uniformly from ``[0, num_classes)`` (which can be the original class).

Padding slots get the label ``num_classes`` and the reference box 0 (sigmoid: a centred box of
half the image), as DINO. The model's label embedding should therefore be
``nn.Embedding(num_classes + 1, d, padding_idx=num_classes)``: row ``num_classes`` is the zero
vector DINO feeds for padding, and receives no gradient.

RT-DETR (``src/zoo/rtdetr/denoising.py`` of lyuwenyu/RT-DETR, v1 and v2) builds the same groups with the
same noise; two of its constants differ, and are options here (``inverse_sigmoid_eps``, ``pad_box``):
its inverse sigmoid clamps at 1e-5, and its padding slots hold the all-zero box (x, y, w, h all 0, which
the clamp maps to about -11.5 in inverse-sigmoid space) rather than DINO's centred one. Its box noise
scale is 1.0 (DINO 0.4). D-FINE (Peterande/D-FINE ``src/zoo/dfine/denoising.py``) adds one step, an option here
(``flip_negative_sizes``): a noised box whose corners crossed (x2 < x1 after the noise) has a negative width, which
it makes positive (the absolute value) before the inverse sigmoid, where RT-DETR's clamp turns it into a box of no
width.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor
from torchvision.ops import box_convert

logger = logging.getLogger(__name__)

#: DINO's ``inverse_sigmoid`` clamps at 1e-3 (util/misc.py).
INVERSE_SIGMOID_EPS = 1e-3

# "more boxes than denoising queries" is logged once per process, not at every step
_logged_oversize = False


@dataclass(frozen=True)
class DenoisingMeta:
    """What is needed to split the decoder outputs and to compute the denoising losses.

    Attributes:
        pad_size: ``Q_dn``, number of denoising queries placed before the matching queries.
        num_groups: ``G``; the denoising box losses are normalised by ``num_boxes * G`` (DINO).
        group_size: ``2 * n_max`` queries per group (positives then negatives).
        num_queries: ``Q``, the matching queries that follow the denoising ones.
        positive_idx: per image, int64 ``(n_i * G,)`` indices in ``[0, Q_dn)`` of its positive
            queries, group-major (group 0's boxes 0..n_i-1, then group 1's ...).
        target_idx: per image, int64 ``(n_i * G,)`` index of the target box each positive
            query reconstructs (``arange(n_i)`` repeated G times).
        valid: bool ``(B, Q_dn)``, False on padding slots.
        negative: bool ``(Q_dn,)``, True on the negative slots (same for every image).
    """

    pad_size: int
    num_groups: int
    group_size: int
    num_queries: int
    positive_idx: tuple[Tensor, ...]
    target_idx: tuple[Tensor, ...]
    valid: Tensor
    negative: Tensor


class DenoisingQueries(NamedTuple):
    """Output of :func:`build_contrastive_denoising` (unpacks as a 4-tuple).

    Attributes:
        labels: int64 ``(B, Q_dn)`` noised class ids for the model's label embedding;
            ``num_classes`` on padding slots.
        boxes_unact: float32 ``(B, Q_dn, 4)`` noised reference boxes (normalised cxcywh) in
            inverse-sigmoid space, i.e. the decoder's unactivated reference points.
        attn_mask: bool ``(Q_dn + Q, Q_dn + Q)`` for the decoder self-attention, **True =
            blocked** (``nn.MultiheadAttention``'s bool convention; for
            ``F.scaled_dot_product_attention``, whose bool mask means *allowed*, pass
            ``~attn_mask``). Queries are ordered denoising first, then matching.
        meta: :class:`DenoisingMeta`.
    """

    labels: Tensor
    boxes_unact: Tensor
    attn_mask: Tensor
    meta: DenoisingMeta


def _inverse_sigmoid(x: Tensor, eps: float = INVERSE_SIGMOID_EPS) -> Tensor:
    x = x.clamp(0, 1)
    return torch.log(x.clamp(min=eps) / (1 - x).clamp(min=eps))


def denoising_attn_mask(pad_size: int, group_size: int, num_queries: int, device=None) -> Tensor:
    """Bool ``(pad_size + num_queries,)*2`` self-attention mask, True = blocked.

    Matching queries (the last ``num_queries``) cannot see any denoising query (they would read
    the answer); a denoising query sees its own group and the matching queries only.
    """
    total = pad_size + num_queries
    mask = torch.zeros(total, total, dtype=torch.bool, device=device)
    if pad_size == 0:
        return mask
    group = torch.arange(pad_size, device=device) // group_size
    mask[:pad_size, :pad_size] = group[:, None] != group[None, :]
    mask[pad_size:, :pad_size] = True
    return mask


def _rand(shape, generator: torch.Generator | None, device) -> Tensor:
    # draw on the generator's device (a CPU generator cannot fill a CUDA tensor), then move
    gen_device = generator.device if generator is not None else device
    return torch.rand(shape, generator=generator, device=gen_device).to(device)


def _randint(high: int, shape, generator: torch.Generator | None, device) -> Tensor:
    gen_device = generator.device if generator is not None else device
    return torch.randint(0, high, shape, generator=generator, device=gen_device).to(device)


def _empty(batch_size: int, num_queries: int, device) -> DenoisingQueries:
    """No denoising queries (no image of the batch has a box): zero-length tensors, nothing blocked."""
    empty_idx = tuple(torch.zeros(0, dtype=torch.int64, device=device) for _ in range(batch_size))
    meta = DenoisingMeta(
        pad_size=0, num_groups=0, group_size=0, num_queries=num_queries,
        positive_idx=empty_idx, target_idx=empty_idx,
        valid=torch.zeros(batch_size, 0, dtype=torch.bool, device=device),
        negative=torch.zeros(0, dtype=torch.bool, device=device),
    )
    return DenoisingQueries(
        labels=torch.zeros(batch_size, 0, dtype=torch.int64, device=device),
        boxes_unact=torch.zeros(batch_size, 0, 4, dtype=torch.float32, device=device),
        attn_mask=denoising_attn_mask(0, 0, num_queries, device),
        meta=meta,
    )


def _check_targets(targets: Sequence[Mapping[str, Tensor]]) -> None:
    for i, t in enumerate(targets):
        if "labels" not in t or "boxes" not in t:
            raise KeyError(f"denoising: target {i} needs 'labels' and 'boxes', got keys {sorted(t)}")
        n, m = len(t["labels"]), t["boxes"].reshape(-1, 4).shape[0]
        if m != n:
            raise ValueError(f"denoising: target {i} has {n} labels but {m} boxes")


def _check_labels(labels: Tensor, num_classes: int) -> None:
    low, high = torch.aminmax(labels)  # one device sync for the whole batch
    if int(low) < 0 or int(high) >= num_classes:
        raise ValueError(
            f"denoising: target labels span [{int(low)}, {int(high)}], outside [0, {num_classes}); "
            "build the model with num_classes = max label + 1"
        )


# bookkeeping whose every size follows the batch's box counts: under torch.compile(model) it runs eagerly (a traced
# copy would recompile for each new count, and torch 2.14 could neither trace torch.rand(generator=None) at such a
# size nor lower the index arithmetic's reshape)
@torch.compiler.disable
def build_contrastive_denoising(
    targets: Sequence[Mapping[str, Tensor]],
    num_classes: int,
    num_queries: int,
    num_denoising: int = 100,
    label_noise_ratio: float = 0.5,
    box_noise_scale: float = 0.4,
    generator: torch.Generator | None = None,
    inverse_sigmoid_eps: float = INVERSE_SIGMOID_EPS,
    pad_box: str = "centre",
    flip_negative_sizes: bool = False,
) -> DenoisingQueries:
    """Groups of positive and negative noised ground-truth queries (DINO's contrastive denoising).

    Args:
        targets: per image, ``labels`` int64 ``(n_i,)`` in ``[0, num_classes)`` and ``boxes``
            ``(n_i, 4)`` normalised cxcywh. ``n_i`` may be 0.
        num_classes: ``K``; also the padding label id (see the module docstring).
        num_queries: ``Q``, the model's matching queries (they follow the denoising ones).
        num_denoising: budget of positive slots (DINO's ``dn_number``); 0 disables denoising.
        label_noise_ratio: labels are flipped with probability ``label_noise_ratio * 0.5``.
        box_noise_scale: ``lambda``; positives move by ``[0, 1) * lambda``, negatives by
            ``[1, 2) * lambda`` of the half width/height.
        generator: optional ``torch.Generator`` for reproducible noise (tests); its device may
            differ from the targets' (draws are moved).
        inverse_sigmoid_eps: the clamp of the inverse sigmoid of the noised boxes (DINO 1e-3, RT-DETR 1e-5).
        pad_box: the reference of padding slots: ``"centre"`` (DINO: 0 in inverse-sigmoid space, a centred box
            of half the image) or ``"zero"`` (RT-DETR: the all-zero box, clamped).
        flip_negative_sizes: a noised box of negative width or height (crossed corners) gets its absolute value
            (D-FINE); False leaves it to the inverse sigmoid's clamp (DINO, RT-DETR).

    Returns:
        :class:`DenoisingQueries` on the targets' device. When no image has a box (or
        ``num_denoising`` is 0) ``Q_dn`` is 0: zero-length tensors, ``meta.num_groups`` 0.

    When the largest image has more boxes than ``num_denoising``, one group holding all of them
    is used (so ``Q_dn = 2 n_max > 2 num_denoising``); this is logged once per process.
    """
    global _logged_oversize
    if num_classes < 1:
        raise ValueError(f"denoising: num_classes must be >= 1, got {num_classes}")
    if num_denoising < 0 or num_queries < 0:
        raise ValueError(f"denoising: num_denoising ({num_denoising}) and num_queries ({num_queries}) must be >= 0")
    if not 0 <= label_noise_ratio <= 1 or box_noise_scale < 0:
        raise ValueError(
            f"denoising: label_noise_ratio must be in [0, 1] and box_noise_scale >= 0, "
            f"got {label_noise_ratio} and {box_noise_scale}"
        )
    if pad_box not in ("centre", "zero"):
        raise ValueError(f"denoising: pad_box must be 'centre' (DINO) or 'zero' (RT-DETR), got {pad_box!r}")
    if len(targets) == 0:
        raise ValueError("denoising: got an empty list of targets (one dict per image is expected)")
    _check_targets(targets)
    device = targets[0]["labels"].device
    batch_size = len(targets)
    counts = [len(t["labels"]) for t in targets]
    n_max = max(counts)
    if n_max == 0 or num_denoising == 0:
        return _empty(batch_size, num_queries, device)

    num_groups = num_denoising // n_max
    if num_groups == 0:
        num_groups = 1
        if not _logged_oversize:
            logger.warning(
                "denoising: an image has %d boxes, more than num_denoising=%d; using one denoising group "
                "of %d queries for such batches (logged once)", n_max, num_denoising, 2 * n_max,
            )
            _logged_oversize = True
    group_size = 2 * n_max
    pad_size = num_groups * group_size
    blocks = 2 * num_groups  # alternating positive / negative blocks of n_max slots

    labels = torch.cat([t["labels"].reshape(-1) for t in targets]).to(device=device, dtype=torch.int64)
    boxes = torch.cat([t["boxes"].reshape(-1, 4) for t in targets]).to(device=device, dtype=torch.float32)
    _check_labels(labels, num_classes)
    count_t = torch.as_tensor(counts, device=device)
    image = torch.repeat_interleave(torch.arange(batch_size, device=device), count_t)  # (N,)
    starts = torch.cumsum(count_t, 0) - count_t
    within = torch.arange(len(labels), device=device) - starts[image]  # box index inside its image
    n = len(labels)

    # every box copied once per block, block-major: copy r = block * N + box
    block = torch.arange(blocks, device=device).repeat_interleave(n)
    is_negative = (block % 2) == 1
    copy_labels = labels.repeat(blocks)
    copy_boxes = boxes.repeat(blocks, 1)
    copy_image = image.repeat(blocks)
    copy_slot = block * n_max + within.repeat(blocks)

    if label_noise_ratio > 0:
        flip = _rand((blocks * n,), generator, device) < label_noise_ratio * 0.5
        new = _randint(num_classes, (blocks * n,), generator, device)
        copy_labels = torch.where(flip, new, copy_labels)
    if box_noise_scale > 0:
        xyxy = box_convert(copy_boxes, "cxcywh", "xyxy")
        half_wh = copy_boxes[:, 2:].repeat(1, 2) * 0.5  # (w/2, h/2, w/2, h/2)
        sign = _randint(2, (blocks * n, 4), generator, device).to(torch.float32) * 2 - 1
        magnitude = _rand((blocks * n, 4), generator, device) + is_negative[:, None].to(torch.float32)
        xyxy = (xyxy + sign * magnitude * half_wh * box_noise_scale).clamp(0, 1)
        copy_boxes = box_convert(xyxy, "xyxy", "cxcywh")
        if flip_negative_sizes:
            copy_boxes = copy_boxes.abs()  # centres are >= 0 already: only crossed corners' sizes change

    out_labels = torch.full((batch_size, pad_size), num_classes, dtype=torch.int64, device=device)
    out_boxes = torch.zeros(batch_size, pad_size, 4, dtype=torch.float32, device=device)
    if pad_box == "zero":
        out_boxes = _inverse_sigmoid(out_boxes, inverse_sigmoid_eps)
    valid = torch.zeros(batch_size, pad_size, dtype=torch.bool, device=device)
    out_labels[copy_image, copy_slot] = copy_labels
    out_boxes[copy_image, copy_slot] = _inverse_sigmoid(copy_boxes, inverse_sigmoid_eps)
    valid[copy_image, copy_slot] = True
    negative = ((torch.arange(pad_size, device=device) // n_max) % 2) == 1

    group_offsets = torch.arange(num_groups, device=device)[:, None] * group_size
    positive_idx, target_idx = [], []
    for count in counts:
        j = torch.arange(count, device=device)
        positive_idx.append((group_offsets + j[None, :]).reshape(-1))
        target_idx.append(j.repeat(num_groups))
    meta = DenoisingMeta(
        pad_size=pad_size, num_groups=num_groups, group_size=group_size, num_queries=num_queries,
        positive_idx=tuple(positive_idx), target_idx=tuple(target_idx), valid=valid, negative=negative,
    )
    attn_mask = denoising_attn_mask(pad_size, group_size, num_queries, device)
    return DenoisingQueries(out_labels, out_boxes, attn_mask, meta)


@dataclass(frozen=True)
class ContrastiveDenoising:
    """DINO's denoising query generator, a part injected into
    :class:`~visiontf.models.deformable_detr.deformable_detr.DeformableDETR` (``denoising=``): called in training with the
    batch's targets, it gives the queries of :func:`build_contrastive_denoising` at these settings.

    Args:
        num_denoising: positive slots per batch (DINO's ``dn_number``, > 0).
        label_noise_ratio, box_noise_scale: DINO's 0.5 and 0.4.
        inverse_sigmoid_eps, pad_box: DINO's 1e-3 and centred padding boxes; RT-DETR's 1e-5 and ``"zero"``
            (see the module docstring).
        flip_negative_sizes: D-FINE's absolute value of crossed boxes' sizes.
    """

    num_denoising: int = 100
    label_noise_ratio: float = 0.5
    box_noise_scale: float = 0.4
    inverse_sigmoid_eps: float = INVERSE_SIGMOID_EPS
    pad_box: str = "centre"
    flip_negative_sizes: bool = False

    def __post_init__(self) -> None:
        if self.num_denoising < 1:
            raise ValueError(f"ContrastiveDenoising: num_denoising must be >= 1 (no denoising: pass denoising=None), got {self.num_denoising}")

    def __call__(self, targets: Sequence[Mapping[str, Tensor]], num_classes: int, num_queries: int) -> DenoisingQueries:
        return build_contrastive_denoising(targets, num_classes, num_queries, self.num_denoising, self.label_noise_ratio,
                                           self.box_noise_scale, inverse_sigmoid_eps=self.inverse_sigmoid_eps,
                                           pad_box=self.pad_box, flip_negative_sizes=self.flip_negative_sizes)


def denoising_match_indices(meta: DenoisingMeta) -> list[tuple[Tensor, Tensor]]:
    """The fixed assignment of the denoising loss, in a Hungarian matcher's form.

    Returns, per image, ``(query_idx, target_idx)`` int64 tensors (on the targets' device) with
    ``query_idx`` in ``[0, Q_dn)`` of the *denoising* outputs (see
    :func:`split_denoising_outputs`). Only positives are assigned: negatives and padding are
    supervised as "no object" by the classification loss, as in DINO.
    """
    return [(q, t) for q, t in zip(meta.positive_idx, meta.target_idx)]


def _split(outputs: Mapping[str, object], pad_size: int, total: int, where: str) -> tuple[dict, dict]:
    dn: dict[str, object] = {}
    match: dict[str, object] = {}
    for key, value in outputs.items():
        if key == "aux_outputs" and value is not None:
            pairs = [_split(aux, pad_size, total, f"{where}aux_outputs[{i}].") for i, aux in enumerate(value)]
            dn[key] = [p[0] for p in pairs]
            match[key] = [p[1] for p in pairs]
        elif isinstance(value, Tensor) and value.dim() >= 2 and value.shape[1] == total:
            dn[key] = value[:, :pad_size]
            match[key] = value[:, pad_size:]
        elif key in ("pred_logits", "pred_boxes"):
            raise ValueError(
                f"split_denoising_outputs: {where}{key} has shape {tuple(value.shape)}; expected "
                f"(B, {total}, ...) = {pad_size} denoising + {total - pad_size} matching queries. Was the "
                "decoder run with this batch's denoising queries?"
            )
        else:  # encoder proposals and anything not per decoder query belong to matching only
            match[key] = value
    return dn, match


def split_denoising_outputs(outputs: Mapping[str, object], meta: DenoisingMeta) -> tuple[dict, dict]:
    """Split a decoder output dict into its denoising part and its matching part.

    Every tensor whose dim 1 has size ``Q_dn + Q`` (``pred_logits`` ``(B, Q_dn + Q, K)``,
    ``pred_boxes`` ``(B, Q_dn + Q, 4)``, and any other per-query output) is cut at ``Q_dn``;
    ``aux_outputs`` are split element-wise. Other entries (``enc_outputs``...) go to the
    matching part only.

    Returns:
        ``(dn_outputs, match_outputs)``. With ``Q_dn == 0`` the denoising tensors are empty
        ``(B, 0, ...)``, so a criterion computes zero denoising losses without a special case.
    """
    total = meta.pad_size + meta.num_queries
    return _split(outputs, meta.pad_size, total, "")


__all__ = [
    "ContrastiveDenoising",
    "DenoisingMeta",
    "DenoisingQueries",
    "build_contrastive_denoising",
    "denoising_attn_mask",
    "denoising_match_indices",
    "split_denoising_outputs",
]
