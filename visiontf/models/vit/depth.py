"""Monocular depth with a ViT encoder: the example task of docs/architecture.md's "How to add a task".

The encoder is a registered ViT without its classifier; its last block's patch tokens, as a
(B, C, H/p, W/p) map, go through a small convolutional head (two 3x3 convolutions, each followed by a
x2 upsampling: a plain version of DPT's reassemble-and-upsample, Ranftl et al. 2021), are resized to
the input and squashed into (0, ``max_depth``) metres by a sigmoid. No published weights: it trains
from scratch, or from a ViT checkpoint for the encoder (``create_model(..., pretrained=)`` of the ViT).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from visiontf.models._registry import create_model, register_model
from visiontf.models.contract import DepthEstimator, ModelCfg, PretrainedCfg, build_model


class ViTDepth(DepthEstimator):
    """A ViT encoder and a convolutional depth head.

    Args:
        encoder: a registered ViT name (built with ``num_classes=0``).
        img_size: the encoder's input size (training images are resized to it).
        channels: width of the head's first convolution (the second has half).
        max_depth: metres at the sigmoid's top (the deepest depth the model predicts).
        encoder_kwargs: more arguments of the encoder (``depth``, ``embed_dim``, ...).
        pretrained_cfg: eval settings over the ones built from ``img_size`` and the encoder's.
    """

    def __init__(self, encoder: str = "vit_tiny_patch16_224", img_size: int | tuple[int, int] = 224, channels: int = 64,
                 max_depth: float = 10.0, encoder_kwargs: dict[str, Any] | None = None,
                 pretrained_cfg: PretrainedCfg | Mapping[str, Any] | None = None) -> None:
        super().__init__()
        self.max_depth = float(max_depth)
        self.encoder = create_model(encoder, num_classes=0, img_size=img_size, **(encoder_kwargs or {}))
        dim = self.encoder.embed_dim
        self.head = nn.Sequential(
            nn.Conv2d(dim, channels, 3, padding=1), nn.GELU(), nn.Upsample(scale_factor=2, mode="bilinear"),
            nn.Conv2d(channels, channels // 2, 3, padding=1), nn.GELU(), nn.Upsample(scale_factor=2, mode="bilinear"),
            nn.Conv2d(channels // 2, 1, 1),
        )
        encoder_cfg = self.encoder.pretrained_cfg
        self.pretrained_cfg = PretrainedCfg(input_size=encoder_cfg.input_size, mean=encoder_cfg.mean,
                                            std=encoder_cfg.std).merged(pretrained_cfg)

    def forward(self, images: Tensor) -> Tensor:
        """Images (B, 3, H, W), normalised, H and W multiples of the patch size -> depth (B, 1, H, W) metres."""
        B, _, H, W = images.shape
        ph, pw = self.encoder.patch_embed.patch_size
        tokens = self.encoder.forward_features(images)[:, self.encoder.num_prefix_tokens :]
        features = tokens.transpose(1, 2).reshape(B, -1, H // ph, W // pw)
        logits = F.interpolate(self.head(features), size=(H, W), mode="bilinear", align_corners=False)
        return torch.sigmoid(logits) * self.max_depth

    def no_weight_decay(self) -> set[str]:
        return {f"encoder.{n}" for n in self.encoder.no_weight_decay()}


DEFAULT_CFGS: dict[str, ModelCfg] = {
    "vit_depth_tiny_patch16": ModelCfg({"encoder": "vit_tiny_patch16_224", "img_size": 224}),
}


#: the registry-wide test's settings: a two-block encoder of 32 dims on 32-px images
_TEST = dict(test_kwargs=dict(encoder_kwargs=dict(embed_dim=32, depth=2, num_heads=2), channels=8), test_image_size=(32, 32))


@register_model(tags=("depth", "vit_depth"), **_TEST)
def vit_depth_tiny_patch16(**kwargs) -> ViTDepth:
    """ViT-Ti/16 encoder and a convolutional depth head (about 5.8 M parameters at 224 px)."""
    return build_model(ViTDepth, DEFAULT_CFGS["vit_depth_tiny_patch16"], **kwargs)


__all__ = ["DEFAULT_CFGS", "ViTDepth", "vit_depth_tiny_patch16"]
