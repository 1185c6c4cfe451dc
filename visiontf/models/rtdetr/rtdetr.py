"""RT-DETR and RT-DETRv2 (Zhao et al., CVPR 2024; Lv et al., 2024), the real-time DETRs of lyuwenyu/RT-DETR.

A ResNet-vd backbone (strides 8, 16, 32), the hybrid encoder (:mod:`~visiontf.models.rtdetr.hybrid_encoder`:
attention on the coarsest map, convolutional fusion across scales), IoU-aware query selection and a deformable
decoder with denoising groups in training (:mod:`~visiontf.models.rtdetr.rtdetr_decoder`). No NMS: every query
predicts one object, scored by sigmoid class scores trained with the varifocal loss.

v1 and v2 are one network here. RT-DETRv2 adds options to the deformable attention (sampling points per level,
discrete sampling for TensorRT 8.4, :class:`~visiontf.nn.MSDeformAttn`) and a better training recipe; its
published models have the v1 architecture with ``num_points`` as a list. Both originals' checkpoints and
transformers' load through :mod:`~visiontf.models.rtdetr.convert` (``create_model(name, pretrained=path)``).

The model takes its settings as typed sections (:mod:`~visiontf.models.rtdetr.rtdetr_options`): ``backbone``,
``encoder``, ``decoder``, ``denoising``; a config's ``model_kwargs`` gives each as a mapping of the fields
it changes.

Padding: the originals have no padding mask (they resize every image to 640 x 640). Here the network runs on
the padded batch exactly as theirs, and a ``mask`` only says where each image ends: the boxes (and, in
training, the ground truth the denoising queries are built from) are converted between the padded canvas and
each image's own extent, so the outputs are relative to each unpadded image as every visiontf detector's.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from torch import Tensor, nn

from visiontf.models._registry import register_model
from visiontf.models.backbones.backbone import SIMPLEFPN_PREFIX, Backbone, BackboneLayerDepth, pad_to_multiple
from visiontf.models.backbones.spec import BackboneSpec
from visiontf.models.contract import Detector, ModelCfg, PretrainedCfg, check_detection_targets
from visiontf.models.deformable_detr.denoising import ContrastiveDenoising, DenoisingQueries
from visiontf.models.postprocess_options import PostprocessOptions
from visiontf.models.rtdetr.backbone_section import FormerBackbone, backbone_section
from visiontf.models.rtdetr.convert import convert_state_dict
from visiontf.models.rtdetr.hybrid_encoder import HybridEncoder
from visiontf.models.rtdetr.rtdetr_decoder import INVERSE_SIGMOID_EPS, DecoderOutput, ImageTooSmallError, RTDetrDecoder
from visiontf.models.rtdetr.rtdetr_options import (
    DecoderOptions,
    DenoisingOptions,
    EncoderOptions,
    ResNetVdOptions,
    check_sections,
    resnet_vd_options,
    resnet_vd_spec,
    section,
)
from visiontf.models.set_loss_options import SetLossOptions
from visiontf.nn.cpu_convolution import use_onednn_convolutions
from visiontf.nn.ms_deform_attn import recording_sampling
from visiontf.nn.ms_deform_tables import tracing_shapes

__all__ = ["DEFAULT_CFGS", "DEIM_RTDETR_LOSS", "RTDETR", "RTDETR_LOSS", "build_rtdetr"]

#: RT-DETR's matcher and loss (``RTDETRCriterionv2`` in its configs): focal matching cost class 2, L1 5, GIoU 2
#: (alpha 0.25, gamma 2); varifocal loss (alpha 0.75, gamma 2) weight 1, L1 5, GIoU 2
RTDETR_LOSS = SetLossOptions(class_loss="vfl", cost_class=2.0, cost_bbox=5.0, cost_giou=2.0, focal_alpha=0.25, focal_gamma=2.0,
                             loss_class=1.0, loss_bbox=5.0, loss_giou=2.0)
#: DEIM's for its RT-DETRv2 models (``DEIMCriterion`` with ``configs/base/rt_deim.yml``: losses mal and boxes, no union of
#: the layers' matchings): the matchability-aware loss with gamma 1.5 (weight 1), L1 5, GIoU 2; RT-DETR's matcher
DEIM_RTDETR_LOSS = dataclasses.replace(RTDETR_LOSS, class_loss="mal", class_gamma=1.5)

#: the originals' input: RGB in [0, 1] (no mean / std), 640 x 640
UNIT_RANGE = PretrainedCfg(mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0), min_size=640, max_size=640)
#: visiontf's data modules give ImageNet-normalised images: the model takes them back to [0, 1]
IMAGENET_INPUT = PretrainedCfg(mean=tuple(IMAGENET_DEFAULT_MEAN), std=tuple(IMAGENET_DEFAULT_STD), min_size=640, max_size=640)
INPUT_NORMS = ("imagenet", "none")
TABLES = ("original", "transformers")
#: the originals keep 300 detections per image (RTDETRPostProcessor num_top_queries), no NMS
RTDETR_POSTPROCESS = PostprocessOptions(300)


def _valid_ratios(mask: Tensor | None, height: int, width: int) -> Tensor | None:
    """(B, 4) each image's unpadded fraction (w, h, w, h) of the padded canvas, or None when nothing is padded."""
    if mask is None:
        return None
    valid = ~mask.bool()
    w = valid.any(1).sum(-1).float() / width
    h = valid.any(2).sum(-1).float() / height
    ratios = torch.stack([w, h, w, h], -1)
    return None if bool((ratios == 1).all()) else ratios


class RTDETR(BackboneLayerDepth, Detector):
    """RT-DETR / RT-DETRv2 built from its parts.

    Args:
        backbone: a :class:`~visiontf.models.backbones.backbone.Backbone` (ResNet-vd for the published models).
        encoder: the :class:`~visiontf.models.rtdetr.hybrid_encoder.HybridEncoder`.
        decoder: the :class:`~visiontf.models.rtdetr.rtdetr_decoder.RTDetrDecoder` (query selection, decoder, heads).
        num_classes: K sigmoid classes (COCO: 80, the originals' contiguous labels).
        denoising: the denoising generator in training (None: none).
        input_norm: ``"imagenet"``: images come ImageNet-normalised (visiontf's data modules and Predictor) and are
            taken back to [0, 1] before the backbone; ``"none"``: images come in [0, 1], as the originals take them.
        postprocess_options: detections per image (the originals' 300), no NMS.
        pretrained_cfg: eval settings (640 pixels; the mean and std of ``input_norm``).
        loss: the family's matcher and set loss (:data:`RTDETR_LOSS`; DEIM's models :data:`DEIM_RTDETR_LOSS`).
    """

    class_head = "sigmoid"
    head_prefixes = ("decoder.enc_score_head.", "decoder.score_heads.", "decoder.denoising_class_embed.")
    forward_takes_targets = True
    attention_picture = "sampling_points"

    def __init__(
        self,
        backbone: Backbone,
        encoder: HybridEncoder,
        decoder: RTDetrDecoder,
        num_classes: int,
        denoising: ContrastiveDenoising | None = None,
        input_norm: str = "imagenet",
        postprocess_options: PostprocessOptions = RTDETR_POSTPROCESS,
        pretrained_cfg: PretrainedCfg | Mapping[str, Any] | None = None,
        loss: SetLossOptions = RTDETR_LOSS,
    ) -> None:
        super().__init__()
        if input_norm not in INPUT_NORMS:
            raise ValueError(f"input_norm must be one of {INPUT_NORMS}, got {input_norm!r}")
        if num_classes < 1:
            raise ValueError(f"num_classes must be >= 1, got {num_classes}")
        if decoder.num_classes != num_classes:
            raise ValueError(f"the decoder has {decoder.num_classes} classes, the model {num_classes}")
        if (denoising is None) != (decoder.denoising_class_embed is None):
            raise ValueError("denoising and the decoder's denoising label embedding go together (num_denoising > 0 builds both)")
        check_pyramid(backbone)
        self.backbone, self.encoder, self.decoder = backbone, encoder, decoder
        # the fusion upsamples each level 2x onto the next, so the maps' sizes must halve exactly: images are padded
        # to a multiple of the coarsest stride as well as to the backbone's own multiple (a patch, a window)
        self.pad_multiple = math.lcm(backbone.pad_multiple, max(backbone.strides))
        self.num_classes = num_classes
        self.denoising = denoising
        self.input_norm = input_norm
        self.postprocess_options = postprocess_options
        self.loss_options = loss
        base = IMAGENET_INPUT if input_norm == "imagenet" else UNIT_RANGE
        self.pretrained_cfg = base.merged(pretrained_cfg)
        mean, std = (IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD) if input_norm == "imagenet" else ((0.0,) * 3, (1.0,) * 3)
        self.register_buffer("pixel_mean", torch.tensor(mean).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("pixel_std", torch.tensor(std).view(1, 3, 1, 1), persistent=False)
        # oneDNN for every float32 convolution in inference on the CPU (PyTorch sends one thread's 1 x 1 ones to BLAS)
        use_onednn_convolutions(self)
        backbone.share_layout(encoder, decoder)

    # ------------------------------------------------------------------------------------ contract
    def set_loss_options(self) -> SetLossOptions:
        """The family's matcher and loss (``visiontf.set_prediction.build_criterion`` reads them): RT-DETR's varifocal
        loss, or DEIM's matchability-aware loss for its models."""
        return self.loss_options

    def transformer_modules(self) -> tuple[nn.Module, ...]:
        return (self.encoder, self.decoder)

    def param_group(self, name: str) -> str:
        """``"backbone"`` (the backbone's own answer) or ``"default"``; RT-DETR has no separate lr for sampling offsets."""
        if name.startswith("backbone."):
            return self.backbone.param_group(name[len("backbone."):])
        return "default"

    def set_attn_method(self, method: str) -> None:
        """Every deformable attention's core: ``"gather"``, ``"triton"`` or ``"grid_sample"`` (ONNX export)."""
        for layer in self.decoder.layers:
            layer.cross_attn.method = method

    def fuse_repvgg(self) -> int:
        """Fold the encoder's RepVGG blocks into single convolutions for inference (eval mode); returns how many."""
        return self.encoder.fuse_repvgg()

    def fuse_for_inference(self) -> dict[str, int]:
        """Fold every BatchNorm into its convolution and the RepVGG blocks into one convolution each, in place
        (:func:`visiontf.models.rtdetr.deploy.fuse_for_inference`); the folds made per part."""
        from visiontf.models.rtdetr.deploy import fuse_for_inference

        return fuse_for_inference(self)

    # ------------------------------------------------------------------------------------ forward
    def _outputs(self, dec: DecoderOutput, dn: DenoisingQueries | None, to_image: Callable[[Tensor], Tensor]) -> dict:
        """The output dict of :meth:`forward` from the decoder's (``to_image``: padded canvas -> each image's boxes)."""
        P = dn.meta.pad_size if dn is not None else 0
        logits, boxes = dec.logits, to_image(dec.boxes)
        out: dict = {"pred_logits": logits[-1, :, P:], "pred_boxes": boxes[-1, :, P:]}
        if self.training:
            if self.decoder.options.aux_loss:
                out["aux_outputs"] = [{"pred_logits": a[:, P:], "pred_boxes": b[:, P:]} for a, b in zip(logits[:-1], boxes[:-1])]
                out["interm_outputs"] = {"pred_logits": dec.proposal_logits, "pred_boxes": to_image(dec.proposal_boxes)}
            if dec.one_to_many is not None:
                many_logits, many_boxes = dec.one_to_many[0], to_image(dec.one_to_many[1])
                out["one_to_many_outputs"] = {"pred_logits": many_logits[-1], "pred_boxes": many_boxes[-1]}
                if self.decoder.options.aux_loss:
                    out["one_to_many_outputs"]["aux_outputs"] = [{"pred_logits": a, "pred_boxes": b}
                                                                 for a, b in zip(many_logits[:-1], many_boxes[:-1])]
            if dn is not None:
                out["dn_outputs"] = {"pred_logits": logits[-1, :, :P], "pred_boxes": boxes[-1, :, :P]}
                if self.decoder.options.aux_loss:
                    out["dn_outputs"]["aux_outputs"] = [{"pred_logits": a[:, :P], "pred_boxes": b[:, :P]} for a, b in zip(logits[:-1], boxes[:-1])]
                out["dn_meta"] = dn.meta
            if P == 0 and self.decoder.denoising_class_embed is not None:
                # every parameter takes part in every step, also when this process's images have no box and so no
                # denoising query (plain DDP waits forever for the missing gradient), as DINO's label_enc.weight[0, 0] * 0
                out["pred_logits"] = out["pred_logits"] + 0.0 * self.decoder.denoising_class_embed.weight[0, 0]
        return out

    def forward(self, images: Tensor, mask: Tensor | None = None, targets: Sequence[dict] | None = None,
                need_weights: bool = False) -> dict:
        """Detect objects.

        Args:
            images: (B, 3, H, W), normalised as ``input_norm`` says, zero-padded to a common size.
            mask: (B, H, W) bool, True on padding; None when nothing is padded. Sizes that are not a multiple of the
                coarsest stride (32) are zero-padded to one (bottom and right), as padding.
            targets: training only: per image ``labels`` (N,) and ``boxes`` (N, 4) normalised cxcywh, from which the
                denoising queries are built.
            need_weights: also return the last decoder layer's sampling locations and weights (the attention picture).

        Returns:
            ``pred_logits`` (B, Q, K) and ``pred_boxes`` (B, Q, 4) cxcywh relative to each unpadded image, in
            evaluation of the ``eval_idx`` layer. In training also ``aux_outputs`` (every other layer),
            ``interm_outputs`` (the selected proposals, supervised with the class labels), with denoising
            ``dn_outputs`` and ``dn_meta``, and with ``num_one_to_many_queries`` ``one_to_many_outputs`` (hybrid
            matching's queries: ``pred_logits``, ``pred_boxes`` and their ``aux_outputs``).

            With ``need_weights`` also, from the decoder layer the outputs come from: ``dec_sampling_locations``,
            float32 normalised (x, y) over each level's map of the padded canvas, as its attention core receives them, and
            ``dec_attention_weights`` (softmax over all of a head's samples): (B, Q, heads, L, P, 2) and (B, Q, heads, L, P)
            when every level has P points (as Deformable DETR's), else (B, Q, heads, J, 2) and (B, Q, heads, J) with
            J = sum of the counts, ordered level then point (RT-DETRv2's, D-FINE's (3, 6, 3));
            ``dec_sampling_points`` the count of each level; ``dec_sampling_mode`` ``"bilinear"`` or ``"discrete"`` (each
            sample reads the cell ``floor(x * W_l + 0.5)``); ``dec_reference_points`` (B, Q, 4) that layer's reference
            boxes relative to each unpadded image; ``spatial_shapes`` [(H_l, W_l)]. D-FINE's attention has no value or
            output projection; its sampling is the same.
        """
        if images.dim() != 4 or images.shape[1] != 3:
            raise ValueError(f"RT-DETR expects images of shape (B, 3, H, W), got {tuple(images.shape)}")
        B, _, H, W = images.shape
        if mask is not None and tuple(mask.shape) != (B, H, W):
            raise ValueError(f"mask must have shape (B, H, W) = {(B, H, W)} (True on padding), got {tuple(mask.shape)}")
        if self.training and self.denoising is not None and targets is not None:
            # the denoising queries are built from the targets before the criterion, which checks them otherwise
            check_detection_targets(targets, B, type(self).__name__)
        # sizes padded to pad_multiple (the originals take 640 x 640 only); the padding is padding for the boxes too
        padded = pad_to_multiple(self.backbone.pad(images), self.pad_multiple)
        if padded.shape[-2:] != images.shape[-2:] and mask is None:
            mask = torch.zeros((B, H, W), dtype=torch.bool, device=images.device)
        if mask is not None:
            mask = pad_to_multiple(self.backbone.pad(mask.bool(), value=True), self.pad_multiple, value=True)
        images = padded
        if not tracing_shapes():
            # before the backbone: a map of one pixel per channel fails BatchNorm in training with a message naming
            # nothing, where too few positions is the user's problem (the check is the decoder's own, on the most
            # positions the backbone's maps and the decoder's extra levels can give)
            shapes = [(images.shape[-2] // s, images.shape[-1] // s) for s in self.backbone.strides]
            while len(shapes) < self.decoder.options.num_levels:
                shapes.append(((shapes[-1][0] + 1) // 2, (shapes[-1][1] + 1) // 2))
            self.decoder.check_positions(shapes)
            if self.training and B * min(h * w for h, w in shapes) == 1:
                raise ImageTooSmallError(
                    f"a training batch of one {H} x {W} image gives the {shapes[-1][0]} x {shapes[-1][1]} map of the coarsest "
                    "level one value per channel, which BatchNorm cannot normalise in training; train with "
                    "data.init_args.batch_size 2 or more, or larger images (data.init_args.scales)")
        ratios = _valid_ratios(mask, *images.shape[-2:])
        x = images * self.pixel_std.to(images.dtype) + self.pixel_mean.to(images.dtype) if self.input_norm == "imagenet" else images
        feats = self.encoder(self.backbone.forward_maps(x))
        dn = None
        if self.training and self.denoising is not None and targets is not None:
            canvas = targets if ratios is None else [{**t, "boxes": t["boxes"].reshape(-1, 4) * r.to(t["boxes"].dtype)}
                                                     for t, r in zip(targets, ratios)]
            dn = self.denoising(canvas, self.num_classes, self.decoder.options.num_queries)
        sampled: list[tuple[Tensor, Tensor]] = []
        layer = self.decoder.layers[-1 if self.training else self.decoder.options.eval_idx].cross_attn
        with recording_sampling(layer, sampled) if need_weights else contextlib.nullcontext():
            dec = self.decoder(feats, dn)
        to_image = (lambda b: b) if ratios is None else (lambda b: b / ratios[:, None].to(b.dtype))  # noqa: E731
        P = dn.meta.pad_size if dn is not None else 0
        out = self._outputs(dec, dn, to_image)
        if need_weights:
            loc, weights = sampled[0]  # the one-to-one queries' pass (hybrid matching's one-to-many pass comes after)
            points = tuple(layer.points_per_level or (layer.n_points,) * layer.n_levels)
            if loc.dim() == 5 and len(set(points)) == 1:  # one count on every level: Deformable DETR's (L, P) layout
                loc = loc.unflatten(3, (len(points), points[0]))
                weights = weights.unflatten(3, (len(points), points[0]))
            out.update(dec_sampling_locations=loc[:, P:], dec_attention_weights=weights[:, P:], dec_sampling_points=points,
                       dec_sampling_mode=layer.sampling_mode, dec_reference_points=to_image(dec.references)[:, P:].float(),
                       spatial_shapes=list(dec.spatial_shapes))
        return out


# ------------------------------------------------------------------------------------ building
#: the backbone when neither the config nor the variant names one: RT-DETR's R50-vd (the stem frozen, FrozenBatchNorm)
RESNET_VD_DEFAULT = BackboneSpec(name="resnet50vd", stages=(2, 3, 4), kwargs={"frozen_stages": 0})
#: the backbone section's former spelling (ResNetVdOptions), still read
RESNET_VD_FORMER = FormerBackbone(ResNetVdOptions, frozenset({"depth", "out_stages", "freeze_at", "stem_width", "widths", "blocks"}),
                                  resnet_vd_spec, resnet_vd_options)


def build_rtdetr(
    num_classes: int = 80,
    backbone: BackboneSpec | Mapping[str, Any] | str | Backbone | None = None,
    encoder: EncoderOptions | Mapping[str, Any] | None = None,
    decoder: DecoderOptions | Mapping[str, Any] | None = None,
    denoising: DenoisingOptions | Mapping[str, Any] | None = None,
    num_select: int = 300,
    input_norm: str = "imagenet",
    tables: str = "original",
    pretrained_cfg: PretrainedCfg | Mapping[str, Any] | None = None,
    base: Mapping[str, Any] | None = None,
    loss: SetLossOptions | Mapping[str, Any] | None = None,
) -> RTDETR:
    """An :class:`RTDETR` from its option sections (each a mapping of the fields it changes, over ``base``'s).

    Args:
        num_classes: K (COCO 80).
        backbone: a :class:`~visiontf.models.backbones.spec.BackboneSpec` (its mapping, or a registered backbone name:
            ``resnet{18,34,50,101}vd`` for the published models) over the variant's, or a built Backbone. The former
            :class:`~visiontf.models.rtdetr.rtdetr_options.ResNetVdOptions` spelling is read with one ``FutureWarning``
            (:mod:`~visiontf.models.rtdetr.backbone_section`).
        encoder, decoder, denoising: the other sections (:mod:`~visiontf.models.rtdetr.rtdetr_options`); a
            ``num_denoising`` of 0 builds no denoising.
        num_select: detections per image (the originals' 300).
        input_norm: ``"imagenet"`` (visiontf's pipelines) or ``"none"`` (images in [0, 1], the originals').
        tables: ``"original"`` (the originals' fixed tables: the AIFI position embedding's layout on non-square maps,
            float32 anchors and embedding) or ``"transformers"`` (transformers' rewrite of them).
        base: the variant's own sections (a registered name's), under those given.
        loss: :class:`~visiontf.models.set_loss_options.SetLossOptions` fields over the variant's (RT-DETR's
            varifocal loss, DEIM's matchability-aware loss).
    """
    if tables not in TABLES:
        raise ValueError(f"tables must be one of {TABLES}, got {tables!r}")
    base = base or {}
    opts_loss = section(SetLossOptions, loss, section(SetLossOptions, base.get("loss"), RTDETR_LOSS, "loss"), "loss")
    opts_encoder = section(EncoderOptions, encoder, section(EncoderOptions, base.get("encoder"), where="encoder"), "encoder")
    opts_decoder = section(DecoderOptions, decoder, section(DecoderOptions, base.get("decoder"), where="decoder"), "decoder")
    opts_dn = section(DenoisingOptions, denoising, section(DenoisingOptions, base.get("denoising"), where="denoising"), "denoising")
    spec = backbone_section(backbone, base.get("backbone"), RESNET_VD_DEFAULT, RESNET_VD_FORMER)
    # without stages: the backbone's last maps of strides 8, 16, 32, or as many as the decoder attends to (D-FINE-N's 2)
    body = spec if isinstance(spec, Backbone) else spec.build(num_levels=min(3, opts_decoder.num_levels), min_stride=8)
    check_pyramid(body)
    check_pyramid_levels(body, spec, opts_decoder.num_levels)
    check_sections(None, opts_encoder, opts_decoder, opts_dn)
    hybrid = HybridEncoder(list(body.channels), opts_encoder, tables)
    dec = RTDetrDecoder([opts_encoder.hidden_dim] * len(body.channels), num_classes, opts_decoder, opts_dn.num_denoising, tables)
    generator = None
    if opts_dn.num_denoising > 0:
        generator = ContrastiveDenoising(opts_dn.num_denoising, opts_dn.label_noise_ratio, opts_dn.box_noise_scale,
                                         inverse_sigmoid_eps=INVERSE_SIGMOID_EPS, pad_box="zero",
                                         flip_negative_sizes=opts_dn.flip_negative_sizes)
    model = RTDETR(body, hybrid, dec, num_classes, generator, input_norm, PostprocessOptions(num_select), pretrained_cfg, opts_loss)
    model.options = {"backbone": None if isinstance(spec, Backbone) else spec, "encoder": opts_encoder,
                     "decoder": opts_decoder, "denoising": opts_dn, "loss": opts_loss}
    return model


def check_pyramid(backbone: Backbone) -> None:
    """The hybrid encoder fuses maps whose strides double level to level; refuse others naming the field."""
    strides = tuple(backbone.strides)
    if any(b != 2 * a for a, b in zip(strides, strides[1:])):
        raise ValueError(
            f"backbone: the hybrid encoder fuses maps whose strides double level to level (8, 16, 32), but this "
            f"backbone's maps have strides {strides}; pick features that do (backbone.stages), or, for a plain "
            "ViT (one stride), its simple feature pyramid: backbone: {name: 'simplefpn:<the ViT>', kwargs: {top_block: false}}")


def check_pyramid_levels(backbone: Backbone, spec: BackboneSpec | Backbone, num_levels: int) -> None:
    """A simple feature pyramid keeps its levels whatever it is asked for (its top block adds a fourth): where the
    decoder attends to fewer, say how to drop the top one before the decoder refuses the count."""
    levels = len(backbone.channels)
    if levels <= num_levels or isinstance(spec, Backbone) or not spec.name.startswith(SIMPLEFPN_PREFIX):
        return
    fixes = [f"set decoder.num_levels: {levels} (and its num_points, one per level)"]
    if num_levels == levels - 1:
        fixes.insert(0, "build the pyramid without it, backbone: {name: '" + spec.name + "', kwargs: {top_block: false}} "
                        "(strides 8, 16, 32)")
    else:
        fixes.append(f"{levels - 1} without its top block (kwargs: {{top_block: false}})")
    raise ValueError(f"backbone: {spec.name} gives {levels} maps (strides {tuple(backbone.strides)}: its top block adds "
                     f"the last), but the decoder attends to num_levels={num_levels}; {', or '.join(fixes)}")


# ------------------------------------------------------------------------------------ registry
def _v2(decoder: Mapping[str, Any]) -> dict[str, Any]:
    """RT-DETRv2's decoder: its num_points list (points per level) over v1's count."""
    return {"num_points": (4, 4, 4), **decoder}


#: backbones (BackboneSpec): R18/R34 train their BatchNorm and everything; R50/R101 freeze the norms and the stem
R18 = {"name": "resnet18vd", "frozen_bn": False, "freeze_stem": False}
R34 = {"name": "resnet34vd", "frozen_bn": False, "freeze_stem": False}
R50 = {"name": "resnet50vd", "kwargs": {"frozen_stages": 0}}
R101 = {"name": "resnet101vd", "kwargs": {"frozen_stages": 0}}
SMALL_ENCODER = {"expansion": 0.5}
X_ENCODER = {"hidden_dim": 384, "dim_feedforward": 2048}

#: the published models (COCO, 80 classes, 640 x 640); v1 rtdetr_pytorch/configs/rtdetr, v2 rtdetrv2_pytorch/configs/rtdetrv2
_VARIANTS: dict[str, dict[str, Any]] = {
    "rtdetr_r18vd": dict(backbone=R18, encoder=SMALL_ENCODER, decoder={"num_layers": 3}),            # 46.5 AP, 20 M
    "rtdetr_r34vd": dict(backbone=R34, encoder=SMALL_ENCODER, decoder={"num_layers": 4}),            # 48.9 AP, 31 M
    "rtdetr_r50vd_m": dict(backbone=R50, encoder=SMALL_ENCODER, decoder={"eval_idx": 2}),           # 51.3 AP, 36 M
    "rtdetr_r50vd": dict(backbone=R50),                                                             # 53.1 AP, 42 M
    "rtdetr_r101vd": dict(backbone=R101, encoder=X_ENCODER),                                        # 54.3 AP, 76 M
}
_VARIANTS |= {
    "rtdetrv2_" + name[len("rtdetr_"):]: {**cfg, "decoder": _v2(cfg.get("decoder", {}))} for name, cfg in list(_VARIANTS.items())
}  # 48.1, 49.9, 51.9, 53.4, 54.3 AP
_VARIANTS |= {  # discrete sampling, fine-tuned from the bilinear models: 47.4, 49.2, 51.4, 52.9 AP
    name + "_dsp": {**_VARIANTS[name], "decoder": {**_VARIANTS[name]["decoder"], "sampling": "discrete"}}
    for name in ("rtdetrv2_r18vd", "rtdetrv2_r34vd", "rtdetrv2_r50vd_m", "rtdetrv2_r50vd")
}
#: DEIM's RT-DETRv2 models (ShihuaHuang95/DEIM configs/deim_rtdetrv2/deim_r*_coco.yml with configs/base/rt_deim.yml): v2's
#: networks with every backbone BatchNorm trained and nothing frozen, SiLU in the decoder's FFNs and MLP heads, the query
#: position MLP shaped as the box heads (``as_reg``), D-FINE's denoising boxes and the matchability-aware loss; its R50-vd-M
#: has 3 decoder layers (v2's has 6, evaluated at the 3rd)
DEIM_DECODER = {"activation": "silu", "mlp_act": "silu", "query_pos_method": "as_reg"}


def _deim_backbone(backbone: Mapping[str, Any]) -> dict[str, Any]:
    """The variant's ResNet-vd with every BatchNorm trained and nothing frozen (DEIM's ``PResNet: freeze_at -1,
    freeze_norm False``), in the section's spelling (a BackboneSpec mapping, or the former ResNetVdOptions fields)."""
    if "name" in backbone:
        kwargs = {**dict(backbone.get("kwargs") or {}), "frozen_stages": -1}
        return {**backbone, "frozen_bn": False, "freeze_stem": False, "kwargs": kwargs}
    return {**backbone, "frozen_bn": False, "freeze_at": -1}


_VARIANTS |= {
    "deim_" + name: {**cfg, "backbone": _deim_backbone(cfg["backbone"]),
                     "decoder": {**cfg["decoder"], **DEIM_DECODER, **({"num_layers": 3} if name.endswith("_m") else {})},
                     "denoising": {"flip_negative_sizes": True}, "loss": {"class_loss": "mal", "class_gamma": 1.5}}
    for name, cfg in list(_VARIANTS.items())
    if name.startswith("rtdetrv2_") and not name.endswith("_dsp")
}  # 49.0, 50.9, 53.2, 54.3, 55.5 AP
#: a CPU-sized model trained from scratch (configs/rtdetr/rtdetr_tiny_shapes.yaml): a narrow R18-vd (ordinary BatchNorm,
#: nothing frozen), d 128, 1 AIFI layer, one RepVGG block per fusion block, 3 decoder layers, 100 queries, 50 denoising
#: slots, RT-DETRv2's attention
_VARIANTS["rtdetr_tiny"] = dict(
    backbone={**R18, "channels_last": True, "kwargs": {"stem_width": 16, "widths": (32, 64, 128, 256), "blocks": (1, 1, 1, 1)}},
    encoder={"hidden_dim": 128, "nhead": 4, "dim_feedforward": 256, "expansion": 0.5, "depth_mult": 1 / 3},
    decoder={"hidden_dim": 128, "nhead": 4, "dim_feedforward": 256, "num_layers": 3, "num_queries": 100, "num_points": (4, 4, 4)},
    denoising={"num_denoising": 50}, num_select=100)

_STORAGE = "https://github.com/lyuwenyu/storage/releases/download/"
#: the released files (the ``ema`` or ``model`` entry of each; v1's are converted from PaddleDetection's)
_FILES = {
    "rtdetr_r18vd": "v0.1/rtdetr_r18vd_dec3_6x_coco_from_paddle.pth", "rtdetr_r34vd": "v0.1/rtdetr_r34vd_dec4_6x_coco_from_paddle.pth",
    "rtdetr_r50vd_m": "v0.1/rtdetr_r50vd_m_6x_coco_from_paddle.pth", "rtdetr_r50vd": "v0.1/rtdetr_r50vd_6x_coco_from_paddle.pth",
    "rtdetr_r101vd": "v0.1/rtdetr_r101vd_6x_coco_from_paddle.pth",
    "rtdetrv2_r18vd": "v0.2/rtdetrv2_r18vd_120e_coco_rerun_48.1.pth", "rtdetrv2_r34vd": "v0.1/rtdetrv2_r34vd_120e_coco_ema.pth",
    "rtdetrv2_r50vd_m": "v0.1/rtdetrv2_r50vd_m_7x_coco_ema.pth", "rtdetrv2_r50vd": "v0.1/rtdetrv2_r50vd_6x_coco_ema.pth",
    "rtdetrv2_r101vd": "v0.1/rtdetrv2_r101vd_6x_coco_from_paddle.pth",
    "rtdetrv2_r18vd_dsp": "v0.1/rtdetrv2_r18vd_dsp_3x_coco.pth", "rtdetrv2_r34vd_dsp": "v0.1/rrtdetrv2_r34vd_dsp_1x_coco.pth",
    "rtdetrv2_r50vd_m_dsp": "v0.1/rtdetrv2_r50vd_m_dsp_3x_coco.pth", "rtdetrv2_r50vd_dsp": "v0.1/rtdetrv2_r50vd_dsp_1x_coco.pth",
}

_FILES = {name: _STORAGE + path for name, path in _FILES.items()}
#: DEIM's released RT-DETRv2 files, on Google Drive (its README's links): downloaded by hand, loaded with pretrained=PATH
_FILES |= {
    "deim_rtdetrv2_r18vd": "https://drive.google.com/file/d/153_JKff6EpFgiLKaqkJsoDcLal_0ux_F",
    "deim_rtdetrv2_r34vd": "https://drive.google.com/file/d/1O9RjZF6kdFWGv1Etn1Toml4r-YfdMDMM",
    "deim_rtdetrv2_r50vd_m": "https://drive.google.com/file/d/10dLuqdBZ6H5ip9BbBiE6S7ZcmHkRbD0E",
    "deim_rtdetrv2_r50vd": "https://drive.google.com/file/d/1mWknAXD5JYknUQ94WCEvPfXz13jcNOTI",
    "deim_rtdetrv2_r101vd": "https://drive.google.com/file/d/1BIevZijOcBO17llTyDX32F_pYppBfnzu",
}

DEFAULT_CFGS: dict[str, ModelCfg] = {
    name: ModelCfg(cfg, PretrainedCfg(url=_FILES[name]) if name in _FILES else PretrainedCfg())
    for name, cfg in _VARIANTS.items()
}


def _create(name: str, **kwargs: Any) -> RTDETR:
    """The variant ``name`` with ``kwargs`` on top: each section merged field by field with the variant's."""
    cfg = DEFAULT_CFGS[name]
    sections = ("backbone", "encoder", "decoder", "denoising", "loss")
    flat = {k: v for k, v in cfg.kwargs.items() if k not in sections}
    pretrained = cfg.pretrained_cfg.merged(kwargs.pop("pretrained_cfg", None))
    return build_rtdetr(**{**flat, **kwargs}, base={k: cfg.kwargs.get(k) for k in sections}, pretrained_cfg=pretrained)


#: the registry-wide test's settings: the variant's depth and options at a narrow backbone, d 32, 3 decoder layers (the M
#: models evaluate at the third), 5 queries, 4 denoising slots
TEST_SETTINGS = dict(
    test_kwargs=dict(backbone={"kwargs": {"stem_width": 4, "widths": (8, 16, 32, 64), "blocks": (1, 1, 1, 1)}},
                     encoder={"hidden_dim": 32, "nhead": 2, "dim_feedforward": 32},
                     decoder={"hidden_dim": 32, "nhead": 2, "dim_feedforward": 32, "num_layers": 3, "num_queries": 5},
                     denoising={"num_denoising": 4}, num_select=5),
    test_image_size=(64, 64))


def _registered(fn):
    return register_model(tags=("detection", "rtdetr"), filter_fn=convert_state_dict, **TEST_SETTINGS)(fn)


@_registered
def rtdetr_r18vd(**kwargs) -> RTDETR:
    """RT-DETR R18-vd (46.5 COCO AP, 20 M parameters, 217 FPS on a T4)."""
    return _create("rtdetr_r18vd", **kwargs)


@_registered
def rtdetr_r34vd(**kwargs) -> RTDETR:
    """RT-DETR R34-vd (48.9 COCO AP, 31 M parameters, 161 FPS)."""
    return _create("rtdetr_r34vd", **kwargs)


@_registered
def rtdetr_r50vd_m(**kwargs) -> RTDETR:
    """RT-DETR R50-vd-M: fusion blocks at half width, evaluated at the 3rd decoder layer (51.3 COCO AP, 36 M, 145 FPS)."""
    return _create("rtdetr_r50vd_m", **kwargs)


@_registered
def rtdetr_r50vd(**kwargs) -> RTDETR:
    """RT-DETR R50-vd (53.1 COCO AP, 42 M parameters, 108 FPS)."""
    return _create("rtdetr_r50vd", **kwargs)


@_registered
def rtdetr_r101vd(**kwargs) -> RTDETR:
    """RT-DETR R101-vd, encoder width 384 (54.3 COCO AP, 76 M parameters, 74 FPS)."""
    return _create("rtdetr_r101vd", **kwargs)


@_registered
def rtdetrv2_r18vd(**kwargs) -> RTDETR:
    """RT-DETRv2-S, R18-vd (48.1 COCO AP, 20 M parameters, 217 FPS)."""
    return _create("rtdetrv2_r18vd", **kwargs)


@_registered
def rtdetrv2_r34vd(**kwargs) -> RTDETR:
    """RT-DETRv2-M*, R34-vd (49.9 COCO AP, 31 M parameters, 161 FPS)."""
    return _create("rtdetrv2_r34vd", **kwargs)


@_registered
def rtdetrv2_r50vd_m(**kwargs) -> RTDETR:
    """RT-DETRv2-M, R50-vd-M (51.9 COCO AP, 36 M parameters, 145 FPS)."""
    return _create("rtdetrv2_r50vd_m", **kwargs)


@_registered
def rtdetrv2_r50vd(**kwargs) -> RTDETR:
    """RT-DETRv2-L, R50-vd (53.4 COCO AP, 42 M parameters, 108 FPS)."""
    return _create("rtdetrv2_r50vd", **kwargs)


@_registered
def rtdetrv2_r101vd(**kwargs) -> RTDETR:
    """RT-DETRv2-X, R101-vd (54.3 COCO AP, 76 M parameters, 74 FPS)."""
    return _create("rtdetrv2_r101vd", **kwargs)


@_registered
def rtdetrv2_r18vd_dsp(**kwargs) -> RTDETR:
    """RT-DETRv2-S with discrete sampling (47.4 COCO AP; its graph has no GridSample)."""
    return _create("rtdetrv2_r18vd_dsp", **kwargs)


@_registered
def rtdetrv2_r34vd_dsp(**kwargs) -> RTDETR:
    """RT-DETRv2-M* with discrete sampling (49.2 COCO AP)."""
    return _create("rtdetrv2_r34vd_dsp", **kwargs)


@_registered
def rtdetrv2_r50vd_m_dsp(**kwargs) -> RTDETR:
    """RT-DETRv2-M with discrete sampling (51.4 COCO AP)."""
    return _create("rtdetrv2_r50vd_m_dsp", **kwargs)


@_registered
def rtdetrv2_r50vd_dsp(**kwargs) -> RTDETR:
    """RT-DETRv2-L with discrete sampling (52.9 COCO AP)."""
    return _create("rtdetrv2_r50vd_dsp", **kwargs)


@_registered
def deim_rtdetrv2_r18vd(**kwargs) -> RTDETR:
    """DEIM-RT-DETRv2-S: RT-DETRv2 R18-vd trained with DEIM (49.0 COCO AP, 20 M parameters)."""
    return _create("deim_rtdetrv2_r18vd", **kwargs)


@_registered
def deim_rtdetrv2_r34vd(**kwargs) -> RTDETR:
    """DEIM-RT-DETRv2-M: RT-DETRv2 R34-vd trained with DEIM (50.9 COCO AP, 31 M parameters)."""
    return _create("deim_rtdetrv2_r34vd", **kwargs)


@_registered
def deim_rtdetrv2_r50vd_m(**kwargs) -> RTDETR:
    """DEIM-RT-DETRv2-M*: R50-vd-M with 3 decoder layers, trained with DEIM (53.2 COCO AP, 33 M parameters)."""
    return _create("deim_rtdetrv2_r50vd_m", **kwargs)


@_registered
def deim_rtdetrv2_r50vd(**kwargs) -> RTDETR:
    """DEIM-RT-DETRv2-L: RT-DETRv2 R50-vd trained with DEIM (54.3 COCO AP, 42 M parameters)."""
    return _create("deim_rtdetrv2_r50vd", **kwargs)


@_registered
def deim_rtdetrv2_r101vd(**kwargs) -> RTDETR:
    """DEIM-RT-DETRv2-X: RT-DETRv2 R101-vd trained with DEIM (55.5 COCO AP, 76 M parameters)."""
    return _create("deim_rtdetrv2_r101vd", **kwargs)


@_registered
def rtdetr_tiny(**kwargs) -> RTDETR:
    """A CPU-sized RT-DETRv2 trained from scratch (configs/rtdetr/rtdetr_tiny_shapes.yaml): a narrow R18-vd, d 128."""
    return _create("rtdetr_tiny", **kwargs)
