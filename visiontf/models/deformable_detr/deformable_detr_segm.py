"""DETR's mask head on the Deformable DETR / DINO family: instance and panoptic masks from the decoder's queries
and the multi-scale encoder memory. Not a published model: no checkpoint has this layout.

As in DETR (:mod:`visiontf.models.detr.detr_segm`), each query of the last decoder layer (after DINO's decoder
norm, what the class and box heads read) gets a multi-head attention map over the coarsest backbone level
of the memory (stride 32), and :class:`~visiontf.models.detr.mask_head.MaskHeadSmallConv` refines it through
finer maps: here the encoder memory's stride-16 and stride-8 levels, which already mix every level, then a
small stride-4 convolutional stem on the image (the detector's backbone gives no stride-4 map). Denoising
queries get no masks. The detector is unchanged, so a detector checkpoint loads and the head starts from
its initialisation (``freeze_detector`` trains it alone).

Two departures from DETR's attention maps, chosen by ``attention_maps`` (``"detr"`` keeps the original's):
each head's map peaks at 1 instead of sharing one softmax with the other heads, and (``"box"``, the
default) the scores get the query's predicted box as a soft prior, so that the maps say from the first step
which object a query draws. With the original's maps, a head trained from scratch on the CPU recipe
predicted the same mask for every query (``docs/segmentation.md``).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from visiontf.models._registry import register_model
from visiontf.models.contract import ModelCfg
from visiontf.models.deformable_detr.build import create_deformable
from visiontf.models.deformable_detr.deformable_detr import DeformableDETR
from visiontf.models.deformable_detr.dino import DEFAULT_CFGS as DINO_CFGS
from visiontf.models.deformable_detr.dino_convert import convert_state_dict as dino_convert
from visiontf.models.detr.mask_head import MaskHeadSmallConv, MHAttentionMap
from visiontf.models.mask_options import MaskOptions
from visiontf.models.matched_masks import MASK_LOGITS_OF, MatchedMaskLogits, TrainMasks, check_train_masks

#: the mask head's tensors (everything else is the detector's)
MASK_HEAD_PREFIXES = ("bbox_attention.", "mask_head.", "mask_stem.")

AttentionMaps = Literal["detr", "peak", "box"]


def box_log_prior(boxes: Tensor, size: tuple[int, int], valid_ratios: Tensor) -> Tensor:
    """(B, Q, h, w) log of a soft indicator of each box on an (h, w) grid.

    At each cell centre it is the sum of four ``logsigmoid``s of the signed distance to an edge, in cells:
    about 0 deep inside a box, -0.7 on an edge, and falling by about one a cell outside.

    Args:
        boxes: (B, Q, 4) normalised (cx, cy, w, h) over the unpadded image (the box head's); not differentiated.
        size: the grid's (h, w).
        valid_ratios: (B, 2) unpadded fraction (w, h) of the grid.
    """
    h, w = size
    boxes = boxes.detach().float()
    cell_x = 1.0 / (w * valid_ratios[:, 0].float())  # (B,) one cell in normalised units
    cell_y = 1.0 / (h * valid_ratios[:, 1].float())
    xs = (torch.arange(w, device=boxes.device) + 0.5)[None] * cell_x[:, None]  # (B, w) cell centres
    ys = (torch.arange(h, device=boxes.device) + 0.5)[None] * cell_y[:, None]

    def along(centres: Tensor, centre: Tensor, extent: Tensor, cell: Tensor) -> Tensor:
        lo, hi = (centre - extent / 2)[..., None], (centre + extent / 2)[..., None]
        pos, cell = centres[:, None], cell[:, None, None]
        return F.logsigmoid((pos - lo) / cell) + F.logsigmoid((hi - pos) / cell)  # (B, Q, n)

    cx, cy, bw, bh = boxes.unbind(-1)
    return along(ys, cy, bh, cell_y)[..., :, None] + along(xs, cx, bw, cell_x)[..., None, :]


class DeformableDETRSegm(DeformableDETR):
    """Deformable DETR / DINO plus DETR's mask head: ``forward`` adds ``pred_masks`` (B, Q, H/4, W/4).

    Args:
        mask_heads: attention heads of the query-to-memory maps (GroupNorm needs ``hidden_dim + mask_heads``
            divisible by 8).
        stem_channels: channels of the stride-4 stem.
        attention_maps: ``"detr"``: the original's maps (one softmax over every head and position);
            ``"peak"``: each head's map divided by its maximum; ``"box"``: ``"peak"`` with the query's
            predicted box as a soft prior on the scores (:func:`box_log_prior`).
        train_masks: ``"matched"``: a training forward leaves ``mask_logits_of`` for the set loss, which runs
            the head on the matched queries alone (:mod:`visiontf.models.matched_masks`: the same loss at a
            fraction of the cost); ``"all"``: ``pred_masks`` of every query in training too.
        panoptic_threshold: panoptic segments come from the queries whose class score is above it. 0.5, not
            DETR's 0.85: that one is for DETR's softmax, where "no object" takes a share of each query's
            score, and it kept every thing of a sigmoid head out of the segments.
        freeze_detector, mask_threshold, thing_classes, min_area: as :class:`~visiontf.models.detr.detr_segm.DETRSegm`.
        *args, **kwargs: :class:`~visiontf.models.deformable_detr.deformable_detr.DeformableDETR`'s parts and options (three or more feature levels
            from the backbone, strides 8, 16, 32; no query groups).
    """

    def __init__(self, *args, mask_heads: int = 8, stem_channels: int = 32, attention_maps: AttentionMaps = "box",
                 train_masks: TrainMasks = "matched", freeze_detector: bool = False, mask_threshold: float = 0.5,
                 panoptic_threshold: float = 0.5, thing_classes: Sequence[int] | None = None, min_area: int = 4,
                 **kwargs) -> None:
        super().__init__(*args, **kwargs)
        strides = list(self.backbone.strides)
        if strides[-3:] != [8, 16, 32]:
            raise ValueError(f"the mask head reads the backbone levels of strides 8, 16, 32; this backbone gives {strides}")
        if self.dino_options.num_query_groups > 1:
            raise ValueError("the mask head does not support query groups (num_query_groups > 1)")
        if attention_maps not in ("detr", "peak", "box"):
            raise ValueError(f"attention_maps must be 'detr', 'peak' or 'box', got {attention_maps!r}")
        self.attention_maps = attention_maps
        self.train_masks = check_train_masks(train_masks)
        self.freeze_detector = freeze_detector
        if freeze_detector:
            for p in self.parameters():
                p.requires_grad_(False)
        hidden = self.transformer.level_embed.shape[1]
        # the levels of strides 32, 16, 8 in the memory (finest first)
        self._mask_levels = [len(strides) - 1, len(strides) - 2, len(strides) - 3]
        self.mask_stem = nn.Sequential(
            nn.Conv2d(3, stem_channels, 3, stride=2, padding=1), nn.GroupNorm(8, stem_channels), nn.ReLU(),
            nn.Conv2d(stem_channels, stem_channels, 3, stride=2, padding=1), nn.GroupNorm(8, stem_channels), nn.ReLU(),
        )
        self.bbox_attention = MHAttentionMap(hidden, hidden, mask_heads, dropout=0.0, peak_normalised=attention_maps != "detr")
        self.mask_head = MaskHeadSmallConv(hidden + mask_heads, [hidden, hidden, stem_channels], hidden)
        self.mask_options = MaskOptions(mask_threshold, panoptic_threshold,
                                        None if thing_classes is None else tuple(thing_classes), min_area)
        self._seen: dict = {}

    def train(self, mode: bool = True) -> DeformableDETRSegm:
        super().train(mode)
        if self.freeze_detector and mode:
            for name, m in self.named_modules():
                if isinstance(m, nn.modules.batchnorm._BatchNorm) and not name.startswith(MASK_HEAD_PREFIXES):
                    m.eval()
        return self

    # the forward's encoder memory and decoder outputs, kept for the mask head (the detector is unchanged)
    def encode(self, images: Tensor, mask: Tensor | None = None):
        enc = super().encode(images, mask)
        self._seen["enc"] = enc
        return enc

    def decode(self, queries: dict, enc, *args, **kwargs) -> dict:
        dec = super().decode(queries, enc, *args, **kwargs)
        self._seen["dec"] = dec
        return dec

    def forward(self, images: Tensor, mask: Tensor | None = None, targets: Sequence[dict] | None = None,
                need_weights: bool = False) -> dict:
        """The detector's outputs (:meth:`DeformableDETR.forward`) plus ``pred_masks`` (B, Q, H/4, W/4)
        mask logits of its matching queries (not the denoising ones); a training forward with
        ``train_masks="matched"`` gives ``mask_logits_of`` instead."""
        self._seen = {}
        out = super().forward(images, mask, targets, need_weights)
        enc, dec = self._seen.pop("enc"), self._seen.pop("dec")
        pad = out["dn_meta"].pad_size if out.get("dn_meta") is not None else 0
        hidden = dec["hidden"][-1][:, pad:]
        if self.decoder_norm is not None:
            hidden = self.decoder_norm(hidden)
        inputs = self.mask_inputs(images, enc, hidden, out["pred_boxes"])
        if self.training and self.train_masks == "matched":
            out[MASK_LOGITS_OF] = MatchedMaskLogits(self.masks_from, inputs, per_query=("queries", "prior"))
        else:
            out["pred_masks"] = self.masks_from(inputs)
        return out

    def mask_inputs(self, images: Tensor, enc, queries: Tensor, boxes: Tensor) -> dict:
        """What the head reads, per image: ``queries`` (B, Q, C); ``maps``: the memory's levels of strides
        32, 16, 8 (zero on padding) and the stem's stride-4 map; the stride-32 padding mask ``pad``; and ``prior``, the box
        prior of ``boxes`` (B, Q, 4) when ``attention_maps="box"``."""
        B, _, C = enc.memory.shape
        sizes = [h * w for h, w in enc.spatial_shapes]
        memory = enc.memory
        if enc.padding_mask is not None:
            # the memory's padded positions hold whatever the attention core left there (a packed core skips them,
            # the exported graph computes them); the head's convolutions read them beside the image's edge
            memory = memory.masked_fill(enc.padding_mask[..., None], 0.0)
        levels = torch.split(memory, sizes, dim=1)
        maps = [levels[i].transpose(1, 2).reshape(B, C, *enc.spatial_shapes[i]) for i in self._mask_levels]
        coarse = self._mask_levels[0]
        pad = None
        if enc.padding_mask is not None:
            pad = torch.split(enc.padding_mask, sizes, dim=1)[coarse].reshape(B, *enc.spatial_shapes[coarse])
        prior = None
        if self.attention_maps == "box":
            prior = box_log_prior(boxes, enc.spatial_shapes[coarse], enc.valid_ratios[:, coarse]).to(queries.dtype)
        return {"queries": queries, "maps": [*maps, self.mask_stem(images)], "pad": pad, "prior": prior}

    def masks_from(self, inputs: dict) -> Tensor:
        """(B, Q, H/4, W/4) mask logits of every query of :meth:`mask_inputs`."""
        queries, maps = inputs["queries"], inputs["maps"]
        bbox_mask = self.bbox_attention(queries, maps[0], mask=inputs["pad"], bias=inputs["prior"])
        seg = self.mask_head(maps[0], bbox_mask, maps[1:])
        return seg.view(queries.shape[0], queries.shape[1], seg.shape[-2], seg.shape[-1])


def convert_state_dict(state: dict[str, Tensor], model: nn.Module) -> dict[str, Tensor]:
    """The detector's tensors as DINO's converter takes them, and the mask head's: the weights' own, or the
    model's initial ones when the weights are a detector's (logged)."""
    from visiontf.models.detr.convert import log

    head = {k: v for k, v in state.items() if k.startswith(MASK_HEAD_PREFIXES)}
    out = dino_convert({k: v for k, v in state.items() if k not in head}, model)
    if not head:
        own = {k: v for k, v in model.state_dict().items() if k.startswith(MASK_HEAD_PREFIXES)}
        log.warning("the weights have no mask head: %d tensors of %s's mask head start from their initialisation",
                    len(own), type(model).__name__)
        head = own
    return {**out, **head}


DEFAULT_CFGS: dict[str, ModelCfg] = {
    # dino_tiny (the CPU recipe's detector) with the mask head
    "dino_tiny_masks": ModelCfg(dict(DINO_CFGS["dino_tiny"].kwargs)),
}


#: the registry-wide test's settings: dino_tiny's backbone, 8 heads of 16 dims (the mask head's GroupNorm(8) takes
#: hidden_dim + heads, and hidden_dim halved four times: hidden_dim a multiple of 128), 1 + 2 layers, 5 queries
_TEST = dict(test_kwargs=dict(arch=dict(hidden_dim=128, nheads=8, enc_layers=1, dec_layers=2, dim_feedforward=32, num_queries=5),
                              postprocess=dict(num_top=5), dino=dict(num_denoising=4)), test_image_size=(64, 64))


@register_model(tags=("detection", "dino"), filter_fn=convert_state_dict, **_TEST)
def dino_tiny_masks(**kwargs) -> DeformableDETRSegm:
    """``dino_tiny`` with DETR's mask head over its multi-scale memory (instance masks; panoptic with ``thing_classes``)."""
    return create_deformable(DeformableDETRSegm, DEFAULT_CFGS["dino_tiny_masks"], **kwargs)
