"""Backbones from a name: :func:`build_backbone`, the way the detectors' ``backbone=`` argument is read:

==============================================  ============================================================
``backbone=``                                   what is built
==============================================  ============================================================
``"resnet18" | "resnet34" | "resnet50" | ...``  torchvision ResNet, FrozenBN (:class:`~visiontf.models.backbones.detr_backbone.DetrBackbone`: the original checkpoints' layout)
``"timm:<name>"``                               any timm model with ``features_only``: CNNs, Swin (NHWC -> NCHW), ViTs (DINOv2 too)
``"vit_small_patch16_224"`` (a visiontf ViT)    visiontf's ViT / DeiT through its ``features_only`` form (stride = the patch)
``"simplefpn:<ViT>"``                           ViTDet's simple feature pyramid on a visiontf or ``timm:`` ViT (:mod:`~visiontf.models.backbones.vitdet`)
``"swin_T_224_1k" | "swin_B_384_22k" | ...``    IDEA-Research/DINO's Swin layout (:mod:`~visiontf.models.backbones.dino_swin`)
``"resnet18vd" | ... | "resnet101vd"``          RT-DETR's ResNet-vd (:mod:`~visiontf.models.backbones.resnet_vd`; its ImageNet files load)
``"hgnetv2_b0" | ... | "hgnetv2_b6"``           D-FINE's HGNetv2 (:mod:`~visiontf.models.backbones.hgnetv2`; its ImageNet files load)
a :class:`Backbone` instance                    used as given (injected)
==============================================  ============================================================

Each row is a kind in the backbone registry (:mod:`~visiontf.models.backbones.registry`): the file that defines it
registers its builder with ``register_backbone``, and a new kind is one new file in this package.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from visiontf.models.backbones.backbone import Backbone
from visiontf.models.backbones.registry import find_backbone


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
        raise TypeError(f"backbone must be a name or a visiontf.models.backbones.backbone.Backbone, got {type(name).__name__}")
    entry = find_backbone(name)
    return entry.build(name, out_indices=out_indices, num_levels=num_levels, min_stride=min_stride, pretrained=pretrained,
                       train_backbone=train_backbone, freeze_stem=freeze_stem, frozen_stages=frozen_stages, frozen_bn=frozen_bn,
                       channels_last=channels_last, dilation=dilation, **kwargs)
