"""SETR's heads on any :class:`~visiontf.models.backbones.backbone.Backbone`, not only on its own ViT encoder.

:func:`~visiontf.models.setr.build.build_setr` keeps mmseg's ViT path (exact to mmsegmentation) for a visiontf ViT
``encoder.name`` (``"vit_large_patch16_384"``); any other backbone of :func:`~visiontf.models.backbones.build.build_backbone`
(``"timm:convnext_tiny"``, ``"timm:vit_small_patch14_dinov2"``, ``"swin_T_224_1k"``, an instance) is built
here: ``encoder.out_indices`` are that backbone's feature indices (the maps the heads tap, in order; by
default its last four strides from 4 on, so one map for a plain ViT: pass its blocks), and the heads
take each map's own channels. The heads resize their logits to the input, so any stride works
for Naive and PUP; MLA sums its levels top-down, so it needs maps of one width and one stride (a plain
ViT's blocks) and refuses others. BatchNorm in a CNN backbone is trained (mmseg's segmentation
backbones are), and nothing is frozen.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from visiontf.models.backbones.backbone import Backbone
from visiontf.models.backbones.build import build_backbone
from visiontf.models.vit.vit import visiontf_vits


def is_setr_vit(encoder: str | Backbone) -> bool:
    """Whether ``encoder`` is a visiontf ViT name: SETR's own (mmseg-exact) encoder path."""
    return isinstance(encoder, str) and encoder in visiontf_vits()


def setr_backbone(encoder: str | Backbone, out_indices: Sequence[int] | None, decoder: str,
                  pretrained: str | Path | None, kwargs: dict[str, Any]) -> Backbone:
    """The backbone of a SETR whose encoder is not a visiontf ViT, checked for the decoder."""
    # by default every stage from stride 4 (mmseg's CNN segmentors read C2-C5); a plain ViT: its last block
    backbone = build_backbone(encoder, out_indices=out_indices, num_levels=4, min_stride=4, pretrained=pretrained,
                              freeze_stem=False, frozen_bn=False, **kwargs)
    if decoder == "mla" and (len(set(backbone.channels)) > 1 or len(set(backbone.strides)) > 1):
        raise ValueError(
            f"SETR-MLA sums its levels, so it needs maps of one width and stride (a plain ViT's blocks); {encoder} gives "
            f"channels {backbone.channels} at strides {backbone.strides}: use decoder='naive' or 'pup', or a plain ViT"
        )
    return backbone
