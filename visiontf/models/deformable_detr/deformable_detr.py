"""Deformable DETR (Zhu et al., 2021), faithful to fundamentalvision/Deformable-DETR, in pure PyTorch.

Multi-scale features (C3-C5 of a ResNet plus a stride-64 level) are encoded by deformable self-attention; 300 queries
decode them with deformable cross-attention and predict sigmoid class scores (no "no object" class) and boxes relative
to reference points. Options: iterative box refinement (a head per decoder layer) and two-stage (encoder proposals
become the reference boxes). The original checkpoints and HuggingFace ``DeformableDetrForObjectDetection`` weights
load through :mod:`visiontf.models.deformable_detr.convert` (``create_model(name, pretrained=path)``).

The forward's steps, reused or replaced by the DINO-style options: :meth:`DeformableDETR.encode`,
:meth:`~DeformableDETR.initial_queries` (:mod:`~visiontf.models.deformable_detr.queries`), the decoder, :meth:`predict`.

Training options of the DINO line, off by default so that the published models stay exact (sources:
:class:`~visiontf.models.deformable_detr.dino_options.DinoOptions`): denoising (``num_denoising``; the model then takes the batch's
``targets`` in training), mixed query selection, look forward twice, Group DETR (``num_query_groups``, masked by
:func:`~visiontf.models.deformable_detr.queries.self_attn_mask`), shared decoder heads, position temperature.
"""
from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from visiontf.models._registry import register_model
from visiontf.models.backbones.backbone import Backbone, BackboneLayerDepth
from visiontf.models.contract import Detector, ModelCfg, PretrainedCfg, check_detection_targets
from visiontf.models.deformable_detr.arch_options import DeformableArchOptions
from visiontf.models.deformable_detr.build import create_deformable, sections_of
from visiontf.models.deformable_detr.convert import convert_state_dict
from visiontf.models.deformable_detr.deformable_transformer import (
    DeformableTransformer,
    MultiScaleMemory,
    encoder_reference_points,
    inverse_sigmoid,
    refine_boxes,
    valid_counts,
)
from visiontf.models.deformable_detr.denoising import ContrastiveDenoising
from visiontf.models.deformable_detr.dino_options import DinoOptions
from visiontf.models.deformable_detr.distinct_queries import DistinctQueriesBetweenLayers
from visiontf.models.deformable_detr.feature_levels import feature_levels
from visiontf.models.deformable_detr.queries import DeformableQueries, self_attn_mask
from visiontf.models.detr.detr import DETECTION_CFG, MLP
from visiontf.models.detr.settings import DeformableWeightsSettings
from visiontf.models.postprocess_options import PostprocessOptions
from visiontf.nn.ms_deform_attn import recording_sampling
from visiontf.nn.precision import at_least_float32

#: the published Deformable DETR's: no DINO-line option; 100 detections per image, no NMS
NO_DINO_OPTIONS = DinoOptions()
DEFORMABLE_POSTPROCESS = PostprocessOptions(num_top=100)


def _check_parts(backbone: Backbone, neck: nn.ModuleList, transformer: DeformableTransformer, arch: DeformableArchOptions,
                 dino: DinoOptions, denoising: ContrastiveDenoising | None) -> None:
    """Injected parts that disagree with the options are refused here, naming both, not as a shape error later."""
    if not isinstance(backbone, Backbone):
        raise TypeError(f"backbone must be a visiontf.models.backbones.backbone.Backbone, got {type(backbone).__name__} "
                        "(a name such as 'resnet50' goes to build_deformable_detr or create_model)")
    levels = arch.num_feature_levels
    if len(backbone.channels) > levels:
        raise ValueError(f"the backbone gives {len(backbone.channels)} maps (strides {backbone.strides}), more than "
                         f"num_feature_levels={levels}; build with num_feature_levels={len(backbone.channels)}")
    if len(neck) != levels:
        raise ValueError(f"the neck has {len(neck)} level projections, arch_options.num_feature_levels is {levels}")
    built = (tuple(transformer.level_embed.shape), len(transformer.encoder.layers), len(transformer.decoder.layers))
    wanted = ((levels, arch.hidden_dim), arch.enc_layers, arch.dec_layers)
    if built != wanted:
        raise ValueError(f"the transformer has (level_embed shape, encoder layers, decoder layers) {built}, arch_options say {wanted}")
    if (denoising.num_denoising if denoising is not None else 0) != dino.num_denoising:
        raise ValueError(f"denoising={denoising} disagrees with dino_options.num_denoising={dino.num_denoising}; "
                         "pass ContrastiveDenoising(num_denoising) with the same number, or None with 0")


class DeformableDETR(DeformableQueries, DeformableWeightsSettings, BackboneLayerDepth, Detector):
    """Deformable DETR: multi-scale CNN features, deformable encoder-decoder, sigmoid set prediction.

    Built from its parts, as the original DETR (``DETR(backbone, transformer, num_classes, ...)``) and
    detrex's DINO; :func:`~visiontf.models.deformable_detr.build.build_deformable_detr` makes them from the flat
    keyword arguments of ``DEFAULT_CFGS``, configs and checkpoints (``create_model(name, **kwargs)``).

    Args:
        backbone: a :class:`~visiontf.models.backbones.backbone.Backbone` (its maps give the first levels).
        position_embedding: the sine embedding of each level's padding mask (``hidden_dim // 2`` features per axis).
        neck: one projection to ``hidden_dim`` per level (``input_proj``): the backbone's maps, then the extra
            levels, each applied to the previous one
            (:func:`~visiontf.models.deformable_detr.build.level_projections`).
        transformer: the deformable encoder-decoder, built for ``arch_options``
            (:func:`~visiontf.models.deformable_detr.build.build_deformable_transformer`).
        num_classes: object classes; the class head has ``num_classes`` sigmoid outputs (COCO: 91,
            the original's max category id + 1).
        arch_options: the architecture (:class:`~visiontf.models.deformable_detr.arch_options.DeformableArchOptions`),
            kept as ``self.arch_options``; the class and box heads and the queries are built from it.
        dino_options: the DINO line's training options (:class:`~visiontf.models.deformable_detr.dino_options.DinoOptions`, all
            off by default as in the published Deformable DETR), kept as ``self.dino_options``.
        denoising: the denoising query generator (:class:`~visiontf.models.deformable_detr.denoising.ContrastiveDenoising`),
            called in training with the batch's targets; None: no denoising. It must agree with
            ``dino_options.num_denoising``.
        postprocess_options: detections kept per image and NMS
            (:class:`~visiontf.models.postprocess_options.PostprocessOptions`; Deformable DETR keeps 100), which
            :func:`visiontf.set_prediction.build_postprocess` reads and ``set_postprocess`` replaces.
        pretrained_cfg: eval settings over :data:`~visiontf.models.detr.detr.DETECTION_CFG`.
    """

    #: sigmoid class scores over K classes, focal loss (the DETR family's other convention: "softmax")
    class_head = "sigmoid"
    head_prefixes = ("class_embed.", "label_enc.")  # class-dependent: re-initialised when fine-tuning
    #: ``forward(..., need_weights=True)`` returns sampling points, drawn as the paper's figure
    attention_picture = "sampling_points"
    #: training steps pass the batch's targets (denoising queries are built from them)
    forward_takes_targets = True

    def __init__(
        self,
        backbone: Backbone,
        position_embedding: nn.Module,
        neck: nn.ModuleList,
        transformer: DeformableTransformer,
        num_classes: int,
        arch_options: DeformableArchOptions,
        dino_options: DinoOptions = NO_DINO_OPTIONS,
        denoising: ContrastiveDenoising | None = None,
        postprocess_options: PostprocessOptions = DEFORMABLE_POSTPROCESS,
        pretrained_cfg: PretrainedCfg | Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        if num_classes < 1:
            raise ValueError(f"num_classes must be >= 1, got {num_classes}")
        arch = self.arch_options = arch_options
        dino_options.check(arch.num_queries, arch.with_box_refine, arch.two_stage)
        self.dino_options = dino_options
        _check_parts(backbone, neck, transformer, arch, dino_options, denoising)
        self.num_classes = num_classes
        # replaceable at evaluation and prediction: visiontf.set_prediction.set_postprocess
        self.postprocess_options = postprocess_options
        self.denoising = denoising
        self.backbone = backbone
        self.position_embedding = position_embedding
        self.input_proj = neck
        self.transformer = transformer
        hidden_dim, groups = arch.hidden_dim, dino_options.num_query_groups
        if not arch.two_stage:
            # Group DETR: one set of learned queries per group (the first is the inference set)
            self.query_embed = nn.Embedding(arch.num_queries * groups, 2 * hidden_dim)
        if dino_options.mixed_query_selection:
            self.tgt_embed = nn.Embedding(arch.num_queries * groups, hidden_dim)
            self.ref_point_head = MLP(2 * hidden_dim, hidden_dim, hidden_dim, 2)
        # denoising label embedding; the last row is the zero "padding" query DINO feeds
        self.label_enc = nn.Embedding(num_classes + 1, hidden_dim, padding_idx=num_classes) if denoising is not None else None
        self.decoder_norm = nn.LayerNorm(hidden_dim) if arch.decoder_norm else None
        # one head shared by all layers, or (refinement) one per layer (or one shared: DINO) plus,
        # two-stage, one for the proposals
        dec_heads = 1 if dino_options.share_decoder_heads else arch.dec_layers
        num_heads = (dec_heads + int(arch.two_stage)) if arch.with_box_refine else 1
        self.class_embed = nn.ModuleList(nn.Linear(hidden_dim, num_classes) for _ in range(num_heads))
        self.bbox_embed = nn.ModuleList(MLP(hidden_dim, hidden_dim, 4, 3) for _ in range(num_heads))
        self._reset_heads()
        backbone.share_layout(self.input_proj)
        self.pretrained_cfg = DETECTION_CFG.merged(pretrained_cfg)  # eval settings over DETR's

    def _reset_heads(self) -> None:
        """The original's: class bias at prior 0.01, box head's last layer zero, h/w bias -2 (0 two-stage)."""
        prior = -math.log((1 - 0.01) / 0.01)
        for proj in self.input_proj:
            nn.init.xavier_uniform_(proj[0].weight, gain=1)
            nn.init.zeros_(proj[0].bias)
        # the original initialises one head and deep-copies it, so the copies share the initial weights
        nn.init.constant_(self.class_embed[0].bias, prior)
        nn.init.zeros_(self.bbox_embed[0].layers[-1].weight)
        nn.init.zeros_(self.bbox_embed[0].layers[-1].bias)
        for i in range(1, len(self.class_embed)):
            self.class_embed[i].load_state_dict(self.class_embed[0].state_dict())
            self.bbox_embed[i].load_state_dict(self.bbox_embed[0].state_dict())
        if self.dino_options.mixed_query_selection:
            # DINO: the dynamic query-position MLP lives in its decoder, whose matrices are xavier-initialised
            for layer in self.ref_point_head.layers:
                nn.init.xavier_uniform_(layer.weight)
        if not self.arch_options.two_stage:
            # refinement: only the first layer's head starts with small boxes
            nn.init.constant_(self.bbox_embed[0].layers[-1].bias[2:], -2.0)

    # ------------------------------------------------- optimiser (no_weight_decay: none, the base's, as the original)
    def transformer_modules(self) -> tuple[nn.Module, ...]:
        return (self.transformer,)

    def param_group(self, name: str) -> str:
        """``"backbone"`` | ``"offsets"`` (sampling offsets and reference points, 0.1x lr) | ``"default"``."""
        if name.startswith("backbone."):
            return self.backbone.param_group(name[len("backbone."):])
        if "sampling_offsets" in name or "reference_points" in name:
            return "offsets"
        return "default"

    def _decoder_heads(self, heads: nn.ModuleList) -> list[nn.Module]:
        """The head of each decoder layer (one shared by all with ``share_decoder_heads``)."""
        layers = self.arch_options.dec_layers
        return [heads[0]] * layers if self.dino_options.share_decoder_heads else list(heads[:layers])

    def set_attn_method(self, method: str) -> None:
        """Switch every deformable attention to ``"gather"``, ``"triton"`` or ``"grid_sample"`` (ONNX export)."""
        for m in self.modules():
            if hasattr(m, "sampling_offsets") and hasattr(m, "method"):
                m.method = method

    # -------------------------------------------------------------------------------- forward
    def encode(self, images: Tensor, mask: Tensor | None = None) -> MultiScaleMemory:
        """Backbone, level projections, position and level embeddings, deformable encoder."""
        if images.dim() != 4 or images.shape[1] != 3:
            raise ValueError(f"DeformableDETR expects images of shape (B, 3, H, W), got {tuple(images.shape)}")
        B, _, H, W = images.shape
        if mask is not None and tuple(mask.shape) != (B, H, W):
            raise ValueError(
                f"mask must have shape (B, H, W) = {(B, H, W)} matching the images (True on padding), got {tuple(mask.shape)}; "
                "pad images and masks together, or pass mask=None when nothing is padded"
            )
        image_mask = torch.zeros((B, H, W), dtype=torch.bool, device=images.device) if mask is None else mask.bool()
        maps, masks = self.backbone.forward_features(images, image_mask)
        srcs = [proj(x) for proj, x in zip(self.input_proj, maps)]
        # the image's mask as the backbone padded it (the extra levels cover its padded extent); ResNets pad nothing
        image_mask = self.backbone.pad(image_mask, value=True)
        for level in range(len(srcs), self.arch_options.num_feature_levels):
            srcs.append(self.input_proj[level](maps[-1] if level == len(maps) else srcs[-1]))
            masks.append(F.interpolate(image_mask[None].float(), size=srcs[-1].shape[-2:]).to(torch.bool)[0])
        # Python ints and cached tables eagerly, traced sizes while exporting (the graph follows H, W)
        shapes, layout = feature_levels(srcs, images.device)
        src = torch.cat([s.flatten(2).transpose(1, 2) for s in srcs], 1)
        pos = torch.cat([self.position_embedding(m).flatten(2).transpose(1, 2) for m in masks], 1)
        pos = (pos + self.transformer.level_embed[layout.level]).to(src.dtype)
        # without padding the value masking and valid-ratio arithmetic are skipped (ratios are 1); a backbone that
        # pads the images to a multiple (a patch, a window grid) makes padding of its own
        padded = mask is not None or tuple(image_mask.shape[-2:]) != (H, W)
        padding_mask = torch.cat([m.flatten(1) for m in masks], 1) if padded else None
        counts = valid_counts(padding_mask, layout, B)
        ratios = counts / layout.size
        reference = encoder_reference_points(layout, ratios)
        memory = self.transformer.encoder(src, pos, reference, shapes, padding_mask)
        return MultiScaleMemory(memory, padding_mask, shapes, ratios, counts, layout)

    def decode(
        self, queries: dict, enc: MultiScaleMemory, self_attn_mask: Tensor | None = None, num_groups: int = 1,
        after_layer: DistinctQueriesBetweenLayers | None = None,
    ) -> dict:
        """The decoder on ``queries`` (see :meth:`initial_queries`); box refinement uses this model's heads."""
        return self.transformer.decoder(
            queries["tgt"], queries["reference"], enc.memory, enc.spatial_shapes, enc.valid_ratios, queries["query_pos"],
            enc.padding_mask, self_attn_mask, self._decoder_heads(self.bbox_embed) if self.arch_options.with_box_refine else None, num_groups,
            self.ref_point_head if self.dino_options.mixed_query_selection else None, after_layer,
        )

    def layer_scores(self, i: int, hidden: Tensor) -> Tensor:
        """(B, N) best class probability of decoder layer ``i``'s outputs (B, N, C), as :meth:`predict` scores them."""
        if self.decoder_norm is not None:
            hidden = self.decoder_norm(hidden)
        head = self.class_embed[0] if self.dino_options.share_decoder_heads else self.class_embed[i]
        return head(hidden).float().sigmoid().amax(-1)

    def predict(self, dec: dict) -> tuple[Tensor, Tensor]:
        """Class logits (layers, B, Q, K) and boxes (layers, B, Q, 4) normalised cxcywh, float32 (float64 in a float64 model)."""
        hidden = dec["hidden"]
        if self.arch_options.with_box_refine:
            deltas = dec["deltas"]
            if self.decoder_norm is not None:
                # DINO: the heads read normalised outputs; the decoder refined its references without
                hidden = self.decoder_norm(hidden)
                if self.dino_options.share_decoder_heads:
                    deltas = list(at_least_float32(self.bbox_embed[0](hidden)).unbind(0))
                else:
                    deltas = [at_least_float32(head(h)) for head, h in zip(self._decoder_heads(self.bbox_embed), hidden)]
            if self.dino_options.share_decoder_heads:
                logits = self.class_embed[0](hidden)
            else:
                logits = torch.stack([head(h) for head, h in zip(self.class_embed, hidden)])
            if self.dino_options.look_forward_twice:
                # layer i refines layer i-1's boxes before they were detached: its loss reaches layer i-1
                sources = dec["references"][:1] + dec["new_references"][:-1]
            else:
                sources = dec["references"]
            if self.decoder_norm is None and not self.dino_options.look_forward_twice:
                return logits, torch.stack(dec["new_references"])  # the same values, computed once
            return logits, torch.stack([refine_boxes(ref, delta, self.transformer.decoder.inverse_sigmoid_eps) for ref, delta in zip(sources, deltas)])
        # one shared head: all layers at once, offsets from the (fixed) initial reference points
        delta = at_least_float32(self.bbox_embed[0](hidden))
        ref = inverse_sigmoid(at_least_float32(dec["references"][0]))
        boxes = torch.cat([delta[..., :2] + ref, delta[..., 2:]], -1).sigmoid()
        return self.class_embed[0](hidden), boxes

    def forward(
        self, images: Tensor, mask: Tensor | None = None, targets: Sequence[dict] | None = None, need_weights: bool = False
    ) -> dict:
        """Detect objects.

        Args:
            images: (B, 3, H, W), ImageNet-normalised, zero-padded to a common size.
            mask: (B, H, W) bool, True on padding pixels; None when nothing is padded.
            targets: training only, with ``num_denoising``: per image ``labels`` (N,) and
                ``boxes`` (N, 4) normalised cxcywh, from which the denoising queries are built
                (ignored in eval mode; in training without targets there is no denoising).
            need_weights: also return where the last decoder layer's cross-attention looked (the
                paper's figure of sampling points).

        Returns:
            ``pred_logits`` (B, Q, num_classes) sigmoid logits, ``pred_boxes`` (B, Q, 4) float32 (float64 in a float64 model)
            cxcywh relative to each image's unpadded size, ``aux_outputs`` (with ``aux_loss``: one
            dict per decoder layer but the last) and, two-stage, ``enc_outputs`` (the proposals:
            ``pred_logits`` (B, S, num_classes), ``pred_boxes`` (B, S, 4)).

            Training options add: mixed query selection ``interm_outputs`` (the Q selected
            proposals, class-specific); Group DETR ``num_query_groups`` G (training outputs then
            hold G * Q queries, group-major); denoising ``dn_outputs`` (``pred_logits``,
            ``pred_boxes``, ``aux_outputs`` of the denoising queries) and ``dn_meta``
            (:class:`~visiontf.models.deformable_detr.denoising.DenoisingMeta`, for the criterion).

            With ``need_weights`` also ``dec_sampling_locations`` (B, Q, heads, L, points, 2)
            float32 normalised (x, y) over each level's (padded) feature map,
            ``dec_attention_weights`` (B, Q, heads, L, points) float32 (summing to 1 per query and
            head), ``dec_reference_points`` (B, Q, 2|4) the last layer's reference (point or cxcywh
            box) relative to the unpadded image, and ``spatial_shapes`` [(H_l, W_l)].
        """
        enc = self.encode(images, mask)
        options = self.dino_options
        groups = options.num_query_groups if self.training else 1
        queries = self.initial_queries(enc, groups)
        num_matching = queries["tgt"].shape[1]
        dn = None
        if self.training and self.denoising is not None and targets is not None:
            check_detection_targets(targets, images.shape[0], type(self).__name__)
            dn = self.denoising(targets, self.num_classes, num_matching)
        P = dn.meta.pad_size if dn is not None else 0
        sampled: list[tuple[Tensor, Tensor]] = []
        # the last decoder layer's cross-attention: where it looked (the paper's figure)
        last_cross_attn = self.transformer.decoder.layers[-1].cross_attn
        distinct = None
        if options.distinct_between_layers:
            distinct = DistinctQueriesBetweenLayers(self.layer_scores, options.distinct_query_iou, P, groups, folded=not P)
        with recording_sampling(last_cross_attn, sampled) if need_weights else contextlib.nullcontext():
            if P:
                queries = self._with_denoising(queries, dn)
                attn_mask = self_attn_mask(P, dn.meta.group_size, num_matching, groups, images.device)
                dec = self.decode(queries, enc, attn_mask, after_layer=distinct)
            else:
                # without denoising queries the groups are folded into the batch: no mask needed
                dec = self.decode(queries, enc, num_groups=groups, after_layer=distinct)
        logits, boxes = self.predict(dec)
        if distinct is not None:
            logits = distinct.mask_logits(logits)
        if self.training and self.label_enc is not None and not P:
            # every parameter takes part in every step (DDP), as DINO's ``label_enc.weight[0, 0] * 0``
            logits = logits + 0.0 * self.label_enc.weight[0, 0]
        out: dict = {"pred_logits": logits[-1, :, P:], "pred_boxes": boxes[-1, :, P:]}
        if self.arch_options.aux_loss:
            out["aux_outputs"] = [{"pred_logits": a[:, P:], "pred_boxes": b[:, P:]} for a, b in zip(logits[:-1], boxes[:-1])]
        for key in ("enc_outputs", "interm_outputs"):
            if key in queries:
                out[key] = queries[key]
        if groups > 1:
            out["num_query_groups"] = groups
        if dn is not None:
            out["dn_outputs"] = {"pred_logits": logits[-1, :, :P], "pred_boxes": boxes[-1, :, :P]}
            if self.arch_options.aux_loss:
                out["dn_outputs"]["aux_outputs"] = [{"pred_logits": a[:, :P], "pred_boxes": b[:, :P]} for a, b in zip(logits[:-1], boxes[:-1])]
            out["dn_meta"] = dn.meta
        if need_weights:
            out.update(dec_sampling_locations=sampled[-1][0], dec_attention_weights=sampled[-1][1],
                       dec_reference_points=dec["references"][-1].float(), spatial_shapes=list(enc.spatial_shapes))
        return out


# ------------------------------------------------------------------------------------ registry
#: the published models (COCO, 50 epochs) and a CPU-sized one; settings as data, one function each below
DEFAULT_CFGS: dict[str, ModelCfg] = {
    # 44.5 AP; 40.07 M parameters with 91 classes
    "deformable_detr_resnet50": ModelCfg(sections_of(backbone="resnet50", channels_last=True)),
    # 46.2 AP; 40.85 M
    "deformable_detr_resnet50_box_refine": ModelCfg(sections_of(backbone="resnet50", channels_last=True, with_box_refine=True)),
    # 46.9 AP ("++": refinement + two-stage); 41.18 M
    "deformable_detr_resnet50_two_stage": ModelCfg(sections_of(backbone="resnet50", channels_last=True, with_box_refine=True,
                                                        two_stage=True)),
    # CPU-sized: ResNet-18 trunk, d 128, 3 levels (strides 8/16/32: small objects need the stride-8
    # map, the stride-64 level buys little at 128-512 px), 2 encoder points (the encoder runs on
    # every position, so its points dominate the attention cost) and 4 decoder points (cheap: 100
    # queries), 2 encoder + 3 decoder layers (set prediction needs decoder depth more than encoder
    # depth), FFN 512, 100 queries (few objects per image), refinement on (cheap, converges faster),
    # dropout 0 (short schedules, as DINO and D-FINE), channels-last (the ResNet-18 is most of a CPU
    # train step, and oneDNN runs NHWC convolutions faster; docs/record/speed.md)
    "deformable_detr_tiny": ModelCfg(sections_of(
        backbone="resnet18", num_feature_levels=3, hidden_dim=128, nheads=4, enc_layers=2, dec_layers=3, dim_feedforward=512,
        num_queries=100, enc_n_points=2, dec_n_points=4, with_box_refine=True, dropout=0.0, channels_last=True,
    )),
}


#: the registry-wide test's settings: the variant's backbone and levels, a transformer of 32 dims, 1 + 2 layers
_TEST = dict(test_kwargs=dict(arch=dict(hidden_dim=32, nheads=2, enc_layers=1, dec_layers=2, dim_feedforward=32, num_queries=5)),
             test_image_size=(64, 64))


def _create(cfg: ModelCfg, **kwargs) -> DeformableDETR:
    # the flat keyword arguments become the model's parts here, and only here
    return create_deformable(DeformableDETR, cfg, **kwargs)


@register_model(tags=("detection", "deformable_detr"), filter_fn=convert_state_dict, **_TEST)
def deformable_detr_resnet50(**kwargs) -> DeformableDETR:
    """Deformable DETR R50, single-stage, 300 queries, 4 levels (44.5 COCO AP)."""
    return _create(DEFAULT_CFGS["deformable_detr_resnet50"], **kwargs)


@register_model(tags=("detection", "deformable_detr"), filter_fn=convert_state_dict, **_TEST)
def deformable_detr_resnet50_box_refine(**kwargs) -> DeformableDETR:
    """Deformable DETR R50 with iterative box refinement (46.2 COCO AP)."""
    return _create(DEFAULT_CFGS["deformable_detr_resnet50_box_refine"], **kwargs)


@register_model(tags=("detection", "deformable_detr"), filter_fn=convert_state_dict, **_TEST)
def deformable_detr_resnet50_two_stage(**kwargs) -> DeformableDETR:
    """Deformable DETR R50 with box refinement and two-stage proposals, the original's "++" (46.9 COCO AP)."""
    return _create(DEFAULT_CFGS["deformable_detr_resnet50_two_stage"], **kwargs)


@register_model(tags=("detection", "deformable_detr"), filter_fn=convert_state_dict, **_TEST)
def deformable_detr_tiny(**kwargs) -> DeformableDETR:
    """A CPU-sized Deformable DETR (ResNet-18, d 128, 3 levels, 2+3 layers, 100 queries, box refinement)."""
    return _create(DEFAULT_CFGS["deformable_detr_tiny"], **kwargs)
