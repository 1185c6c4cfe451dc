"""DETR (Carion et al., 2020), faithful to facebookresearch/detr, on visiontf's shared blocks.

The architecture, initialisation and outputs are the original's; the original checkpoints and
HuggingFace ``DetrForObjectDetection`` weights load through :mod:`visiontf.models.detr.convert`
(``create_model("detr_resnet50", pretrained="detr-r50-e632da11.pth")``). Tensors are batch-first
(B, HW, C) throughout and attention runs on ``scaled_dot_product_attention``.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from torch import Tensor, nn

from visiontf.models._registry import register_model, torch_hub_state_dict
from visiontf.models.backbones.backbone import Backbone, BackboneLayerDepth
from visiontf.models.contract import Detector, ModelCfg, PretrainedCfg
from visiontf.models.detr.build import DETR_SECTIONS, build_detr
from visiontf.models.detr.convert import convert_state_dict
from visiontf.models.detr.detr_transformer import DetrTransformer
from visiontf.models.detr.settings import detr_settings
from visiontf.models.postprocess_options import PostprocessOptions
from visiontf.nn.precision import at_least_float32


class MLP(nn.Module):
    """The box head: ``num_layers`` Linear layers with ReLU between them (``layers.{i}`` names)."""

    def __init__(self, input_dim: int, hidden_dim: int, output_dim: int, num_layers: int) -> None:
        super().__init__()
        dims = [input_dim] + [hidden_dim] * (num_layers - 1)
        outs = [hidden_dim] * (num_layers - 1) + [output_dim]
        self.layers = nn.ModuleList(nn.Linear(i, o) for i, o in zip(dims, outs))

    def forward(self, x: Tensor) -> Tensor:
        """(..., input_dim) -> (..., output_dim)."""
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            x = layer(x) if i == last else F.relu(layer(x))
        return x


#: the DETR family's eval preprocessing: ImageNet statistics, shorter side 800, longer at most 1333
DETECTION_CFG = PretrainedCfg(mean=IMAGENET_DEFAULT_MEAN, std=IMAGENET_DEFAULT_STD, min_size=800, max_size=1333)


class DETR(BackboneLayerDepth, Detector):
    """DEtection TRansformer: CNN backbone, transformer encoder-decoder, set-prediction heads.

    Built from its parts, as the original's ``DETR(backbone, transformer, num_classes, num_queries,
    aux_loss)``; :func:`~visiontf.models.detr.build.build_detr` makes them from the typed sections of ``DEFAULT_CFGS``,
    configs and checkpoints (what ``create_model`` calls).

    Args:
        backbone: a :class:`~visiontf.models.backbones.backbone.Backbone` returning the maps of
            :attr:`backbone_stages` (DETR reads the last).
        position_embedding: the 2D position embedding of the feature map (padding mask (B, h, w) ->
            (B, hidden_dim, h, w)): sine or learned.
        input_proj: the 1x1 convolution from the backbone's last map to the transformer's width.
        transformer: a :class:`DetrTransformer`; its ``d_model`` is the model's ``hidden_dim``.
        num_classes: object classes; the class head has ``num_classes + 1`` outputs, the last
            being "no object" (the original's convention: COCO uses 91 = max category id + 1;
            visiontf's tasks pass the number of dataset categories with contiguous labels).
        num_queries: object queries (detections per image).
        aux_loss: return the predictions of every decoder layer but the last in ``aux_outputs``.
        pretrained_cfg: eval settings over :data:`DETECTION_CFG`.
    """

    #: the tensors whose shape follows num_classes (K + 1 rows), re-initialised when fine-tuning to other classes
    head_prefixes = ("class_embed.",)
    #: the settings weights in DETR's names were trained with, compared with the model's when loading
    weights_settings = staticmethod(detr_settings)
    weights_settings_section = "arch"
    #: K + 1 logits per query, the last meaning "no object" (see visiontf.set_prediction.build_postprocess)
    class_head = "softmax"
    #: the backbone stages :meth:`encode` returns (None: the last only); the mask head adds layer1..layer3
    backbone_stages: tuple[int, ...] | None = None

    def __init__(
        self,
        backbone: Backbone,
        position_embedding: nn.Module,
        input_proj: nn.Conv2d,
        transformer: DetrTransformer,
        num_classes: int = 91,
        num_queries: int = 100,
        aux_loss: bool = True,
        pretrained_cfg: PretrainedCfg | Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(backbone, Backbone):
            raise TypeError(f"backbone must be a visiontf.models.backbones.backbone.Backbone, got {type(backbone).__name__} "
                            "(a name such as 'resnet50' goes to build_detr or create_model)")
        if num_classes < 1:
            raise ValueError(f"num_classes must be >= 1 (object classes, without 'no object'), got {num_classes}")
        hidden_dim = transformer.d_model
        if input_proj.in_channels != backbone.num_channels or input_proj.out_channels != hidden_dim:
            raise ValueError(f"input_proj maps {input_proj.in_channels} -> {input_proj.out_channels} channels, but the backbone's "
                             f"last map has {backbone.num_channels} and the transformer is {hidden_dim} wide")
        if self.backbone_stages is not None and len(backbone.channels) != len(self.backbone_stages):
            raise ValueError(f"{type(self).__name__} reads the backbone stages {self.backbone_stages}, but the backbone returns "
                             f"{len(backbone.channels)} maps (build it with out_indices={self.backbone_stages})")
        self.num_classes = num_classes
        self.num_queries = num_queries
        self.hidden_dim = hidden_dim
        self.aux_loss = aux_loss
        # every query a detection, as the original; replaceable at evaluation: visiontf.set_prediction.set_postprocess
        self.postprocess_options = PostprocessOptions()
        self.backbone = backbone
        self.position_embedding = position_embedding
        self.input_proj = input_proj
        self.transformer = transformer
        self.query_embed = nn.Embedding(num_queries, hidden_dim)
        self.class_embed = nn.Linear(hidden_dim, num_classes + 1)
        self.bbox_embed = MLP(hidden_dim, hidden_dim, 4, 3)
        self.pretrained_cfg = DETECTION_CFG.merged(pretrained_cfg)

    # ------------------------------------------------------------------ optimiser knowledge (timm style)
    def no_weight_decay(self) -> set[str]:
        """Parameters trained without weight decay: none (the original decays every parameter)."""
        return set()

    def transformer_modules(self) -> tuple[nn.Module, ...]:
        return (self.transformer,)

    def param_group(self, name: str) -> str:
        """The learning-rate group of a parameter: ``"backbone"`` (the CNN) or ``"default"``."""
        return self.backbone.param_group(name[len("backbone."):]) if name.startswith("backbone.") else "default"

    def forward(self, images: Tensor, mask: Tensor | None = None, need_weights: bool = False) -> dict:
        """Predict ``num_queries`` boxes per image.

        Args:
            images: (B, 3, H, W), ImageNet-normalised, zero-padded to a common size.
            mask: (B, H, W) bool, True on padding pixels; None when nothing is padded.
            need_weights: also return the attention maps of the DETR paper's figures.

        Returns:
            ``pred_logits`` (B, Q, num_classes + 1), ``pred_boxes`` (B, Q, 4) sigmoid-normalised
            cxcywh relative to each image's unpadded size, ``aux_outputs`` (with ``aux_loss``: one
            ``{"pred_logits", "pred_boxes"}`` per decoder layer but the last); with
            ``need_weights`` also ``dec_attn`` (B, Q, h*w, the last decoder layer's
            cross-attention averaged over heads), ``enc_attn`` (B, h*w, h*w, the last encoder
            layer's self-attention) and ``feature_size`` (h, w).
        """
        return self.box_outputs(self.encode(images, mask, need_weights), need_weights)

    def box_outputs(self, parts: dict, need_weights: bool = False) -> dict:
        """The class and box heads on :meth:`encode`'s decoder outputs (the dict :meth:`forward` returns)."""
        hs = parts["hs"]
        logits = self.class_embed(hs)
        # sigmoid in float32 (float64 kept): bf16 rounds boxes near 0/1 too coarsely for the L1/GIoU losses
        boxes = at_least_float32(self.bbox_embed(hs)).sigmoid()
        result: dict = {"pred_logits": logits[-1], "pred_boxes": boxes[-1]}
        if self.aux_loss:
            result["aux_outputs"] = [{"pred_logits": a, "pred_boxes": b} for a, b in zip(logits[:-1], boxes[:-1])]
        if need_weights:
            result["dec_attn"] = parts["dec_attn"]
            result["enc_attn"] = parts["enc_attn"]
            result["feature_size"] = parts["feature_size"]
        return result

    def encode(self, images: Tensor, mask: Tensor | None = None, need_weights: bool = False) -> dict:
        """Backbone, projection and transformer: what the heads read.

        Returns ``hs`` (L, B, Q, C) decoder outputs (every layer with ``aux_loss``, else the last),
        ``memory`` (B, h*w, C) encoder output, ``src`` (B, C, h, w) projected last backbone map,
        ``feat_mask`` (B, h, w) True on padding, ``maps`` the backbone maps of :attr:`backbone_stages`
        (finest first), ``feature_size`` (h, w), and the attention of ``need_weights``.
        """
        if images.dim() != 4 or images.shape[1] != 3:
            raise ValueError(f"DETR expects images of shape (B, 3, H, W), got {tuple(images.shape)}")
        B, _, H, W = images.shape
        if mask is None:
            pad_mask = torch.zeros((B, H, W), dtype=torch.bool, device=images.device)
        elif mask.shape != (B, H, W):
            raise ValueError(f"mask must have shape (B, H, W) = {(B, H, W)} matching the images, got {tuple(mask.shape)}")
        else:
            pad_mask = mask.bool()
        if self.backbone_stages is None:
            features, feat_mask = self.backbone(images, pad_mask)
            maps = [features]
        else:
            maps, masks = self.backbone.forward_features(images, pad_mask)
            features, feat_mask = maps[-1], masks[-1]
        h, w = features.shape[-2:]
        src_map = self.input_proj(features)
        src = src_map.flatten(2).transpose(1, 2)
        pos = self.position_embedding(feat_mask).flatten(2).transpose(1, 2).to(src.dtype)
        # without padding, no key mask lets SDPA take its fused kernels
        key_padding_mask = None if mask is None else feat_mask.flatten(1)
        out = self.transformer(
            src, key_padding_mask, self.query_embed.weight, pos,
            return_intermediate=self.aux_loss, need_weights=need_weights,
        )
        return {"hs": out["hs"], "memory": out["memory"], "src": src_map, "feat_mask": feat_mask, "maps": maps,
                "feature_size": (int(h), int(w)), "enc_attn": out["enc_attn"], "dec_attn": out["dec_attn"]}


# channels-last: oneDNN (CPU) and tensor cores run NHWC convolutions faster; docs/record/speed.md#measurements-behind-comments-in-the-code
_CL = dict(channels_last=True)
_TAGS = ("detection", "detr")

#: every registered DETR variant: the original checkpoints (facebookresearch/detr) and a CPU-sized one
_FB = "https://dl.fbaipublicfiles.com/detr/"
DEFAULT_CFGS: dict[str, ModelCfg] = {
    "detr_resnet50": ModelCfg(DETR_SECTIONS.of(backbone="resnet50", **_CL), PretrainedCfg(url=_FB + "detr-r50-e632da11.pth")),
    "detr_resnet50_dc5": ModelCfg(DETR_SECTIONS.of(backbone="resnet50", dilation=True, **_CL),
                                  PretrainedCfg(url=_FB + "detr-r50-dc5-f0fb7ef5.pth")),
    "detr_resnet101": ModelCfg(DETR_SECTIONS.of(backbone="resnet101", **_CL), PretrainedCfg(url=_FB + "detr-r101-2c7b67e5.pth")),
    "detr_resnet101_dc5": ModelCfg(DETR_SECTIONS.of(backbone="resnet101", dilation=True, **_CL),
                                   PretrainedCfg(url=_FB + "detr-r101-dc5-a2e86def.pth")),
    "detr_tiny": ModelCfg(DETR_SECTIONS.of(backbone="resnet18", hidden_dim=128, nheads=4, enc_layers=3, dec_layers=3,
                               dim_feedforward=512, num_queries=50)),
}


#: the registry-wide test's settings: the variant's own backbone (ResNet-50 for the R101s: the same blocks) and a
#: transformer of 32 dims, 1 + 2 layers, 5 queries, on 64-px images
_TINY = dict(arch=dict(hidden_dim=32, nheads=2, enc_layers=1, dec_layers=2, dim_feedforward=32, num_queries=5))
_TEST = dict(test_kwargs=_TINY, test_image_size=(64, 64))
_TEST_R101 = dict(test_kwargs=dict(_TINY, backbone="resnet50"), test_image_size=(64, 64))


def _create(name: str, **kwargs) -> DETR:
    return DETR_SECTIONS.create(lambda **kw: build_detr(DETR, **kw), DEFAULT_CFGS[name], **kwargs)


def _original(name: str):
    return torch_hub_state_dict(DEFAULT_CFGS[name].pretrained_cfg.url, name)


@register_model(fetch_pretrained=_original("detr_resnet50"), filter_fn=convert_state_dict, tags=_TAGS, **_TEST)
def detr_resnet50(**kwargs) -> DETR:
    """DETR R50 (42.0 COCO AP)."""
    return _create("detr_resnet50", **kwargs)


@register_model(fetch_pretrained=_original("detr_resnet50_dc5"), filter_fn=convert_state_dict, tags=_TAGS, **_TEST)
def detr_resnet50_dc5(**kwargs) -> DETR:
    """DETR R50-DC5 (43.3 COCO AP)."""
    return _create("detr_resnet50_dc5", **kwargs)


@register_model(fetch_pretrained=_original("detr_resnet101"), filter_fn=convert_state_dict, tags=_TAGS, **_TEST_R101)
def detr_resnet101(**kwargs) -> DETR:
    """DETR R101 (43.5 COCO AP)."""
    return _create("detr_resnet101", **kwargs)


@register_model(fetch_pretrained=_original("detr_resnet101_dc5"), filter_fn=convert_state_dict, tags=_TAGS, **_TEST_R101)
def detr_resnet101_dc5(**kwargs) -> DETR:
    """DETR R101-DC5 (44.9 COCO AP)."""
    return _create("detr_resnet101_dc5", **kwargs)


@register_model(filter_fn=convert_state_dict, tags=_TAGS, **_TEST)
def detr_tiny(**kwargs) -> DETR:
    """A small DETR (ResNet-18, 128 dims, 3+3 layers) that trains on CPU with 128-256 px images."""
    return _create("detr_tiny", **kwargs)
