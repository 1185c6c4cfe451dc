"""Shared pieces of the Deformable DETR tests: toy configurations of both layouts, weights, inputs."""
from __future__ import annotations

import math
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ is not an installed package
from benchmarks.reference_deformable_detr import OriginalDeformableDETR  # noqa: E402

#: the published variants' switches
VARIANTS = {
    "plain": {},
    "box_refine": {"with_box_refine": True},
    "two_stage": {"with_box_refine": True, "two_stage": True},
}
#: a toy model in the original layout (ResNet-18 trunk, d 64, 4 levels, 2+2 layers, 12 queries) ...
TOY_ORIGINAL = dict(num_classes=7, backbone="resnet18", num_feature_levels=4, d=64, nheads=4, enc_layers=2, dec_layers=2,
                    dim_feedforward=96, num_queries=12, dec_n_points=2, enc_n_points=3, dropout=0.0)
#: ... and the same in visiontf's arguments
TOY = dict(num_classes=7, backbone="resnet18", num_feature_levels=4, hidden_dim=64, nheads=4, enc_layers=2, dec_layers=2,
           dim_feedforward=96, num_queries=12, dec_n_points=2, enc_n_points=3, dropout=0.0)

_TABLES = ("query_embed.weight", "level_embed", "query_position_embeddings.weight")


def randomize(module: nn.Module, seed: int = 0) -> None:
    """Non-trivial values everywhere (BN statistics, norms, offsets too) with moderate activations."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in list(module.named_parameters()) + list(module.named_buffers()):
            if not t.is_floating_point():
                continue
            if name.endswith("running_var"):
                t.copy_(torch.empty(t.shape).uniform_(0.5, 1.5, generator=g))
            elif name.endswith("running_mean"):
                t.copy_(0.1 * torch.randn(t.shape, generator=g))
            elif t.dim() == 1 and any(k in name for k in ("norm", "bn", "downsample.1", "normalization")) or (
                "input_proj" in name and ".1." in name
            ):
                t.copy_((0.5 if name.endswith("weight") else 0.0) + 0.1 * torch.randn(t.shape, generator=g))
            elif name.endswith(_TABLES):
                t.copy_(torch.randn(t.shape, generator=g))
            else:
                fan = t[0].numel() if t.dim() > 1 else 16
                t.copy_(torch.randn(t.shape, generator=g) / math.sqrt(max(1, fan)))


def original(variant: str, seed: int = 0, **overrides) -> OriginalDeformableDETR:
    model = OriginalDeformableDETR(**{**TOY_ORIGINAL, **VARIANTS[variant], **overrides}).eval()
    randomize(model, seed)
    return model


def inputs(B: int = 2, H: int = 96, W: int = 128, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Images and a padding mask: the second image padded on the right and at the bottom."""
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(B, 3, H, W, generator=g)
    mask = torch.zeros(B, H, W, dtype=torch.bool)
    if B > 1:
        mask[1, :, 3 * W // 4:] = True
        mask[1, 5 * H // 6:, :] = True
    images[mask[:, None].expand_as(images)] = 0
    return images, mask


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.detach().float() - b.detach().float()).abs().max().item()
