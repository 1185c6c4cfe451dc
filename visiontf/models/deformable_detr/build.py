"""Deformable DETR / DINO assembled from flat keyword arguments: the one place they are read.

:class:`~visiontf.models.deformable_detr.deformable_detr.DeformableDETR` takes its parts (a backbone, a position embedding,
a neck, the transformer, the denoising generator) and its typed options, as the original DETR takes
``DETR(backbone, transformer, num_classes, ...)`` and detrex builds DINO from configured parts. A registered
name's entry of ``DEFAULT_CFGS``, a config's ``model_kwargs`` and a checkpoint's saved hyper-parameters are
flat keyword arguments (each one visible to LightningCLI, ``create_model("dino_tiny", num_queries=50)``):
:func:`build_deformable_detr` turns them into those parts. A config swaps a backbone or a neck with one
keyword (``backbone: timm:convnext_tiny``, ``backbone: simplefpn:vit_small_patch16_224``); Python code may
build the parts itself and inject them.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from torch import nn

from visiontf.models.backbones.backbone import Backbone
from visiontf.models.backbones.build import build_backbone
from visiontf.models.deformable_detr.arch_options import DeformableArchOptions
from visiontf.models.deformable_detr.denoising import ContrastiveDenoising
from visiontf.models.deformable_detr.dino_options import DinoOptions
from visiontf.models.deformable_detr.transformer import DeformableTransformer
from visiontf.models.postprocess_options import PostprocessOptions
from visiontf.nn import PositionEmbeddingSine2d
from visiontf.nn.position_relation import PositionRelationEmbedding

__all__ = ["build_deformable_detr", "build_deformable_transformer", "level_projections"]

#: DeformableDETR or a subclass (bound loosely: the model module imports this one)
M = TypeVar("M", bound=nn.Module)


def level_projections(in_channels: Sequence[int], hidden_dim: int, num_levels: int) -> nn.ModuleList:
    """The neck (detrex's ``ChannelMapper``): a 1x1 conv + GroupNorm(32) per backbone map, then 3x3 stride-2
    convs for the extra levels up to ``num_levels``, each on the previous level (the first on the last map)."""
    projections = [nn.Sequential(nn.Conv2d(c, hidden_dim, kernel_size=1), nn.GroupNorm(32, hidden_dim)) for c in in_channels]
    channels = in_channels[-1]
    for _ in range(num_levels - len(projections)):
        projections.append(nn.Sequential(nn.Conv2d(channels, hidden_dim, kernel_size=3, stride=2, padding=1), nn.GroupNorm(32, hidden_dim)))
        channels = hidden_dim
    return nn.ModuleList(projections)


def build_deformable_transformer(arch: DeformableArchOptions, dino: DinoOptions, attn_method: str = "gather") -> DeformableTransformer:
    """The deformable encoder-decoder of ``arch``, with DINO's decoder settings (refinement clamp, the
    position relation of Relation-DETR, no proposal queries with mixed query selection)."""
    transformer = DeformableTransformer(
        arch.hidden_dim, arch.nheads, arch.enc_layers, arch.dec_layers, arch.dim_feedforward, arch.dropout, arch.num_feature_levels,
        arch.enc_n_points, arch.dec_n_points, arch.two_stage, attn_method, proposal_queries=not dino.mixed_query_selection,
    )
    transformer.decoder.inverse_sigmoid_eps = arch.inverse_sigmoid_eps
    if dino.position_relation:
        transformer.decoder.position_relation = PositionRelationEmbedding(arch.nheads)
    return transformer


def build_deformable_detr(
    model_cls: type[M],
    /,
    num_classes: int = 91,
    backbone: str | Backbone = "resnet50",
    num_feature_levels: int = 4,
    hidden_dim: int = 256,
    nheads: int = 8,
    enc_layers: int = 6,
    dec_layers: int = 6,
    dim_feedforward: int = 1024,
    dropout: float = 0.1,
    num_queries: int = 300,
    enc_n_points: int = 4,
    dec_n_points: int = 4,
    with_box_refine: bool = False,
    two_stage: bool = False,
    aux_loss: bool = True,
    attn_method: str = "gather",
    backbone_pretrained: bool | str | Path | None = None,
    train_backbone: bool = True,
    channels_last: bool = False,
    frozen_bn: bool = True,
    freeze_stem: bool = True,
    backbone_stages: Sequence[int] | None = None,
    mixed_query_selection: bool = False,
    look_forward_twice: bool = False,
    num_denoising: int = 0,
    dn_label_noise_ratio: float = 0.5,
    dn_box_noise_scale: float = 0.4,
    num_query_groups: int = 1,
    share_decoder_heads: bool = False,
    distinct_query_iou: float | None = None,
    position_relation: bool = False,
    distinct_between_layers: bool = False,
    pos_temperature: float = 10000.0,
    num_select: int = 100,
    decoder_norm: bool = False,
    nms_iou_threshold: float | None = None,
    nms_class_agnostic: bool = True,
    pos_offset: float = 0.5,
    inverse_sigmoid_eps: float = 1e-5,
    select_padded_proposals: bool = False,
    backbone_kwargs: Mapping[str, Any] | None = None,
    **model_kwargs: Any,
) -> M:
    """``model_cls`` (:class:`~visiontf.models.deformable_detr.deformable_detr.DeformableDETR` or a subclass) from flat keyword arguments.

    Args:
        num_classes: object classes (sigmoid outputs; COCO: 91, the original's max category id + 1).
        backbone: ``"resnet18|34|50|101"``, ``"timm:<name>"``, a visiontf ViT, ``"simplefpn:<ViT>"`` (ViTDet's
            simple feature pyramid as the neck's input), a DINO Swin name, or a
            :class:`~visiontf.models.backbones.backbone.Backbone` (see :func:`~visiontf.models.backbones.backbone.build_backbone`).
        backbone_kwargs: more options of the backbone (``frozen_stages``, timm's ``create_model`` keywords,
            the simple feature pyramid's).
        backbone_pretrained, train_backbone, channels_last, frozen_bn, freeze_stem: see ``build_backbone``.
        backbone_stages: the backbone features that give the first levels (timm's numbering of the backbone's
            ``feature_info``; ResNets: feature i = ``layer{i}``); default the coarsest ``min(L, 3)`` of
            distinct strides >= 8 (C3-C5). ``(1, 2, 3)``: strides 4/8/16 from a ResNet truncated after layer3.
        attn_method: ``"gather"`` (fused Triton kernels on CUDA), ``"triton"`` or ``"grid_sample"``
            (exportable), see :func:`visiontf.nn.ms_deform_core.ms_deform_attn_core`.
        num_select, nms_iou_threshold, nms_class_agnostic: the post-processing
            (:class:`~visiontf.models.postprocess_options.PostprocessOptions`: detections kept per image,
            Deformable DETR 100, DINO 300; NMS off by default, DINO's class-agnostic when on).
        model_kwargs: to ``model_cls`` (``pretrained_cfg``; a subclass's own, e.g. the mask head's).

    The architecture's fields (:class:`~visiontf.models.deformable_detr.arch_options.DeformableArchOptions`:
    ``hidden_dim`` ... ``select_padded_proposals``) and the DINO line's training options
    (:class:`~visiontf.models.deformable_detr.dino_options.DinoOptions`: ``mixed_query_selection`` ...
    ``distinct_between_layers``; ``num_denoising``, ``dn_label_noise_ratio`` and ``dn_box_noise_scale`` also
    make the :class:`~visiontf.models.deformable_detr.denoising.ContrastiveDenoising` generator) keep their documented meaning.
    """
    # the options first, checked, so that a wrong value is refused before a backbone is built
    arch = DeformableArchOptions(
        hidden_dim=hidden_dim, nheads=nheads, enc_layers=enc_layers, dec_layers=dec_layers, dim_feedforward=dim_feedforward,
        dropout=dropout, num_queries=num_queries, num_feature_levels=num_feature_levels, enc_n_points=enc_n_points,
        dec_n_points=dec_n_points, with_box_refine=with_box_refine, two_stage=two_stage, aux_loss=aux_loss,
        decoder_norm=decoder_norm, pos_temperature=pos_temperature, pos_offset=pos_offset,
        inverse_sigmoid_eps=inverse_sigmoid_eps, select_padded_proposals=select_padded_proposals)
    dino = DinoOptions(mixed_query_selection, look_forward_twice, num_denoising, dn_label_noise_ratio, dn_box_noise_scale,
                       num_query_groups, share_decoder_heads, distinct_query_iou, position_relation, distinct_between_layers)
    dino.check(num_queries, with_box_refine, two_stage)
    postprocess = PostprocessOptions(num_select, nms_iou_threshold, nms_class_agnostic)
    if num_classes < 1:
        raise ValueError(f"num_classes must be >= 1, got {num_classes}")
    stages = None if backbone_stages is None else tuple(int(i) for i in backbone_stages)
    if stages is not None and not 1 <= len(stages) <= num_feature_levels:
        raise ValueError(f"backbone_stages={stages} must name between 1 and num_feature_levels={num_feature_levels} stages")
    # the parts, in the order the single constructor built them (a seed gives the same initial weights)
    body = build_backbone(
        backbone, out_indices=stages, num_levels=min(num_feature_levels, 3), pretrained=backbone_pretrained,
        train_backbone=train_backbone, channels_last=channels_last, frozen_bn=frozen_bn, freeze_stem=freeze_stem,
        **(backbone_kwargs or {}),
    )
    position_embedding = PositionEmbeddingSine2d(hidden_dim // 2, pos_temperature, normalize=True, offset=pos_offset)
    neck = level_projections(body.channels, hidden_dim, num_feature_levels)
    transformer = build_deformable_transformer(arch, dino, attn_method)
    denoising = ContrastiveDenoising(num_denoising, dn_label_noise_ratio, dn_box_noise_scale) if num_denoising > 0 else None
    return model_cls(body, position_embedding, neck, transformer, num_classes, arch, dino, denoising, postprocess, **model_kwargs)
