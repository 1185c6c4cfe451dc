"""D-FINE (Peng et al., ICLR 2025; Peterande/D-FINE) and DEIM (Huang et al., CVPR 2025; ShihuaHuang95/DEIM).

D-FINE is RT-DETR (:mod:`visiontf.models.rtdetr`) with three changes:

* an HGNetv2 backbone (:mod:`~visiontf.models.backbones.hgnetv2`, B0 to B5 for N to X);
* the hybrid encoder with CSP-ELAN fusion blocks, linear lateral convolutions and SCDown downsampling (options of
  RT-DETR's :class:`~visiontf.models.rtdetr.hybrid_encoder.HybridEncoder`);
* a decoder whose layers gate their deformable attention in and whose boxes are four edge distributions refined
  layer by layer (fine-grained distribution refinement, :mod:`~visiontf.models.dfine.dfine_decoder`), scored with a
  location-quality estimate.

It trains with RT-DETR's varifocal loss, denoising and matcher plus two terms of its own: the fine-grained
localisation loss on the edge distributions and the decoupled distillation of every layer towards the last (GO-LSD),
with box terms on the union of all layers' matchings (:class:`~visiontf.set_prediction.fine_grained.FineGrainedCriterion`).

DEIM trains the same networks (``deim_dfine_*``: SiLU in the decoder's FFNs and MLP heads, the backbone's BatchNorm
trained) with the matchability-aware loss and a data schedule: mosaics for dense one-to-one matching in the first
half of training, strong augmentation stopped for the last epochs (``CocoDataModule``'s ``mosaic``,
``mosaic_epochs`` and ``strong_aug_epochs``).

The model takes its settings as typed sections (:mod:`~visiontf.models.dfine.dfine_options`): ``backbone``, ``encoder``,
``decoder``, ``denoising`` and ``loss``. Peterande's and DEIM's ``.pth`` files and transformers'
``DFineForObjectDetection`` load through :mod:`~visiontf.models.dfine.convert` (``create_model(name, pretrained=path)``).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from torch import Tensor

from visiontf.models._registry import register_model
from visiontf.models.backbones.backbone import Backbone
from visiontf.models.backbones.spec import BackboneSpec
from visiontf.models.contract import ModelCfg, PretrainedCfg
from visiontf.models.deformable_detr.denoising import ContrastiveDenoising, DenoisingQueries
from visiontf.models.dfine.convert import convert_state_dict
from visiontf.models.dfine.dfine_decoder import DFineDecoder, FineDecoderOutput
from visiontf.models.dfine.dfine_options import (
    FDRDecoderOptions,
    HGNetV2Options,
    check_fdr_sections,
    hgnetv2_options,
    hgnetv2_spec,
    is_stage_rows,
)
from visiontf.models.postprocess_options import PostprocessOptions
from visiontf.models.rtdetr.backbone_section import FormerBackbone, backbone_section
from visiontf.models.rtdetr.hybrid_encoder import HybridEncoder
from visiontf.models.rtdetr.rtdetr import RTDETR, RTDETR_POSTPROCESS, TABLES, check_pyramid, check_pyramid_levels
from visiontf.models.rtdetr.rtdetr_decoder import INVERSE_SIGMOID_EPS
from visiontf.models.rtdetr.rtdetr_options import DenoisingOptions, EncoderOptions, check_sections, section
from visiontf.models.set_loss_options import FineGrainedLossOptions

__all__ = ["DEFAULT_CFGS", "DEIM_LOSS", "DFINE", "DFINE_LOSS", "build_dfine"]

#: D-FINE's matcher and loss (``DFINECriterion`` in its configs): focal matching cost class 2, L1 5, GIoU 2 (alpha 0.25,
#: gamma 2); varifocal loss (alpha 0.75, gamma 2) 1, L1 5, GIoU 2, fine-grained localisation 0.15, distillation 1.5
DFINE_LOSS = FineGrainedLossOptions(class_loss="vfl", cost_class=2.0, cost_bbox=5.0, cost_giou=2.0, focal_alpha=0.25, focal_gamma=2.0,
                                    loss_class=1.0, loss_bbox=5.0, loss_giou=2.0, loss_fgl=0.15, loss_ddf=1.5)
#: DEIM's (``DEIMCriterion`` with ``configs/base/deim.yml``): the matchability-aware loss with gamma 1.5, the rest D-FINE's
DEIM_LOSS = dataclasses.replace(DFINE_LOSS, class_loss="mal", class_gamma=1.5)


class DFINE(RTDETR):
    """D-FINE / DEIM built from its parts: RT-DETR's model with :class:`~visiontf.models.dfine.dfine_decoder.DFineDecoder`.

    Args:
        backbone, encoder, num_classes, denoising, input_norm, postprocess_options, pretrained_cfg: as
            :class:`~visiontf.models.rtdetr.rtdetr.RTDETR`'s.
        decoder: the :class:`~visiontf.models.dfine.dfine_decoder.DFineDecoder`.
        loss: the family's loss options (:data:`DFINE_LOSS` or DEIM's :data:`DEIM_LOSS`); the distribution fields follow
            the decoder.

    In training, besides RT-DETR's outputs, each decoder layer's entry has ``pred_corners`` (B, Q, 4 (reg_max + 1))
    and ``ref_points`` (B, Q, 4), the first layer's RT-DETR-style box that every box refines; ``pre_outputs`` is that
    box with its logits (and the same under ``dn_outputs`` for the denoising queries).
    """

    decoder: DFineDecoder

    def __init__(self, backbone: Backbone, encoder: HybridEncoder, decoder: DFineDecoder, num_classes: int,
                 denoising: ContrastiveDenoising | None = None, input_norm: str = "imagenet",
                 postprocess_options: PostprocessOptions = RTDETR_POSTPROCESS,
                 pretrained_cfg: PretrainedCfg | Mapping[str, Any] | None = None, loss: FineGrainedLossOptions = DFINE_LOSS) -> None:
        if not isinstance(decoder, DFineDecoder):
            raise TypeError(f"D-FINE's decoder is a DFineDecoder, got {type(decoder).__name__}")
        super().__init__(backbone, encoder, decoder, num_classes, denoising, input_norm, postprocess_options, pretrained_cfg)
        self.loss_options = loss

    def set_loss_options(self) -> FineGrainedLossOptions:
        """The family's loss (D-FINE's or DEIM's) with the decoder's distribution settings."""
        o = self.decoder.options
        return dataclasses.replace(self.loss_options, reg_max=o.reg_max, reg_scale=o.reg_scale, up=o.up)

    def _outputs(self, dec: FineDecoderOutput, dn: DenoisingQueries | None, to_image: Callable[[Tensor], Tensor]) -> dict:
        out = super()._outputs(dec, dn, to_image)
        if not self.training:
            return out
        P = dn.meta.pad_size if dn is not None else 0
        corners, initial = dec.corners, to_image(dec.initial)
        pre = {"pred_logits": dec.pre_logits, "pred_boxes": to_image(dec.pre_boxes)}
        groups = [(out, slice(P, None))] + ([(out["dn_outputs"], slice(None, P))] if dn is not None else [])
        for group, part in groups:
            group.update(pred_corners=corners[-1, :, part], ref_points=initial[:, part])
            for i, layer in enumerate(group.get("aux_outputs", [])):
                layer.update(pred_corners=corners[i, :, part], ref_points=initial[:, part])
            if self.decoder.options.aux_loss:
                group["pre_outputs"] = {k: v[:, part] for k, v in pre.items()}
        return out


# ------------------------------------------------------------------------------------ building
#: the backbone when neither the config nor the variant names one: D-FINE-L's HGNetv2-B4 (the stem frozen, FrozenBatchNorm)
HGNETV2_DEFAULT = BackboneSpec(name="hgnetv2_b4", stages=(2, 3, 4))
#: the backbone section's former spelling (HGNetV2Options), still read
HGNETV2_FORMER = FormerBackbone(HGNetV2Options, frozenset({"arch", "out_stages", "use_lab", "freeze_at", "stem"}), hgnetv2_spec,
                                hgnetv2_options, is_stage_rows)


def build_dfine(
    num_classes: int = 80,
    backbone: BackboneSpec | Mapping[str, Any] | str | Backbone | None = None,
    encoder: EncoderOptions | Mapping[str, Any] | None = None,
    decoder: FDRDecoderOptions | Mapping[str, Any] | None = None,
    denoising: DenoisingOptions | Mapping[str, Any] | None = None,
    loss: FineGrainedLossOptions | Mapping[str, Any] | None = None,
    num_select: int = 300,
    input_norm: str = "imagenet",
    tables: str = "original",
    pretrained_cfg: PretrainedCfg | Mapping[str, Any] | None = None,
    base: Mapping[str, Any] | None = None,
) -> DFINE:
    """A :class:`DFINE` from its option sections (each a mapping of the fields it changes, over ``base``'s).

    Args:
        num_classes: K (COCO 80).
        backbone: a :class:`~visiontf.models.backbones.spec.BackboneSpec` (its mapping, or a registered backbone name:
            ``hgnetv2_b0``..``hgnetv2_b6`` for the published models) over the variant's, or a built Backbone. The former
            :class:`~visiontf.models.dfine.dfine_options.HGNetV2Options` spelling is read with one ``FutureWarning``
            (:mod:`~visiontf.models.rtdetr.backbone_section`).
        encoder, denoising: RT-DETR's sections (:mod:`visiontf.models.rtdetr.rtdetr_options`).
        decoder: :class:`~visiontf.models.dfine.dfine_options.FDRDecoderOptions` fields.
        loss: :class:`~visiontf.models.set_loss_options.FineGrainedLossOptions` fields over the variant's (D-FINE's
            or DEIM's).
        num_select, input_norm, tables, pretrained_cfg: as :func:`~visiontf.models.rtdetr.rtdetr.build_rtdetr`'s.
        base: the variant's own sections (a registered name's), under those given.
    """
    if tables not in TABLES:
        raise ValueError(f"tables must be one of {TABLES}, got {tables!r}")
    base = base or {}
    opts_encoder = section(EncoderOptions, encoder, section(EncoderOptions, base.get("encoder"), where="encoder"), "encoder")
    opts_decoder = section(FDRDecoderOptions, decoder, section(FDRDecoderOptions, base.get("decoder"), where="decoder"), "decoder")
    opts_dn = section(DenoisingOptions, denoising, section(DenoisingOptions, base.get("denoising"), where="denoising"), "denoising")
    opts_loss = section(FineGrainedLossOptions, loss, section(FineGrainedLossOptions, base.get("loss"), DFINE_LOSS, "loss"), "loss")
    spec = backbone_section(backbone, base.get("backbone"), HGNETV2_DEFAULT, HGNETV2_FORMER)
    # without stages: the backbone's last maps of strides 8, 16, 32, or as many as the decoder attends to (D-FINE-N's 2)
    body = spec if isinstance(spec, Backbone) else spec.build(num_levels=min(3, opts_decoder.num_levels), min_stride=8)
    check_pyramid(body)
    check_pyramid_levels(body, spec, opts_decoder.num_levels)
    check_sections(None, opts_encoder, opts_decoder, opts_dn)
    check_fdr_sections(None, opts_decoder)
    hybrid = HybridEncoder(list(body.channels), opts_encoder, tables)
    dec = DFineDecoder([opts_encoder.hidden_dim] * len(body.channels), num_classes, opts_decoder, opts_dn.num_denoising, tables)
    generator = None
    if opts_dn.num_denoising > 0:
        generator = ContrastiveDenoising(opts_dn.num_denoising, opts_dn.label_noise_ratio, opts_dn.box_noise_scale,
                                         inverse_sigmoid_eps=INVERSE_SIGMOID_EPS, pad_box="zero", flip_negative_sizes=True)
    model = DFINE(body, hybrid, dec, num_classes, generator, input_norm, PostprocessOptions(num_select), pretrained_cfg, opts_loss)
    model.options = {"backbone": None if isinstance(spec, Backbone) else spec, "encoder": opts_encoder, "decoder": opts_decoder, "denoising": opts_dn, "loss": opts_loss}
    return model


# ------------------------------------------------------------------------------------ registry
#: D-FINE's encoder blocks (every published model)
FUSION = {"fusion_block": "elan", "lateral_act": False, "downsample": "scdown"}
#: backbones: N, S and M train their BatchNorm and everything (and use the learnable affine blocks); L and X freeze the stem
#: and the norms (BackboneSpec; the learnable affine blocks are the architecture's own: B0-B3)
B0 = {"name": "hgnetv2_b0", "frozen_bn": False, "freeze_stem": False}
B2 = {"name": "hgnetv2_b2", "frozen_bn": False, "freeze_stem": False}
B4 = {"name": "hgnetv2_b4"}
B5 = {"name": "hgnetv2_b5"}

#: the published models (COCO, 80 classes, 640 x 640; Peterande/D-FINE configs/dfine/dfine_hgnetv2_*_coco.yml)
_VARIANTS: dict[str, dict[str, Any]] = {
    # 42.8 AP: B0's last two stages, d 128, AIFI on the coarser of 2 levels, 3 decoder layers, 6 points per level
    "dfine_n": dict(backbone={**B0, "stages": (3, 4)},
                    encoder={**FUSION, "hidden_dim": 128, "dim_feedforward": 512, "aifi_levels": (1,), "expansion": 0.34, "depth_mult": 0.5},
                    decoder={"hidden_dim": 128, "dim_feedforward": 512, "num_levels": 2, "num_layers": 3, "num_points": (6, 6)}),
    "dfine_s": dict(backbone=B0, encoder={**FUSION, "expansion": 0.5, "depth_mult": 0.34}, decoder={"num_layers": 3}),   # 48.5 AP
    "dfine_m": dict(backbone=B2, encoder={**FUSION, "depth_mult": 0.67}, decoder={"num_layers": 4}),                    # 52.3 AP
    "dfine_l": dict(backbone=B4, encoder=FUSION, decoder={}),                                                          # 54.0 AP
    "dfine_x": dict(backbone=B5, encoder={**FUSION, "hidden_dim": 384, "dim_feedforward": 2048}, decoder={"reg_scale": 8.0}),  # 55.8 AP
}
#: DEIM's D-FINE models (ShihuaHuang95/DEIM configs/deim_dfine/deim_hgnetv2_*_coco.yml): SiLU in the decoder's FFNs, MLP heads
#: and quality estimators, every backbone's BatchNorm trained and nothing frozen, the matchability-aware loss
_VARIANTS |= {
    "deim_" + name: {**cfg, "backbone": {**cfg["backbone"], "frozen_bn": False, "freeze_stem": False},
                     "decoder": {**cfg["decoder"], "activation": "silu", "mlp_act": "silu"}, "loss": {"class_loss": "mal", "class_gamma": 1.5}}
    for name, cfg in list(_VARIANTS.items())
}  # 43.0, 49.0, 52.7, 54.7, 56.5 AP
#: a CPU-sized D-FINE trained from scratch (configs/dfine/dfine_tiny_shapes.yaml): a narrow HGNetv2 (B0's layout at a third
#: of its widths, one block per stage), d 128, 1 AIFI layer, one RepVGG block per branch, 3 decoder layers, 100 queries,
#: 50 denoising slots, reg_max 16
_VARIANTS["dfine_tiny"] = dict(
    backbone={**B0, "channels_last": True,
              "kwargs": {"stem": (16, 16), "stages": ((16, 16, 32, 1, False, False, 3, 2), (32, 16, 96, 1, True, False, 3, 2),
                                                      (96, 32, 192, 1, True, True, 5, 2), (192, 48, 256, 1, True, True, 5, 2))}},
    encoder={**FUSION, "hidden_dim": 128, "nhead": 4, "dim_feedforward": 256, "expansion": 0.5, "depth_mult": 1 / 3},
    decoder={"hidden_dim": 128, "nhead": 4, "dim_feedforward": 256, "num_layers": 3, "num_queries": 100, "num_points": (3, 6, 3),
             "reg_max": 16},
    denoising={"num_denoising": 50}, num_select=100)

_STORAGE = "https://github.com/Peterande/storage/releases/download/dfinev1.0/"
#: the released files: D-FINE's GitHub release assets; DEIM's on Google Drive (the README's links)
_FILES = {f"dfine_{s}": f"{_STORAGE}dfine_{s}_coco.pth" for s in "nsmlx"}
_FILES |= {
    "deim_dfine_n": "https://drive.google.com/file/d/1ZPEhiU9nhW4M5jLnYOFwTSLQC1Ugf62e",
    "deim_dfine_s": "https://drive.google.com/file/d/1tB8gVJNrfb6dhFvoHJECKOF5VpkthhfC",
    "deim_dfine_m": "https://drive.google.com/file/d/18Lj2a6UN6k_n_UzqnJyiaiLGpDzQQit8",
    "deim_dfine_l": "https://drive.google.com/file/d/1PIRf02XkrA2xAD3wEiKE2FaamZgSGTAr",
    "deim_dfine_x": "https://drive.google.com/file/d/1dPtbgtGgq1Oa7k_LgH1GXPelg1IVeu0j",
}

DEFAULT_CFGS: dict[str, ModelCfg] = {
    name: ModelCfg(cfg, PretrainedCfg(url=_FILES[name]) if name in _FILES else PretrainedCfg()) for name, cfg in _VARIANTS.items()
}
SECTIONS = ("backbone", "encoder", "decoder", "denoising", "loss")


def _create(name: str, **kwargs: Any) -> DFINE:
    """The variant ``name`` with ``kwargs`` on top: each section merged field by field with the variant's."""
    cfg = DEFAULT_CFGS[name]
    flat = {k: v for k, v in cfg.kwargs.items() if k not in SECTIONS}
    pretrained = cfg.pretrained_cfg.merged(kwargs.pop("pretrained_cfg", None))
    return build_dfine(**{**flat, **kwargs}, base={k: cfg.kwargs.get(k) for k in SECTIONS}, pretrained_cfg=pretrained)


#: the registry-wide test's settings: the variant's layout at a narrow HGNetv2 (4-32 channels, one block and layer per
#: stage), d 32, 3 decoder layers, 5 queries, 4 denoising slots, 8 bins per edge
TEST_SETTINGS = dict(
    test_kwargs=dict(backbone={"kwargs": {"stem": (4, 4), "stages": ((4, 4, 8, 1, False, False, 3, 1), (8, 4, 16, 1, True, False, 3, 1),
                                                                    (16, 8, 32, 1, True, True, 5, 1), (32, 8, 32, 1, True, True, 5, 1))}},
                     encoder={"hidden_dim": 32, "nhead": 2, "dim_feedforward": 32},
                     decoder={"hidden_dim": 32, "nhead": 2, "dim_feedforward": 32, "num_layers": 3, "num_queries": 5, "reg_max": 8},
                     denoising={"num_denoising": 4}, num_select=5),
    test_image_size=(64, 64))


def _registered(fn):
    return register_model(tags=("detection", "dfine"), filter_fn=convert_state_dict, **TEST_SETTINGS)(fn)


@_registered
def dfine_n(**kwargs) -> DFINE:
    """D-FINE-N: HGNetv2-B0, 2 levels, d 128, 3 decoder layers (42.8 COCO AP, 4 M parameters, 2.12 ms on a T4)."""
    return _create("dfine_n", **kwargs)


@_registered
def dfine_s(**kwargs) -> DFINE:
    """D-FINE-S: HGNetv2-B0, 3 decoder layers (48.5 COCO AP; Objects365 then COCO 50.7; 10 M parameters, 3.49 ms)."""
    return _create("dfine_s", **kwargs)


@_registered
def dfine_m(**kwargs) -> DFINE:
    """D-FINE-M: HGNetv2-B2, 4 decoder layers (52.3 COCO AP; Objects365 then COCO 55.1; 19 M parameters, 5.62 ms)."""
    return _create("dfine_m", **kwargs)


@_registered
def dfine_l(**kwargs) -> DFINE:
    """D-FINE-L: HGNetv2-B4, 6 decoder layers (54.0 COCO AP; Objects365 then COCO 57.3; 31 M parameters, 8.07 ms)."""
    return _create("dfine_l", **kwargs)


@_registered
def dfine_x(**kwargs) -> DFINE:
    """D-FINE-X: HGNetv2-B5, encoder width 384 (55.8 COCO AP; Objects365 then COCO 59.3; 62 M parameters, 12.89 ms)."""
    return _create("dfine_x", **kwargs)


@_registered
def deim_dfine_n(**kwargs) -> DFINE:
    """DEIM-D-FINE-N: D-FINE-N trained with DEIM (43.0 COCO AP)."""
    return _create("deim_dfine_n", **kwargs)


@_registered
def deim_dfine_s(**kwargs) -> DFINE:
    """DEIM-D-FINE-S: D-FINE-S trained with DEIM (49.0 COCO AP)."""
    return _create("deim_dfine_s", **kwargs)


@_registered
def deim_dfine_m(**kwargs) -> DFINE:
    """DEIM-D-FINE-M: D-FINE-M trained with DEIM (52.7 COCO AP)."""
    return _create("deim_dfine_m", **kwargs)


@_registered
def deim_dfine_l(**kwargs) -> DFINE:
    """DEIM-D-FINE-L: D-FINE-L trained with DEIM (54.7 COCO AP)."""
    return _create("deim_dfine_l", **kwargs)


@_registered
def deim_dfine_x(**kwargs) -> DFINE:
    """DEIM-D-FINE-X: D-FINE-X trained with DEIM (56.5 COCO AP)."""
    return _create("deim_dfine_x", **kwargs)


@_registered
def dfine_tiny(**kwargs) -> DFINE:
    """A CPU-sized D-FINE trained from scratch (configs/dfine/dfine_tiny_shapes.yaml): a narrow HGNetv2, d 128."""
    return _create("dfine_tiny", **kwargs)
