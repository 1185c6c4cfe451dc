"""The backbone a detector (DETR, Deformable DETR, DINO) or SETR receives: one interface, several makers.

A :class:`Backbone` is an ``nn.Module`` that declares what the model built on it reads:

* ``channels`` / ``strides``: of each map it returns, finest first (``num_channels``: the last map's);
* :meth:`Backbone.forward_maps`: images (B, 3, H, W) -> those maps, NCHW;
* :meth:`Backbone.forward_features`: the maps and the padding mask resized to each (nearest, as
  DETR); ``forward`` the last of them (single-scale DETR);
* :meth:`Backbone.param_group` / :meth:`Backbone.layer_depth`: which learning-rate group each of its
  parameters is in (``"backbone"``, or ``"default"`` for a neck trained from scratch) and its depth
  for layer-wise learning-rate decay.

:func:`build_backbone` makes one from a name, the way the detectors' ``backbone=`` argument is read:

==============================================  ============================================================
``backbone=``                                   what is built
==============================================  ============================================================
``"resnet18" | "resnet34" | "resnet50" | ...``  torchvision ResNet, FrozenBN (:class:`~visiontf.models.detr_backbone.DetrBackbone`: the original checkpoints' layout)
``"timm:<name>"``                               any timm model with ``features_only``: CNNs, Swin (NHWC -> NCHW), ViTs (DINOv2 too)
``"vit_small_patch16_224"`` (a visiontf ViT)    visiontf's ViT / DeiT through its ``features_only`` form (stride = the patch)
``"simplefpn:<ViT>"``                           ViTDet's simple feature pyramid on a visiontf or ``timm:`` ViT (:mod:`~visiontf.models.vitdet`)
``"swin_T_224_1k" | "swin_B_384_22k" | ...``    IDEA-Research/DINO's Swin layout (:mod:`~visiontf.models.dino_swin`)
a :class:`Backbone` instance                    used as given (injected)
==============================================  ============================================================
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

#: prefix selecting a timm model, e.g. ``"timm:convnext_tiny"``
TIMM_PREFIX = "timm:"
#: prefix selecting ViTDet's simple feature pyramid on a ViT, e.g. ``"simplefpn:vit_small_patch16_224"``
SIMPLEFPN_PREFIX = "simplefpn:"


def visiontf_vits() -> list[str]:
    """The registered visiontf ViT / DeiT names (what ``backbone="vit_..."`` and ``"simplefpn:vit_..."`` take)."""
    from visiontf.models._registry import list_models

    return list_models("vit_*") + list_models("deit_*")


def resize_mask(mask: Tensor, size: Sequence[int]) -> Tensor:
    """The (B, H, W) padding mask at a map's ``size``: nearest, exactly as the original DETR (no align)."""
    return F.interpolate(mask[None].float(), size=tuple(size)).to(torch.bool)[0]


def pad_to_multiple(x: Tensor, multiple: int, value: float | bool = 0) -> Tensor:
    """``x`` (..., H, W) padded bottom/right to a multiple of ``multiple`` with ``value``."""
    if multiple <= 1:
        return x
    H, W = x.shape[-2:]
    return F.pad(x, (0, -W % multiple, 0, -H % multiple), value=value)


class Backbone(nn.Module):
    """Images -> feature maps, with the channels and strides of each declared (see the module doc).

    Subclasses set ``channels`` and ``strides`` (one entry per returned map, finest first) and
    implement :meth:`forward_maps`.
    """

    channels: list[int]
    strides: list[int]
    #: images are zero-padded bottom/right to a multiple of this before the maps are computed (a patch,
    #: a window grid); the padding mask is padded alike (True), so the padded pixels are padding
    pad_multiple: int = 1

    @property
    def num_channels(self) -> int:
        """Channels of the last (coarsest) map: what single-scale DETR projects."""
        return self.channels[-1]

    def forward_maps(self, images: Tensor) -> list[Tensor]:
        """(B, 3, H, W) -> one (B, C_i, h_i, w_i) map per entry of ``channels``, finest first."""
        raise NotImplementedError

    def forward_features(self, images: Tensor, mask: Tensor) -> tuple[list[Tensor], list[Tensor]]:
        """Every map, and the padding mask (B, H, W, True on padding) resized to each."""
        maps = self.forward_maps(images)
        mask = pad_to_multiple(mask, self.pad_multiple, value=True)
        return maps, [resize_mask(mask, x.shape[-2:]) for x in maps]

    def forward(self, images: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        """images (B, 3, H, W), mask (B, H, W) True on padding -> the last map (B, C, h, w) and its mask."""
        maps, masks = self.forward_features(images, mask)
        return maps[-1], masks[-1]

    def param_group(self, name: str) -> str:
        """The learning-rate group of parameter ``name`` (relative to the backbone): ``"backbone"``."""
        return "backbone"

    def layer_depth(self, name: str) -> tuple[int, int] | None:
        """(layer id, number of layers) of parameter ``name`` for layer-wise lr decay (ViTDet's
        ``get_vit_lr_decay_rate``: the stem 0, block i i + 1); None: not in a layer stack (no decay)."""
        return None


def _resizable_vits(model: nn.Module) -> list[nn.Module]:
    """The ViTs in ``model`` whose position table is resampled per input (visiontf's, timm's with dynamic_img_size)."""
    from visiontf.models.vit_timm_api import TimmViTApi

    found = []
    for m in model.modules():
        ours = isinstance(m, TimmViTApi) and m.dynamic_img_size
        timm_vit = not isinstance(m, TimmViTApi) and getattr(m, "dynamic_img_size", False) and hasattr(m, "set_input_size")
        if (ours or timm_vit) and isinstance(getattr(m, "pos_embed", None), nn.Parameter):
            found.append(m)
    return found


@contextmanager
def fixed_position_tables(model: nn.Module, image_size: Sequence[int]) -> Iterator[nn.Module]:
    """Every resizable ViT in ``model`` with its position table resampled, in eager mode, to the grid of
    ``image_size`` (padded to the patch), restored afterwards.

    Traced for ONNX, a table resampled per input would be timm's antialiased bicubic interpolation,
    which has no ONNX operator; resampled beforehand, the graph holds the table for that grid, so a
    graph with a ViT backbone takes images of the export size (another size fails in onnxruntime).
    """
    saved = []
    for vit in _resizable_vits(model):
        p = vit.patch_embed.patch_size
        ph, pw = (p, p) if isinstance(p, int) else p
        size = (-(-int(image_size[0]) // ph) * ph, -(-int(image_size[1]) // pw) * pw)
        saved.append((vit, vit.pos_embed, tuple(vit.patch_embed.img_size), vit.pretrained_cfg))
        vit.set_input_size(img_size=size)
    try:
        yield model
    finally:
        for vit, table, img_size, cfg in saved:
            vit.patch_embed.set_input_size(img_size=img_size)
            vit.pos_embed = table
            vit.pretrained_cfg = cfg


def select_levels(reductions: Sequence[int], num_levels: int, min_stride: int = 8) -> list[int]:
    """Feature indices for ``num_levels`` maps by default: the last feature of each distinct stride,
    strides of ``min_stride`` (8) and more, the coarsest ``num_levels`` of them (ResNet: layer2-4 =
    strides 8/16/32; ConvNeXt, Swin: stages 1-3; a plain ViT, all stride 16: its last block)."""
    last_of_stride: dict[int, int] = {}
    for i, r in enumerate(reductions):
        last_of_stride[int(r)] = i
    candidates = [i for r, i in sorted(last_of_stride.items()) if r >= min_stride] or [len(reductions) - 1]
    return candidates[-num_levels:]


def check_indices(out_indices: Sequence[int], reductions: Sequence[int], what: str) -> list[int]:
    """``out_indices`` as increasing absolute feature indices, or one line naming the features there are."""
    n = len(reductions)
    indices = [n + int(i) if int(i) < 0 else int(i) for i in out_indices]
    if not indices or any(not 0 <= i < n for i in indices) or indices != sorted(set(indices)):
        listing = ", ".join(f"{i} (stride {r})" for i, r in enumerate(reductions))
        raise ValueError(f"out_indices={tuple(out_indices)} do not fit {what}: use increasing feature indices among {listing}")
    return indices


def build_backbone(
    name: str | Backbone,
    *,
    out_indices: Sequence[int] | None = None,
    num_levels: int = 1,
    min_stride: int = 8,
    pretrained: bool | str | Path | None = None,
    train_backbone: bool = True,
    freeze_stem: bool = True,
    frozen_stages: int | None = None,
    frozen_bn: bool = True,
    channels_last: bool = False,
    dilation: bool = False,
    **kwargs: Any,
) -> Backbone:
    """The :class:`Backbone` a name stands for (table in the module doc); an instance passes through.

    Args:
        out_indices: the maps to return, as feature indices of that backbone (timm's numbering of its
            ``feature_info``; torchvision ResNets: 1..4 = layer1..layer4; a ViT: its blocks). None:
            :func:`select_levels` with ``num_levels`` and ``min_stride``.
        pretrained: a local file (read with visiontf's safe loader, then loaded through timm's own
            code for ``timm:`` models: its key filters, position-table resampling, classifier
            dropped), or True for the published weights (torchvision, timm's hub download).
        train_backbone: False freezes every parameter. freeze_stem: the stem and the first stage
            stay frozen (the DETR papers'). frozen_stages: freeze the stem and the features up to
            this index (ResNet: 1 = conv1 + layer1), overriding ``freeze_stem``.
        frozen_bn: BatchNorm frozen (FrozenBatchNorm2d). channels_last: run in channels-last memory format.
        dilation: DC5 (ResNets; ``output_stride=16`` for timm CNNs).
        kwargs: to the backbone's maker (timm's ``create_model`` kwargs such as ``drop_path_rate``;
            the simple feature pyramid's ``window_size``, ``global_blocks``, ``out_channels``, ...).
    """
    if isinstance(name, Backbone):
        return name
    if not isinstance(name, str):
        raise TypeError(f"backbone must be a name or a visiontf.models.backbone.Backbone, got {type(name).__name__}")
    common = dict(out_indices=out_indices, num_levels=num_levels, min_stride=min_stride, pretrained=pretrained, train_backbone=train_backbone,
                  freeze_stem=freeze_stem, frozen_stages=frozen_stages)
    if name.startswith(SIMPLEFPN_PREFIX):
        from visiontf.models.vitdet import SimpleFeaturePyramidBackbone

        return SimpleFeaturePyramidBackbone(name[len(SIMPLEFPN_PREFIX):], pretrained=pretrained, train_backbone=train_backbone,
                                            frozen_stages=frozen_stages, **kwargs)
    from visiontf.models.dino_swin import DINO_SWIN_NAMES

    if name in DINO_SWIN_NAMES:
        from visiontf.models.dino_swin import DinoSwinBackbone

        if dilation:
            raise ValueError(f"dilation (DC5) is not built for DINO's Swin ({name}); use its stages 1-3 (strides 8-32)")
        return DinoSwinBackbone(name, **common, **kwargs)
    from visiontf.models.detr_backbone import DetrBackbone

    return DetrBackbone(name, dilation=dilation, channels_last=channels_last, frozen_bn=frozen_bn, timm_kwargs=kwargs, **common)
