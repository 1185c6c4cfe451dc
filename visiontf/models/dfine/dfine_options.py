"""The option groups of :class:`~visiontf.models.dfine.dfine.DFINE`, one frozen dataclass per config section.

D-FINE is RT-DETR with another backbone, encoder blocks and box head, so its sections are RT-DETR's
(:mod:`visiontf.models.rtdetr.rtdetr_options`: ``encoder`` is :class:`~visiontf.models.rtdetr.rtdetr_options.EncoderOptions` with
D-FINE's fusion options, ``denoising`` :class:`~visiontf.models.rtdetr.rtdetr_options.DenoisingOptions`) and two of its own:

* ``backbone``: :class:`HGNetV2Options`;
* ``decoder``: :class:`FDRDecoderOptions`, RT-DETR's :class:`~visiontf.models.rtdetr.rtdetr_options.DecoderOptions` with the
  distribution head's fields;

and ``loss``: :class:`~visiontf.models.set_loss_options.FineGrainedLossOptions` (D-FINE's: varifocal; DEIM's: the
matchability-aware loss). A config gives each as a mapping of the fields it changes::

    model_kwargs:
      backbone: {arch: B0, use_lab: true, out_stages: [3, 4]}
      decoder: {num_layers: 3, num_points: [6, 6]}
      loss: {class_loss: mal, class_gamma: 1.5}

The defaults are D-FINE-L's (``dfine_hgnetv2_l_coco.yml`` of Peterande/D-FINE).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from visiontf.models.backbones.hgnetv2 import HGNETV2_NAMES, USE_LAB
from visiontf.models.backbones.spec import BackboneSpec
from visiontf.models.rtdetr.rtdetr_options import ACTIVATIONS, DecoderOptions

__all__ = ["FDRDecoderOptions", "HGNetV2Options", "check_fdr_sections", "hgnetv2_options", "hgnetv2_spec"]


@dataclass(frozen=True)
class HGNetV2Options:
    """The HGNetv2 backbone (:class:`~visiontf.models.backbones.hgnetv2.HGNetV2Backbone`): the ``backbone`` section's former
    spelling, still read (with one ``FutureWarning``) as the :class:`~visiontf.models.backbones.spec.BackboneSpec`
    :func:`hgnetv2_spec` gives.

    Args:
        arch: ``"B0"``..``"B6"`` (N, S: B0; M: B2; L: B4; X: B5).
        out_stages: stages whose maps the encoder takes, 1..4 (strides 4..32; the original's ``return_idx`` plus
            one): (2, 3, 4), the N model (3, 4).
        use_lab: learnable affine blocks after the activations (N, S, M).
        frozen_bn: FrozenBatchNorm (L, X: ``freeze_norm``) or trained BatchNorm (N, S, M; every DEIM model).
        freeze_at: -1 nothing frozen, 0 the stem (L, X), k the stem and k stages.
        stem, stages: other widths (the tests' small networks): the stem's (mid, out) and four stage rows
            ``(in, mid, out, blocks, downsample, light, kernel, layers)``; None: the architecture's.
        pretrained: a local ImageNet file (the original's ``PPHGNetV2_B*_stage1.pth``).
        channels_last: channels-last memory format (faster convolutions on CPUs).
    """

    arch: str = "B4"
    out_stages: tuple[int, ...] = (2, 3, 4)
    use_lab: bool = False
    frozen_bn: bool = True
    freeze_at: int = 0
    stem: tuple[int, ...] | None = None
    stages: tuple[tuple, ...] | None = None
    pretrained: str | None = None
    channels_last: bool = False


def hgnetv2_spec(options: HGNetV2Options) -> BackboneSpec:
    """The :class:`BackboneSpec` that builds the network ``options`` describe (``hgnetv2_b{i}``), field by field."""
    name = f"hgnetv2_{str(options.arch).lower()}"
    if name not in HGNETV2_NAMES:
        raise ValueError(f"backbone.arch must be one of B0..B6, got {options.arch!r}")
    kwargs: dict[str, Any] = {}
    if options.freeze_at not in (-1, 0):  # -1 and 0 are freeze_stem's two readings for HGNetv2
        kwargs["frozen_stages"] = options.freeze_at
    if options.use_lab != (options.arch in USE_LAB):  # the architecture's own choice when left out
        kwargs["use_lab"] = options.use_lab
    if options.stem is not None:
        kwargs["stem"] = options.stem
    if options.stages is not None:
        kwargs["stages"] = options.stages
    return BackboneSpec(name=name, pretrained=options.pretrained, frozen_bn=options.frozen_bn, freeze_stem=options.freeze_at != -1,
                        channels_last=options.channels_last, stages=options.out_stages, kwargs=kwargs)


def hgnetv2_options(spec: BackboneSpec) -> HGNetV2Options:
    """``spec`` (an HGNetv2's) in the former spelling, so that a section in that spelling goes on top of it."""
    if spec.name not in HGNETV2_NAMES:
        raise ValueError(f"backbone: arch, out_stages, use_lab, freeze_at, stem and stages rows describe an HGNetv2, but the "
                         f"backbone is {spec.name!r}; write the section as a BackboneSpec (backbone: {{name: ..., kwargs: ...}})")
    own = dict(spec.kwargs)
    arch = HGNETV2_NAMES[spec.name]
    frozen = own.pop("frozen_stages", None)
    freeze_at = 4 if not spec.train else frozen if frozen is not None else 0 if spec.freeze_stem else -1
    return HGNetV2Options(arch=arch, out_stages=spec.stages or (2, 3, 4), use_lab=own.pop("use_lab", arch in USE_LAB),
                          frozen_bn=spec.frozen_bn, freeze_at=freeze_at, stem=own.pop("stem", None), stages=own.pop("stages", None),
                          pretrained=spec.pretrained, channels_last=spec.channels_last)


def is_stage_rows(key: str, value: Any) -> bool:
    """HGNetv2Options's ``stages`` (rows of a stage table) rather than the spec's ``stages`` (stage numbers)."""
    return key == "stages" and isinstance(value, Sequence) and bool(value) and not isinstance(value[0], (int, float))


@dataclass(frozen=True)
class FDRDecoderOptions(DecoderOptions):
    """RT-DETR's decoder options, with D-FINE's defaults and the fine-grained distribution refinement's fields.

    Args:
        num_points: D-FINE's (3, 6, 3) points per level (N: (6, 6) on its 2 levels).
        reg_max: bins per box edge minus one (32).
        reg_scale: the weighting function's curvature and the edge offsets' unit (4; X: 8).
        up: the weighting function's upper bound factor (0.5).
        mlp_act: activation of the heads' MLPs (query position, proposal boxes, first-layer boxes, edge distributions):
            ``"relu"`` (D-FINE) or ``"silu"`` (DEIM's ``mlp_act``).
        lqe_act: activation of the quality estimators' MLPs; None (the default) takes ``activation``, as DEIM does
            (its SiLU models) and D-FINE with its ReLU decoder. D-FINE's code and transformers' ``DFineLQE`` use ReLU
            whatever the decoder's activation: ``"relu"`` rebuilds a transformers D-FINE whose
            ``decoder_activation_function`` is another.
        lqe_topk, lqe_hidden, lqe_layers: the location-quality estimator, an MLP of each edge's ``lqe_topk`` largest
            bin probabilities and their mean (``4 * (lqe_topk + 1)`` inputs, ``lqe_hidden`` wide, ``lqe_layers``
            layers) added to the class logits.
    """

    num_points: int | tuple[int, ...] = (3, 6, 3)
    reg_max: int = 32
    reg_scale: float = 4.0
    up: float = 0.5
    mlp_act: str = "relu"
    lqe_act: str | None = None
    lqe_topk: int = 4
    lqe_hidden: int = 64
    lqe_layers: int = 2


def check_fdr_sections(backbone: HGNetV2Options | None, decoder: FDRDecoderOptions) -> None:
    """Refuse D-FINE's own values that cannot build a working model, naming the section and the field."""
    if backbone is not None:
        if backbone.arch not in tuple(f"B{i}" for i in range(7)):
            raise ValueError(f"backbone.arch must be one of B0..B6, got {backbone.arch!r}")
        if not backbone.out_stages or not set(backbone.out_stages) <= {1, 2, 3, 4}:
            raise ValueError(f"backbone.out_stages must name stages among 1..4, got {backbone.out_stages}")
    if decoder.reg_max < 4 or decoder.reg_max % 2:
        raise ValueError(f"decoder.reg_max must be an even number >= 4, got {decoder.reg_max}")
    if decoder.reg_scale <= 0 or decoder.up <= 0:
        raise ValueError(f"decoder.reg_scale and decoder.up must be > 0, got {decoder.reg_scale} and {decoder.up}")
    if decoder.mlp_act not in ACTIVATIONS:
        raise ValueError(f"decoder.mlp_act must be one of {ACTIVATIONS}, got {decoder.mlp_act!r}")
    if decoder.lqe_act is not None and decoder.lqe_act not in ACTIVATIONS:
        raise ValueError(f"decoder.lqe_act must be one of {ACTIVATIONS} or None (the decoder's activation), got {decoder.lqe_act!r}")
    if not 1 <= decoder.lqe_topk <= decoder.reg_max + 1 or decoder.lqe_hidden < 1 or decoder.lqe_layers < 1:
        raise ValueError(f"decoder.lqe_topk must be in [1, reg_max + 1] and lqe_hidden, lqe_layers >= 1, got "
                         f"{decoder.lqe_topk}, {decoder.lqe_hidden}, {decoder.lqe_layers}")
