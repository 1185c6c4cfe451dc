"""Deformable DETR / DINO from typed sections: the torchvision-style builder of the family.

:class:`~visiontf.models.deformable_detr.deformable_detr.DeformableDETR` takes its parts (a backbone, a position embedding,
a neck, the transformer, the denoising generator) and its typed options, as the original DETR takes
``DETR(backbone, transformer, num_classes, ...)`` and detrex builds DINO from configured parts.
:func:`build_deformable_detr` makes those parts from four sections, the config's object graph::

    model_kwargs:
      backbone: {name: resnet50, pretrained: true}            # BackboneSpec
      arch: {hidden_dim: 256, num_queries: 900, two_stage: true, with_box_refine: true}   # DeformableArchOptions
      dino: {mixed_query_selection: true, num_denoising: 100}  # DinoOptions
      postprocess: {num_top: 300}                              # PostprocessOptions

Each section is the dataclass or a mapping of its fields, read by name on top of the variant's
``DEFAULT_CFGS`` entry (:func:`merge_sections`: a variant config sets only what differs). ``backbone`` may
also be a name (``backbone: timm:convnext_tiny``) or an injected :class:`Backbone`. The flat keywords of
before the sections (``hidden_dim=...``, ``backbone_pretrained=...``, ``num_select=...``: old configs and
checkpoints' saved hyper-parameters) still build the same model, moved into their sections by name
(:func:`nest_flat_keywords`) with one ``FutureWarning`` naming the nested spelling.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from torch import nn

from visiontf.models.backbones.backbone import Backbone
from visiontf.models.backbones.spec import BackboneSpec
from visiontf.models.contract import ModelCfg
from visiontf.models.deformable_detr.arch_options import DeformableArchOptions
from visiontf.models.deformable_detr.deformable_transformer import DeformableTransformer
from visiontf.models.deformable_detr.denoising import ContrastiveDenoising
from visiontf.models.deformable_detr.dino_options import DinoOptions
from visiontf.models.postprocess_options import PostprocessOptions
from visiontf.models.sections import Sections
from visiontf.nn import PositionEmbeddingSine2d
from visiontf.nn.position_relation import PositionRelationEmbedding

__all__ = ["DEFORMABLE_SECTIONS", "SECTIONS", "build_deformable_detr", "build_deformable_transformer", "create_deformable", "level_projections",
           "merge_sections", "nest_flat_keywords", "sections_of"]

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


#: the builder's typed sections (Deformable DETR keeps 100 detections per image when a config leaves it out)
DEFORMABLE_SECTIONS = Sections.with_backbone(
    {"arch": DeformableArchOptions, "dino": DinoOptions, "postprocess": PostprocessOptions},
    {"arch": DeformableArchOptions(), "dino": DinoOptions(), "postprocess": PostprocessOptions(num_top=100)},
    renamed={"num_select": ("postprocess", "num_top")})
SECTIONS: Mapping[str, type] = DEFORMABLE_SECTIONS.classes
SECTION_DEFAULTS: Mapping[str, Any] = DEFORMABLE_SECTIONS.defaults


def flat_keywords() -> dict[str, tuple[str, str]]:
    """Every flat keyword of before the sections -> (section, field): by field name, never by position."""
    return DEFORMABLE_SECTIONS.flat_keywords()


def nest_flat_keywords(flat: Mapping[str, Any]) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """(the flat keywords among ``flat`` as section mappings, the other keywords as they are)."""
    return DEFORMABLE_SECTIONS.nest(flat)


def sections_of(backbone: str | None = None, **flat: Any) -> dict[str, Any]:
    """A variant's settings, spelt flat in code, as its sections (by field name, no warning): ``DEFAULT_CFGS`` entries."""
    return DEFORMABLE_SECTIONS.of(backbone, **flat)


def merge_sections(base: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``overrides`` on top of ``base`` section by section (:meth:`visiontf.models.sections.Sections.merge`)."""
    return DEFORMABLE_SECTIONS.merge(base, overrides)


def create_deformable(model_cls: type[M], cfg: ModelCfg, **kwargs: Any) -> M:
    """A registered variant: its ``DEFAULT_CFGS`` entry with the caller's sections merged on top (:func:`merge_sections`)."""
    return DEFORMABLE_SECTIONS.create(lambda **kw: build_deformable_detr(model_cls, **kw), cfg, **kwargs)


def build_deformable_detr(
    model_cls: type[M],
    /,
    num_classes: int = 91,
    backbone: BackboneSpec | Mapping[str, Any] | str | Backbone | None = None,
    arch: DeformableArchOptions | Mapping[str, Any] | None = None,
    dino: DinoOptions | Mapping[str, Any] | None = None,
    postprocess: PostprocessOptions | Mapping[str, Any] | None = None,
    attn_method: str = "gather",
    **model_kwargs: Any,
) -> M:
    """``model_cls`` (:class:`~visiontf.models.deformable_detr.deformable_detr.DeformableDETR` or a subclass) from its sections.

    Args:
        num_classes: object classes (sigmoid outputs; COCO: 91, the original's max category id + 1).
        backbone: a :class:`~visiontf.models.backbones.spec.BackboneSpec` (or its mapping, or a backbone name);
            ``stages`` default to the coarsest ``min(L, 3)`` maps of stride >= 8 (C3-C5); ``(1, 2, 3)``: strides
            4/8/16 from a ResNet truncated after layer3. Or an injected :class:`Backbone`.
        arch: :class:`~visiontf.models.deformable_detr.arch_options.DeformableArchOptions` (the architecture).
        dino: :class:`~visiontf.models.deformable_detr.dino_options.DinoOptions` (the DINO line's options;
            ``num_denoising``, ``dn_label_noise_ratio`` and ``dn_box_noise_scale`` also make the
            :class:`~visiontf.models.deformable_detr.denoising.ContrastiveDenoising` generator).
        postprocess: :class:`~visiontf.models.postprocess_options.PostprocessOptions` (detections kept per image,
            Deformable DETR 100, DINO 300; NMS off by default, DINO's class-agnostic when on).
        attn_method: ``"gather"`` (fused Triton kernels on CUDA), ``"triton"`` or ``"grid_sample"``
            (exportable), see :func:`visiontf.nn.ms_deform_core.ms_deform_attn_core`.
        model_kwargs: to ``model_cls`` (``pretrained_cfg``; a subclass's own, e.g. the mask head's). The flat
            keywords of before the sections are read into them by name, with one ``FutureWarning``.
    """
    S = DEFORMABLE_SECTIONS
    given, model_kwargs = S.migrate({"backbone": backbone, "arch": arch, "dino": dino, "postprocess": postprocess}, model_kwargs)
    backbone = given["backbone"]
    # the options first, checked, so that a wrong value is refused before a backbone is built
    arch = S.section("arch", given["arch"])
    dino = S.section("dino", given["dino"])
    dino.check(arch.num_queries, arch.with_box_refine, arch.two_stage)
    postprocess = S.section("postprocess", given["postprocess"])
    if num_classes < 1:
        raise ValueError(f"num_classes must be >= 1, got {num_classes}")
    levels = arch.num_feature_levels
    if isinstance(backbone, Backbone):
        body = backbone
    else:
        spec = S.section("backbone", backbone)
        if spec.stages is not None and not 1 <= len(spec.stages) <= levels:
            raise ValueError(f"backbone.stages={spec.stages} must name between 1 and num_feature_levels={levels} stages")
        # the parts, in the order the single constructor built them (a seed gives the same initial weights)
        body = spec.build(num_levels=min(levels, 3))
    position_embedding = PositionEmbeddingSine2d(arch.hidden_dim // 2, arch.pos_temperature, normalize=True, offset=arch.pos_offset)
    neck = level_projections(body.channels, arch.hidden_dim, levels)
    transformer = build_deformable_transformer(arch, dino, attn_method)
    denoising = (ContrastiveDenoising(dino.num_denoising, dino.dn_label_noise_ratio, dino.dn_box_noise_scale)
                 if dino.num_denoising > 0 else None)
    return model_cls(body, position_embedding, neck, transformer, num_classes, arch_options=arch, dino_options=dino,
                     denoising=denoising, postprocess_options=postprocess, **model_kwargs)
