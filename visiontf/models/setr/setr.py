"""SETR: a plain ViT encoder with the Naive, PUP or MLA decoder (Zheng et al., CVPR 2021), exact to
mmsegmentation 1.x, so its published checkpoints load (:mod:`visiontf.models.setr.convert`) and give
its logits.

The ViT-L/16 variants build mmseg's ``setr_vit-l_{naive,pup,mla}`` configs module for module:

* Encoder: mmseg's ``VisionTransformer`` (24 pre-norm layers, 1024 dims, 16 heads, LayerNorm eps 1e-6,
  no final norm, no patch-embedding bias) held as a visiontf :class:`~visiontf.models.vit.vit.VisionTransformer`
  in timm's layout. Inputs are zero-padded bottom/right to a multiple of the patch (mmseg's
  ``padding="corner"``); ``pos_embed`` is resized bilinearly to other grids (``interpolate_mode``).
  Blocks ``out_indices`` are tapped; MLA drops the class token before the first block
  (``with_cls_token=False``), Naive/PUP keep it in attention and drop it from the taps.
* Naive: decode head on block 24 = LN, 1x1 conv 1024->256 + BN + ReLU, x4, 1x1 classifier.
  PUP: LN, 4 x (3x3 conv 256 + BN + ReLU, x2), 1x1 classifier.
  MLA: LN per tap (blocks 6/12/18/24), 1x1 conv -> 256, top-down sums, 3x3 conv; per level
  2 x (3x3 conv -> 128 + BN + ReLU), x4; concat 512 -> 1x1 classifier.
* Every head's logits are resized bilinearly to the input size (``align_corners=False``).
* Auxiliary heads (training only, loss weight 0.4) on blocks 10/15/20 (Naive, PUP) or on the four MLA
  outputs (a 1x1 classifier each).

ADE20K (512 crop, 150 classes) and Cityscapes (768 crop, 19 classes) configs differ as follows; the
``_cityscapes`` names build the latter:

==========  ======================================  =======================================
decoder     ADE20K 512 auxiliary heads              Cityscapes 768 auxiliary heads
==========  ======================================  =======================================
Naive       3 x (2 x (1x1 conv, x4)), 16x in all    3 x (1 x (1x1 conv, x4)), 4x
PUP         3 x (2 x (3x3 conv, x4))                the same
MLA         4 x 1x1 classifier                      the same
==========  ======================================  =======================================

Beyond the heads they differ in crop (``pos_embed`` 32x32 vs 48x48 grid), class count, and the test
protocol in ``pretrained_cfg``: slide windows 512/341 on images resized to (2048, 512) keep-ratio
(ADE20K) vs 768/512 on (2049, 1025) (Cityscapes, mmseg's ``cityscapes_768x768`` scale).

Parameter counts (``sum(p.numel() for p in model.parameters())``, auxiliary heads included), equal
to mmseg 1.2.2's for the same configs (``tests/models/setr/test_setr_mmseg.py`` checks them key for key):

==========  ==================  ==================
decoder     ADE20K 512, 150     Cityscapes 768, 19
==========  ==================  ==================
Naive       305,557,592         306,535,500
PUP         317,290,072         318,466,124
MLA         309,569,262         310,678,111
==========  ==================  ==================

Two deliberate differences from mmseg's code, neither changing a logit of its configs: ``pos_embed``
is resized whenever the token grid differs from the crop's (mmseg resizes only when the token
*count* differs), and a patch-embedding bias in a checkpoint (mmseg 0.x trained one; 1.x has none
and drops it on load) is folded into ``pos_embed`` on load, which is exact.

:class:`SETR` takes these parts; :func:`~visiontf.models.setr.build.build_setr` makes them from the ``encoder``,
``decode_head`` and ``aux_heads`` sections, and each variant below is its sections (``DEFAULT_CFGS``).

The ``base`` and ``tiny`` variants scale the ADE20K recipe down to 12 blocks (taps at 3/6/9/12) and
keep the patch-embedding bias of timm's ViT weights; PUP keeps an auxiliary head on every tap.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from torch import Tensor, nn

from visiontf.io.weights import load_state_dict_file
from visiontf.models._registry import load_pretrained, register_model
from visiontf.models.backbones.backbone import Backbone
from visiontf.models.contract import ModelCfg, PretrainedCfg, Segmenter
from visiontf.models.setr.build import SETR_SECTIONS, build_setr, default_out_indices
from visiontf.models.setr.convert import convert_state_dict, encoder_state_from_vit, resize_pos_embed

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_CFGS", "SETR", "default_out_indices"]


class SETR(Segmenter):
    """SEgmentation TRansformer. ``forward(images (B, 3, H, W))`` -> logits (B, K, H, W) at the input size.

    It takes its parts, made by :func:`~visiontf.models.setr.build.build_setr` from the config's sections (or by
    hand), as torchvision's ``FCOS(backbone, ...)``. In training mode it returns ``{"out": logits, "aux":
    [logits, ...]}`` (every map at the input size); ``aux_weight`` is kept for the task's loss. Eval-mode
    ``forward`` is mmseg's ``encode_decode``; :meth:`inference` adds its whole / sliding-window test modes.

    Args:
        encoder: mmseg's ViT encoder (a visiontf :class:`~visiontf.models.vit.vit.VisionTransformer` without its
            final norm, read block by block), or any :class:`~visiontf.models.backbones.backbone.Backbone` (its maps).
        decode_head: the Naive/PUP :class:`~visiontf.models.setr.heads.UpHead` on tap ``in_index``, or, with
            ``neck``, the :class:`~visiontf.models.setr.heads.MLAHead` on the neck's outputs.
        aux_heads: one auxiliary head per entry of ``aux_in_index`` (training only).
        neck: the :class:`~visiontf.models.setr.heads.MLANeck` (SETR-MLA); None for Naive and PUP.
        num_classes: the classes of the heads.
        out_indices: a ViT encoder's tapped blocks (0-based, mmseg's ``out_indices``); ignored for a Backbone,
            whose maps are the taps.
        in_index: the tap the Naive/PUP decode head reads; aux_in_index: the taps (Naive/PUP) or MLA outputs
            the auxiliary heads read.
        with_cls_token: keep the class token in the ViT's attention (mmseg: False for MLA only).
        pos_embed_interp: how ``pos_embed`` is resized to other grids (mmseg's ``interpolate_mode``).
        aux_weight: the auxiliary loss weight; align_corners: of the logits' resize to the input.
        crop_size: the training crop of a Backbone encoder (a ViT's is its ``patch_embed.img_size``).
        new_classifier: let ``create_model(..., pretrained=)`` load a checkpoint with another class count,
            leaving the classifiers at init (fine-tuning); without it that is an error.
        pretrained_cfg: entries that override the inference defaults (``mean``, ``std``, ``test_mode``,
            ``stride``, ``resize``).
    """

    #: keys the registry's loader may leave at init (encoder-only checkpoints) or drop when the class count differs
    head_prefixes = ("decode_head.", "aux_heads.", "neck.")
    #: trained at the base learning rate; the rest get the head multiplier (mmseg's ``custom_keys={'head': ...}``
    #: matches decode_head and auxiliary_head, not the MLA neck)
    backbone_prefixes = ("encoder.", "neck.")

    def __init__(
        self,
        encoder: nn.Module,
        decode_head: nn.Module,
        aux_heads: Sequence[nn.Module] = (),
        neck: nn.Module | None = None,
        *,
        num_classes: int,
        out_indices: Sequence[int] | None = None,
        in_index: int = -1,
        aux_in_index: Sequence[int] = (),
        with_cls_token: bool = True,
        pos_embed_interp: str = "bilinear",
        aux_weight: float = 0.4,
        align_corners: bool = False,
        crop_size: int | Sequence[int] = 512,
        new_classifier: bool = False,
        pretrained_cfg: PretrainedCfg | Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        if num_classes < 1:
            raise ValueError(f"num_classes={num_classes}; a segmentation model needs at least one class")
        self.num_classes = num_classes
        self.aux_weight = aux_weight
        self.align_corners = align_corners
        self.new_classifier = new_classifier
        self.pos_embed_interp = pos_embed_interp
        self.with_cls_token = bool(with_cls_token)
        self.encoder = encoder
        vit = not isinstance(encoder, Backbone)
        if vit:
            if out_indices is None:
                raise ValueError("SETR: a ViT encoder needs out_indices (the blocks the heads read)")
            self.out_indices = tuple(int(i) for i in out_indices)
        else:
            self.out_indices = tuple(range(len(encoder.channels)))
        n = len(self.out_indices)
        self.in_index = int(in_index) % n
        self.aux_in_index = tuple(int(i) % n for i in aux_in_index)
        if len(aux_heads) != len(self.aux_in_index):
            raise ValueError(f"SETR: {len(aux_heads)} auxiliary heads for aux_in_index={self.aux_in_index}; give one head per index")
        self.neck = neck
        self.decode_head = decode_head
        self.aux_heads = aux_heads if isinstance(aux_heads, nn.ModuleList) else nn.ModuleList(aux_heads)
        crop = encoder.patch_embed.img_size if vit else ((crop_size, crop_size) if isinstance(crop_size, int) else tuple(crop_size))
        mean, std = (encoder.pretrained_cfg.mean, encoder.pretrained_cfg.std) if vit else (IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD)
        self.pretrained_cfg = PretrainedCfg(
            input_size=(3, *crop), crop_size=crop, mean=mean, std=std,
            interpolation="bilinear", test_mode="whole",
            # mmseg's SETR configs slide with a stride of 2/3 of the crop (512/341, 768/512)
            stride=tuple(max(1, (2 * c) // 3) for c in crop),
        ).merged(pretrained_cfg)

    # ------------------------------------------------------------------ optimiser knowledge
    def no_weight_decay(self) -> set[str]:
        """timm's ViT set on the encoder: ``encoder.pos_embed`` and ``encoder.cls_token``."""
        return {f"encoder.{n}" for n, _ in self.encoder.named_parameters() if n.split(".")[-1] in ("pos_embed", "cls_token", "dist_token")}

    def param_group(self, name: str) -> str:
        """``"encoder"`` (encoder and MLA neck, base learning rate) or ``"head"`` (decode and auxiliary heads)."""
        return "encoder" if name.startswith(self.backbone_prefixes) else "head"

    # ------------------------------------------------------------------ weights
    def load_encoder(self, path: str | Path) -> None:
        """Initialise the encoder from a timm / visiontf ViT checkpoint (classifier and final norm dropped)."""
        state = load_state_dict_file(path)
        if not any(k.startswith("blocks.") for k in state) and any(k.startswith("encoder.blocks.") for k in state):
            state = {k[len("encoder."):]: v for k, v in state.items() if k.startswith("encoder.")}
        load_pretrained(self.encoder, encoder_state_from_vit(state, self, source=str(path)), strict=True, source=str(path))

    # ------------------------------------------------------------------ forward
    def pos_embed(self, grid: tuple[int, int]) -> Tensor:
        """The encoder's position table for a ``grid`` of patches (class-token row first)."""
        table = self.encoder.pos_embed
        if tuple(grid) == tuple(self.encoder.grid_size):
            return table
        return resize_pos_embed(table, self.encoder.grid_size, grid, self.pos_embed_interp)

    def features(self, images: Tensor, taps: Sequence[int] | None = None) -> dict[int, Tensor]:
        """Tokens of the tapped blocks as (B, C, h, w) maps, keyed by position in ``out_indices``."""
        taps = range(len(self.out_indices)) if taps is None else taps
        if isinstance(self.encoder, Backbone):
            maps = self.encoder.forward_maps(images)
            return {t: maps[t] for t in taps}
        wanted = {self.out_indices[t]: t for t in taps}
        enc = self.encoder
        ph, pw = enc.patch_embed.patch_size
        x = F.pad(images, (0, -images.shape[-1] % pw, 0, -images.shape[-2] % ph))  # mmseg's padding="corner"
        x, grid = enc.patch_embed(x)
        x = torch.cat([enc.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        x = enc.pos_drop(x + self.pos_embed(grid))
        if not self.with_cls_token:
            x = x[:, 1:]
        skip = 1 if self.with_cls_token else 0
        out: dict[int, Tensor] = {}
        for i, block in enumerate(enc.blocks[: max(wanted) + 1]):
            x = block(x)[0]
            if i in wanted:
                out[wanted[i]] = x[:, skip:].transpose(1, 2).reshape(x.shape[0], -1, *grid)
        return out

    def _resize(self, logits: Tensor, size: tuple[int, int]) -> Tensor:
        return F.interpolate(logits, size=size, mode="bilinear", align_corners=self.align_corners)

    def _decode(self, images: Tensor, with_aux: bool) -> tuple[Tensor, list[Tensor]]:
        size = (images.shape[-2], images.shape[-1])
        if self.neck is not None:  # MLA
            feats = self.features(images)
            streams = self.neck([feats[t] for t in range(len(self.out_indices))])
            out = self.decode_head(streams)
            aux = [h(streams[i]) for h, i in zip(self.aux_heads, self.aux_in_index)] if with_aux else []
        else:
            taps = {self.in_index} | (set(self.aux_in_index) if with_aux else set())
            feats = self.features(images, sorted(taps))
            out = self.decode_head(feats[self.in_index])
            aux = [h(feats[i]) for h, i in zip(self.aux_heads, self.aux_in_index)] if with_aux else []
        return self._resize(out, size), [self._resize(a, size) for a in aux]

    def forward(self, images: Tensor) -> Tensor | dict[str, Tensor | list[Tensor]]:
        if self.training:
            out, aux = self._decode(images, with_aux=True)
            return {"out": out, "aux": aux}
        return self._decode(images, with_aux=False)[0]

    # ------------------------------------------------------------------ inference
    def whole_inference(self, images: Tensor) -> Tensor:
        """mmseg's ``whole_inference`` / ``encode_decode``: main-head logits (B, K, H, W) of the whole image."""
        return self._decode(images, with_aux=False)[0]

    def slide_inference(self, images: Tensor, crop: int | Sequence[int] = 512, stride: int | Sequence[int] = 341) -> Tensor:
        """mmseg's ``slide_inference``: windows every ``stride`` pixels, the last one shifted back to end at
        the border; logits summed and divided by the per-pixel window count (``count_mat``).

        A side shorter than ``crop`` gets one window of the image's own length (no padding), as mmseg.
        """
        ch, cw = (crop, crop) if isinstance(crop, int) else (int(crop[0]), int(crop[1]))
        sh, sw = (stride, stride) if isinstance(stride, int) else (int(stride[0]), int(stride[1]))
        B, _, H, W = images.shape
        rows = max(H - ch + sh - 1, 0) // sh + 1
        cols = max(W - cw + sw - 1, 0) // sw + 1
        logits: Tensor | None = None
        count = images.new_zeros((1, 1, H, W))
        for r in range(rows):
            for c in range(cols):
                y2, x2 = min(r * sh + ch, H), min(c * sw + cw, W)
                y1, x1 = max(y2 - ch, 0), max(x2 - cw, 0)
                window = self.whole_inference(images[:, :, y1:y2, x1:x2])
                if logits is None:
                    logits = images.new_zeros((B, window.shape[1], H, W))
                logits[:, :, y1:y2, x1:x2] += window
                count[:, :, y1:y2, x1:x2] += 1
        assert logits is not None
        return logits / count

    def inference(self, images: Tensor, mode: Literal["whole", "slide"] | None = None,
                  crop: int | Sequence[int] | None = None, stride: int | Sequence[int] | None = None) -> Tensor:
        """Main-head logits at the input size; ``mode``, ``crop`` and ``stride`` default to ``pretrained_cfg``'s
        ``test_mode``, ``crop_size`` and ``stride`` (mmseg's ``test_cfg``)."""
        mode = mode or self.pretrained_cfg.test_mode
        if mode == "whole":
            return self.whole_inference(images)
        if mode != "slide":
            raise ValueError(f"inference mode {mode!r}; use 'whole' or 'slide'")
        if crop is None:
            crop, stride = self.pretrained_cfg.crop_size, stride or self.pretrained_cfg.stride
        elif stride is None:
            c = (crop, crop) if isinstance(crop, int) else tuple(crop)
            stride = tuple(max(1, (2 * x) // 3) for x in c)
        return self.slide_inference(images, crop, stride)


# ---------------------------------------------------------------------------------------- variants
#: mmseg's SegDataPreProcessor for SETR: RGB, ImageNet mean/std (123.675, 116.28, 103.53) / (58.395, 57.12, 57.375)
#: on 0-255, here on 0-1; sliding-window test (stride 2/3 of the crop) on images resized keep-ratio to ``resize`` (long, short)
_ADE20K_TEST = PretrainedCfg(mean=IMAGENET_DEFAULT_MEAN, std=IMAGENET_DEFAULT_STD, test_mode="slide", resize=(2048, 512))
_CITYSCAPES_TEST = PretrainedCfg(mean=IMAGENET_DEFAULT_MEAN, std=IMAGENET_DEFAULT_STD, test_mode="slide", resize=(2049, 1025))
#: each variant is its sections (build_setr's): the parts below, merged field by field in order
_MMSEG_ADE20K = {"num_classes": 150, "encoder": {"img_size": 512}}
_MMSEG_CITYSCAPES = {"num_classes": 19, "encoder": {"img_size": 768}}
#: mmseg's ViT-L/16 backbone of its SETR configs (no patch-embedding bias in 1.x)
_VIT_L = {"encoder": {"name": "vit_large_patch16_384", "kwargs": {"patch_bias": False}}}
_NAIVE = {"encoder": {"out_indices": (9, 14, 19, 23)},
          "decode_head": {"kind": "naive", "in_index": 3, "num_convs": 1, "up_scale": 4, "kernel_size": 1},
          "aux_heads": {"in_index": (0, 1, 2), "up_scale": 4, "kernel_size": 1}}
_PUP = {"encoder": {"out_indices": (9, 14, 19, 23)},
        "decode_head": {"kind": "pup", "in_index": 3, "num_convs": 4, "up_scale": 2, "kernel_size": 3},
        "aux_heads": {"in_index": (0, 1, 2), "num_convs": 2, "up_scale": 4, "kernel_size": 3}}
_MLA = {"encoder": {"out_indices": (5, 11, 17, 23), "with_cls_token": False},
        "decode_head": {"kind": "mla", "channels": 256, "mla_channels": 128, "up_scale": 4},
        "aux_heads": {"in_index": (0, 1, 2, 3)}}
#: the ViT-L recipe at 12 blocks: taps from default_out_indices, PUP with an auxiliary head on every tap
_SMALL_TAPS = {"encoder": {"out_indices": None}}
_SMALL = {"naive": (_NAIVE, _SMALL_TAPS), "pup": (_PUP, _SMALL_TAPS, {"aux_heads": {"in_index": (0, 1, 2, 3)}}),
          "mla": (_MLA, _SMALL_TAPS)}
_VIT_B = ({"num_classes": 150, "encoder": {"name": "vit_base_patch16_384", "img_size": 512}},)
_VIT_TI = ({"num_classes": 150, "encoder": {"name": "vit_tiny_patch16_224", "img_size": 128}},)
_TINY_HEADS = {"decode_head": {"channels": 64, "mla_channels": 32}}


def _sections(*parts: dict[str, Any]) -> dict[str, Any]:
    """A variant's sections: ``parts`` merged in order, section by section and field by field."""
    out: dict[str, Any] = {}
    for part in parts:
        out = SETR_SECTIONS.merge(out, part)
    return out


#: every registered SETR: the sections of :func:`~visiontf.models.setr.build.build_setr` and the variant's test settings
DEFAULT_CFGS: dict[str, ModelCfg] = {
    # mmseg setr_vit-l_{naive,pup,mla}_8xb2-160k_ade20k-512x512
    "setr_naive_vit_large_patch16": ModelCfg(_sections(_VIT_L, _MMSEG_ADE20K, _NAIVE, {"aux_heads": {"num_convs": 2}}),
                                             _ADE20K_TEST),
    "setr_pup_vit_large_patch16": ModelCfg(_sections(_VIT_L, _MMSEG_ADE20K, _PUP), _ADE20K_TEST),
    "setr_mla_vit_large_patch16": ModelCfg(_sections(_VIT_L, _MMSEG_ADE20K, _MLA), _ADE20K_TEST),
    # mmseg setr_vit-l_{naive,pup,mla}_8xb1-80k_cityscapes-768x768
    "setr_naive_vit_large_patch16_cityscapes": ModelCfg(_sections(_VIT_L, _MMSEG_CITYSCAPES, _NAIVE,
                                                                  {"aux_heads": {"num_convs": 1}}), _CITYSCAPES_TEST),
    "setr_pup_vit_large_patch16_cityscapes": ModelCfg(_sections(_VIT_L, _MMSEG_CITYSCAPES, _PUP), _CITYSCAPES_TEST),
    "setr_mla_vit_large_patch16_cityscapes": ModelCfg(_sections(_VIT_L, _MMSEG_CITYSCAPES, _MLA), _CITYSCAPES_TEST),
    # ViT-B/16 (timm weights at 384 px, resampled to the 512 crop)
    "setr_naive_vit_base_patch16": ModelCfg(_sections(*_VIT_B, *_SMALL["naive"])),
    "setr_pup_vit_base_patch16": ModelCfg(_sections(*_VIT_B, *_SMALL["pup"])),
    "setr_mla_vit_base_patch16": ModelCfg(_sections(*_VIT_B, *_SMALL["mla"])),
    # CPU-sized: the real ViT-Ti/16 (so timm's vit_tiny weights load) with narrow heads at 128 px
    "setr_naive_vit_tiny_patch16": ModelCfg(_sections(*_VIT_TI, *_SMALL["naive"], _TINY_HEADS)),
    "setr_pup_vit_tiny_patch16": ModelCfg(_sections(*_VIT_TI, *_SMALL["pup"], _TINY_HEADS)),
    "setr_mla_vit_tiny_patch16": ModelCfg(_sections(*_VIT_TI, *_SMALL["mla"], _TINY_HEADS)),
}
_TAGS = ("segmentation", "setr")


def _test(name: str) -> dict[str, Any]:
    """The registry-wide test's settings of ``name``: its encoder (depth, taps, patch bias kept) at 32 dims on
    64-px images, narrow heads."""
    return dict(test_kwargs=dict(encoder={"img_size": 64, "kwargs": {"embed_dim": 32, "num_heads": 2}},
                                 decode_head={"channels": 16, "mla_channels": 8}), test_image_size=(64, 64))


def _create(name: str, **kwargs: Any) -> SETR:
    return SETR_SECTIONS.create(lambda **kw: build_setr(SETR, **kw), DEFAULT_CFGS[name], **kwargs)


@register_model(tags=_TAGS, filter_fn=convert_state_dict, **_test("setr_naive_vit_large_patch16"))
def setr_naive_vit_large_patch16(**kwargs) -> SETR:
    """SETR-Naive, ViT-L/16, mmseg's ADE20K 512x512 config: 305,557,592 parameters with 150 classes."""
    return _create("setr_naive_vit_large_patch16", **kwargs)


@register_model(tags=_TAGS, filter_fn=convert_state_dict, **_test("setr_pup_vit_large_patch16"))
def setr_pup_vit_large_patch16(**kwargs) -> SETR:
    """SETR-PUP, ViT-L/16, mmseg's ADE20K 512x512 config: 317,290,072 parameters with 150 classes."""
    return _create("setr_pup_vit_large_patch16", **kwargs)


@register_model(tags=_TAGS, filter_fn=convert_state_dict, **_test("setr_mla_vit_large_patch16"))
def setr_mla_vit_large_patch16(**kwargs) -> SETR:
    """SETR-MLA, ViT-L/16, mmseg's ADE20K 512x512 config: 309,569,262 parameters with 150 classes."""
    return _create("setr_mla_vit_large_patch16", **kwargs)


@register_model(tags=_TAGS, filter_fn=convert_state_dict, **_test("setr_naive_vit_large_patch16_cityscapes"))
def setr_naive_vit_large_patch16_cityscapes(**kwargs) -> SETR:
    """SETR-Naive, ViT-L/16, mmseg's Cityscapes 768x768 config (one-conv auxiliary heads): 306,535,500 parameters."""
    return _create("setr_naive_vit_large_patch16_cityscapes", **kwargs)


@register_model(tags=_TAGS, filter_fn=convert_state_dict, **_test("setr_pup_vit_large_patch16_cityscapes"))
def setr_pup_vit_large_patch16_cityscapes(**kwargs) -> SETR:
    """SETR-PUP, ViT-L/16, mmseg's Cityscapes 768x768 config: 318,466,124 parameters with 19 classes."""
    return _create("setr_pup_vit_large_patch16_cityscapes", **kwargs)


@register_model(tags=_TAGS, filter_fn=convert_state_dict, **_test("setr_mla_vit_large_patch16_cityscapes"))
def setr_mla_vit_large_patch16_cityscapes(**kwargs) -> SETR:
    """SETR-MLA, ViT-L/16, mmseg's Cityscapes 768x768 config: 310,678,111 parameters with 19 classes."""
    return _create("setr_mla_vit_large_patch16_cityscapes", **kwargs)


@register_model(tags=_TAGS, filter_fn=convert_state_dict, **_test("setr_naive_vit_base_patch16"))
def setr_naive_vit_base_patch16(**kwargs) -> SETR:
    """SETR-Naive on ViT-B/16 (timm's 384-px weights), 512-px crop."""
    return _create("setr_naive_vit_base_patch16", **kwargs)


@register_model(tags=_TAGS, filter_fn=convert_state_dict, **_test("setr_pup_vit_base_patch16"))
def setr_pup_vit_base_patch16(**kwargs) -> SETR:
    """SETR-PUP on ViT-B/16 (timm's 384-px weights), 512-px crop, an auxiliary head on every tap."""
    return _create("setr_pup_vit_base_patch16", **kwargs)


@register_model(tags=_TAGS, filter_fn=convert_state_dict, **_test("setr_mla_vit_base_patch16"))
def setr_mla_vit_base_patch16(**kwargs) -> SETR:
    """SETR-MLA on ViT-B/16 (timm's 384-px weights), 512-px crop, taps at blocks 3/6/9/12."""
    return _create("setr_mla_vit_base_patch16", **kwargs)


@register_model(tags=_TAGS, filter_fn=convert_state_dict, **_test("setr_naive_vit_tiny_patch16"))
def setr_naive_vit_tiny_patch16(**kwargs) -> SETR:
    """SETR-Naive on ViT-Ti/16 with 64-channel heads, 128-px crop: a CPU-sized model."""
    return _create("setr_naive_vit_tiny_patch16", **kwargs)


@register_model(tags=_TAGS, filter_fn=convert_state_dict, **_test("setr_pup_vit_tiny_patch16"))
def setr_pup_vit_tiny_patch16(**kwargs) -> SETR:
    """SETR-PUP on ViT-Ti/16 with 64-channel heads, 128-px crop: a CPU-sized model."""
    return _create("setr_pup_vit_tiny_patch16", **kwargs)


@register_model(tags=_TAGS, filter_fn=convert_state_dict, **_test("setr_mla_vit_tiny_patch16"))
def setr_mla_vit_tiny_patch16(**kwargs) -> SETR:
    """SETR-MLA on ViT-Ti/16 with 64/32-channel heads, 128-px crop: a CPU-sized model."""
    return _create("setr_mla_vit_tiny_patch16", **kwargs)
