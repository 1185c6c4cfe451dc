"""The option groups of :class:`~visiontf.models.rtdetr.rtdetr.RTDETR`, one frozen dataclass per config section.

A registered name's settings, a config's ``model_kwargs`` and a checkpoint's saved arguments give them as
sections, each a mapping of the dataclass's fields::

    model_kwargs:
      backbone: {depth: 18, frozen_bn: false}
      encoder: {hidden_dim: 256, expansion: 0.5}
      decoder: {num_layers: 3, num_points: [4, 4, 4]}
      denoising: {num_denoising: 100}

:func:`section` turns one mapping into its dataclass (unknown keys refused by name, lists made tuples), on top
of the variant's own values for the fields it does not name. The defaults below are RT-DETR's R50-vd model
(``rtdetrv2_r50vd.yml`` of lyuwenyu/RT-DETR).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, TypeVar

from visiontf.models.backbones.resnet_vd import RESNET_VD_NAMES
from visiontf.models.backbones.spec import BackboneSpec
from visiontf.models.sections import typed_fields

__all__ = ["DecoderOptions", "DenoisingOptions", "EncoderOptions", "ResNetVdOptions", "resnet_vd_options", "resnet_vd_spec", "section"]

T = TypeVar("T")

ACTIVATIONS = ("relu", "gelu", "silu")
FUSION_BLOCKS = ("csprep", "elan")
QUERY_POS_METHODS = ("default", "as_reg")
DOWNSAMPLES = ("conv", "scdown")


@dataclass(frozen=True)
class ResNetVdOptions:
    """The ResNet-vd backbone (RT-DETR's ``PResNet``): the ``backbone`` section's former spelling, still read (with one
    ``FutureWarning``) as the :class:`~visiontf.models.backbones.spec.BackboneSpec` :func:`resnet_vd_spec` gives.

    Args:
        depth: 18, 34, 50 or 101.
        out_stages: stages whose maps the encoder takes (2, 3, 4: strides 8, 16, 32; the original's ``return_idx``).
        frozen_bn: FrozenBatchNorm (R50/R101: ``freeze_norm``) or trained BatchNorm (R18/R34).
        freeze_at: -1 nothing frozen (R18/R34), 0 the stem (R50/R101), k the stem and k stages.
        stem_width, widths, blocks: the stem's first width, the stages' widths (before the bottleneck's 4x) and
            blocks per stage (None: the depth's); narrower values build the tests' small networks.
        pretrained: a local ImageNet file (the original's ``ResNet*_vd_*pretrained_from_paddle.pth``).
        channels_last: channels-last memory format (faster convolutions on CPUs).
    """

    depth: int = 50
    out_stages: tuple[int, ...] = (2, 3, 4)
    frozen_bn: bool = True
    freeze_at: int = 0
    stem_width: int = 32
    widths: tuple[int, ...] = (64, 128, 256, 512)
    blocks: tuple[int, ...] | None = None
    pretrained: str | None = None
    channels_last: bool = False


#: ResNetVdOptions's fields as they were before the stem and widths could be set
_RESNET_VD = {"stem_width": 32, "widths": (64, 128, 256, 512)}


def resnet_vd_spec(options: ResNetVdOptions) -> BackboneSpec:
    """The :class:`BackboneSpec` that builds the network ``options`` describe (``resnet{depth}vd``), field by field."""
    if options.depth not in RESNET_VD_NAMES.values():
        raise ValueError(f"backbone.depth must be 18, 34, 50 or 101, got {options.depth}")
    kwargs: dict[str, Any] = {}
    if options.freeze_at not in (-1, 1):  # -1 and 1 are freeze_stem's two readings for a ResNet-vd; 0 is the stem alone
        kwargs["frozen_stages"] = options.freeze_at
    for name in ("stem_width", "widths"):
        if getattr(options, name) != _RESNET_VD[name]:
            kwargs[name] = getattr(options, name)
    if options.blocks is not None:
        kwargs["blocks"] = options.blocks
    return BackboneSpec(name=f"resnet{options.depth}vd", pretrained=options.pretrained, frozen_bn=options.frozen_bn,
                        freeze_stem=options.freeze_at != -1, channels_last=options.channels_last, stages=options.out_stages,
                        kwargs=kwargs)


def resnet_vd_options(spec: BackboneSpec) -> ResNetVdOptions:
    """``spec`` (a ResNet-vd's) in the former spelling, so that a section in that spelling goes on top of it."""
    if spec.name not in RESNET_VD_NAMES:
        raise ValueError(f"backbone: depth, out_stages, freeze_at, stem_width, widths and blocks describe a ResNet-vd, but the "
                         f"backbone is {spec.name!r}; write the section as a BackboneSpec (backbone: {{name: ..., kwargs: ...}})")
    own = dict(spec.kwargs)
    frozen = own.pop("frozen_stages", None)
    freeze_at = 4 if not spec.train else frozen if frozen is not None else 1 if spec.freeze_stem else -1
    return ResNetVdOptions(depth=RESNET_VD_NAMES[spec.name], out_stages=spec.stages or (2, 3, 4), frozen_bn=spec.frozen_bn,
                           freeze_at=freeze_at, stem_width=own.pop("stem_width", _RESNET_VD["stem_width"]),
                           widths=tuple(own.pop("widths", _RESNET_VD["widths"])), blocks=own.pop("blocks", None),
                           pretrained=spec.pretrained, channels_last=spec.channels_last)


@dataclass(frozen=True)
class EncoderOptions:
    """The hybrid encoder: AIFI (a transformer encoder on the coarsest level) and CCFM (top-down and bottom-up fusion).

    Args:
        hidden_dim: channels of every level after the input projections.
        nhead, dim_feedforward, dropout, activation, num_layers: the AIFI transformer layers (post-norm).
        aifi_levels: the levels AIFI runs on (the original's ``use_encoder_idx``; [2]: the stride-32 map).
        pe_temperature: of the 2-d sine-cosine position embedding.
        expansion: hidden width of the CSPRep fusion blocks, as a fraction of ``hidden_dim`` (0.5 for R18/R34 and the M models).
        depth_mult: RepVGG blocks per fusion block, ``round(3 * depth_mult)``.
        fusion_act: activation of the fusion convolutions (SiLU).
        fusion_block: ``"csprep"`` (RT-DETR's CSPRep blocks) or ``"elan"`` (D-FINE's CSP-ELAN blocks, whose branches are
            ``round(expansion * hidden_dim // 2)`` wide).
        lateral_act: the top-down pass's lateral 1x1 convolutions end with ``fusion_act`` (RT-DETR) or are linear (D-FINE).
        downsample: the bottom-up pass's downsampling, ``"conv"`` (a 3x3 stride-2 convolution with ``fusion_act``,
            RT-DETR) or ``"scdown"`` (D-FINE's linear 1x1 and depthwise 3x3 stride-2 convolutions).
    """

    hidden_dim: int = 256
    nhead: int = 8
    dim_feedforward: int = 1024
    dropout: float = 0.0
    activation: str = "gelu"
    num_layers: int = 1
    aifi_levels: tuple[int, ...] = (2,)
    pe_temperature: float = 10000.0
    expansion: float = 1.0
    depth_mult: float = 1.0
    fusion_act: str = "silu"
    fusion_block: str = "csprep"
    lateral_act: bool = True
    downsample: str = "conv"


@dataclass(frozen=True)
class DecoderOptions:
    """Query selection and the deformable decoder.

    Args:
        hidden_dim, nhead, dim_feedforward, dropout, activation, num_layers: the decoder layers (post-norm).
        num_queries: queries, the top encoder positions by their best class score (IoU-aware selection).
        num_levels: levels the decoder attends to; more than the encoder's are 3x3 stride-2 convolutions of the last.
        num_points: sampling points per level and head; an int (RT-DETR) or one count per level (RT-DETRv2's
            ``num_points`` list, which also takes its offset scaling: :class:`~visiontf.nn.MSDeformAttn`).
        sampling: ``"bilinear"`` or ``"discrete"`` (RT-DETRv2's ``cross_attn_method``; its ``_dsp`` models).
        offset_scale: box offsets are ``offset / P * box_size * offset_scale`` (0.5).
        eval_idx: the decoder layer whose predictions evaluation returns (-1 the last; the M models 2); later layers
            are not run at evaluation.
        learn_query_content: learned content queries instead of the selected encoder features.
        aux_loss: return every layer's predictions in training (auxiliary losses).
        attn_method: the deformable attention core (``"gather"``, ``"triton"``, ``"grid_sample"``).
        anchor_eps: encoder positions whose anchor box is within this of the image border are not selected.
        mlp_act: activation between the layers of the MLP heads (query position, proposal boxes, layer boxes):
            ``"relu"`` (RT-DETR) or ``"silu"`` (DEIM's ``mlp_act``).
        query_pos_method: the query-position MLP of each layer's box: ``"default"`` (RT-DETR: 4 -> 2d -> d, two
            layers) or ``"as_reg"`` (DEIM's RT-DETRv2: 4 -> d -> d -> d, three layers, the box heads' shape).
        distinct_query_iou: None (the originals) or an IoU in (0, 1]: DDQ DETR's distinct query selection, as DINO's
            option of this name (:func:`~visiontf.models.deformable_detr.queries.distinct_first`): the top
            ``num_queries`` proposals among those a class-agnostic NMS at this IoU keeps, the suppressed ones filling
            what is left, so no two queries start on one object. Part of the model in training and inference.
        distinct_between_layers: DDQ DETR's selection also after every decoder layer but the last (DINO's option of
            this name, :class:`~visiontf.models.deformable_detr.distinct_queries.DistinctQueriesBetweenLayers`): a
            class-agnostic NMS at ``distinct_query_iou`` over the matching queries' refined boxes, ranked by the
            layer's best class probability, among the queries still kept. A suppressed query is hidden from every
            query's self-attention from the next layer on and its later logits are -100 (never matched, never
            reported); denoising queries are never selected. Needs ``distinct_query_iou``.
        num_one_to_many_queries: 0 (the originals) or T > 0: H-DETR's hybrid matching (Jia et al., CVPR 2023), in
            training only. T more queries, the T encoder positions with the highest best-class score (by score alone,
            so several may start on one object), go through the same layers in a pass of their own: they neither see
            nor are seen by the ``num_queries`` one-to-one queries and the denoising queries. The criterion matches
            them to the ground truth repeated ``one_to_many_repeats`` times (``one_to_many_outputs``): more boxes
            supervised per step, for the layers the one-to-one queries use. Inference is unchanged.
    """

    hidden_dim: int = 256
    nhead: int = 8
    dim_feedforward: int = 1024
    dropout: float = 0.0
    activation: str = "relu"
    num_layers: int = 6
    num_queries: int = 300
    num_levels: int = 3
    num_points: int | tuple[int, ...] = 4
    sampling: str = "bilinear"
    offset_scale: float = 0.5
    eval_idx: int = -1
    learn_query_content: bool = False
    aux_loss: bool = True
    attn_method: str = "gather"
    anchor_eps: float = 1e-2
    mlp_act: str = "relu"
    query_pos_method: str = "default"
    distinct_query_iou: float | None = None
    distinct_between_layers: bool = False
    num_one_to_many_queries: int = 0

    def __post_init__(self) -> None:
        many = self.num_one_to_many_queries
        if isinstance(many, bool) or not isinstance(many, int) or many < 0:
            raise ValueError(f"decoder.num_one_to_many_queries={many!r}: give a whole number >= 0 (0: no one-to-many "
                             "branch, the originals; H-DETR uses 5 times num_queries)")
        if many and self.learn_query_content:
            raise ValueError("decoder.num_one_to_many_queries takes the selected encoder features as the one-to-many "
                             "queries' content; learned content (learn_query_content=true) has num_queries rows alone")
        iou = self.distinct_query_iou
        if iou is not None and (isinstance(iou, bool) or not isinstance(iou, (int, float)) or not 0 < iou <= 1):
            raise ValueError(f"decoder.distinct_query_iou={iou!r}: give an IoU in (0, 1] (DDQ DETR 0.8), or null "
                             "for the originals' selection by score alone")
        if not isinstance(self.distinct_between_layers, bool):
            raise ValueError(f"decoder.distinct_between_layers={self.distinct_between_layers!r}: give true or false")
        if self.distinct_between_layers and iou is None:
            raise ValueError("decoder.distinct_between_layers=true selects at decoder.distinct_query_iou after each decoder "
                             "layer: set distinct_query_iou too (DDQ DETR 0.8)")
        eps = self.anchor_eps
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 <= eps < 0.05:
            # anchors are 0.05 * 2^level wide and valid when all four coordinates clear the margin: from 0.05 whole levels
            # are masked, and once every level is, every query starts from an infinite box (all boxes (1, 1, 1, 1))
            raise ValueError(f"decoder.anchor_eps={eps!r}: give a margin in [0, 0.05) (the originals' 0.01); the finest "
                             "level's anchors are 0.05 wide, so a larger margin masks whole levels of positions")


@dataclass(frozen=True)
class DenoisingOptions:
    """Contrastive denoising groups in training (RT-DETR's: DINO's with box noise 1.0; 0 slots: none).

    Args:
        num_denoising: positive slots per batch (each has a negative, so up to twice as many queries).
        label_noise_ratio: a copy's label is redrawn with probability ``ratio / 2``.
        box_noise_scale: corners move by up to ``scale`` (positives) or between ``scale`` and ``2 scale``
            (negatives) times half the box size.
        flip_negative_sizes: a noised box whose corners crossed gets its sizes' absolute values (DEIM's generator,
            D-FINE's); False: the inverse sigmoid's clamp makes it a box of no width (RT-DETR's).
    """

    num_denoising: int = 100
    label_noise_ratio: float = 0.5
    box_noise_scale: float = 1.0
    flip_negative_sizes: bool = False


def _frozen(value: Any) -> Any:
    return tuple(_frozen(v) for v in value) if isinstance(value, (list, tuple)) else value


def section(cls: type[T], value: T | Mapping[str, Any] | None, base: T | None = None, where: str = "") -> T:
    """``value`` (a mapping of some of ``cls``'s fields, or an instance) as a ``cls`` on top of ``base``."""
    base = cls() if base is None else base
    if value is None:
        return base
    if isinstance(value, cls):
        return value
    if not isinstance(value, Mapping):
        raise TypeError(f"{where or cls.__name__}: expected a mapping of {cls.__name__} fields, got {type(value).__name__}")
    names = [f.name for f in fields(cls)]
    unknown = sorted(set(value) - set(names))
    if unknown:
        raise ValueError(f"{where or cls.__name__}: unknown key(s) {unknown}; it takes {', '.join(names)}")
    typed = typed_fields(cls, value, where or cls.__name__)
    return dataclasses.replace(base, **{k: _frozen(v) for k, v in typed.items()})


def as_mapping(options: Any) -> dict[str, Any]:
    """A dataclass's fields as a plain mapping (lists for tuples), as a config section writes them."""
    return {f.name: (list(v) if isinstance(v := getattr(options, f.name), tuple) else v) for f in fields(options)}


def check_sections(backbone: ResNetVdOptions | None, encoder: EncoderOptions, decoder: DecoderOptions,
                   denoising: DenoisingOptions) -> None:
    """Refuse values that cannot build a working model, naming the section, the field and the fix."""
    from visiontf.nn.ms_deform_core import METHODS, SAMPLINGS

    if backbone is not None:
        if backbone.depth not in (18, 34, 50, 101):
            raise ValueError(f"backbone.depth must be 18, 34, 50 or 101, got {backbone.depth}")
        if len(backbone.out_stages) < 1:
            raise ValueError("backbone.out_stages must name at least one stage")
    if encoder.hidden_dim % 4 or encoder.hidden_dim % encoder.nhead:
        raise ValueError(f"encoder.hidden_dim must be divisible by 4 (its position embedding) and by encoder.nhead={encoder.nhead}, "
                         f"got {encoder.hidden_dim}")
    for where, act in (("encoder.activation", encoder.activation), ("encoder.fusion_act", encoder.fusion_act),
                       ("decoder.activation", decoder.activation), ("decoder.mlp_act", decoder.mlp_act)):
        if act not in ACTIVATIONS:
            raise ValueError(f"{where} must be one of {ACTIVATIONS}, got {act!r}")
    if encoder.fusion_block not in FUSION_BLOCKS:
        raise ValueError(f"encoder.fusion_block must be one of {FUSION_BLOCKS}, got {encoder.fusion_block!r}")
    if encoder.downsample not in DOWNSAMPLES:
        raise ValueError(f"encoder.downsample must be one of {DOWNSAMPLES}, got {encoder.downsample!r}")
    if decoder.query_pos_method not in QUERY_POS_METHODS:
        raise ValueError(f"decoder.query_pos_method must be one of {QUERY_POS_METHODS}, got {decoder.query_pos_method!r}")
    if decoder.hidden_dim % decoder.nhead:
        raise ValueError(f"decoder.hidden_dim={decoder.hidden_dim} must be divisible by decoder.nhead={decoder.nhead}")
    if decoder.num_layers < 1 or decoder.num_queries < 1 or decoder.num_levels < 1:
        raise ValueError("decoder.num_layers, num_queries and num_levels must be >= 1")
    if not -decoder.num_layers <= decoder.eval_idx < decoder.num_layers:
        raise ValueError(f"decoder.eval_idx={decoder.eval_idx} must name one of the {decoder.num_layers} decoder layers")
    points = decoder.num_points
    if isinstance(points, tuple) and (len(points) != decoder.num_levels or min(points) < 1) or isinstance(points, int) and points < 1:
        raise ValueError(f"decoder.num_points must be a positive count or one per level ({decoder.num_levels}), got {points}")
    if decoder.sampling not in SAMPLINGS:
        raise ValueError(f"decoder.sampling must be one of {SAMPLINGS}, got {decoder.sampling!r}")
    if decoder.attn_method not in METHODS:
        raise ValueError(f"decoder.attn_method must be one of {METHODS}, got {decoder.attn_method!r}")
    if denoising.num_denoising < 0 or not 0 <= denoising.label_noise_ratio <= 1 or denoising.box_noise_scale < 0:
        raise ValueError(f"denoising: num_denoising >= 0, label_noise_ratio in [0, 1] and box_noise_scale >= 0, got {denoising}")
