"""SETR's decoders, module for module as mmsegmentation 1.x builds them for its SETR configs.

Parameter names follow mmseg's (``up_convs.0.0.conv.weight``, ``neck.mla.channel_proj.0.bn.*``) so its
checkpoints map onto these modules by prefix alone; only the classifier is called ``cls_seg`` here
(mmseg: ``conv_seg``). Every head returns logits at its own resolution; :class:`~visiontf.models.setr.setr.SETR`
resizes them to the input, as mmseg's ``predict_by_feat`` and its loss do.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn


def norm_layer(norm: str) -> type[nn.Module]:
    """The BatchNorm class for ``norm``: ``"bn"`` (one device) or ``"syncbn"`` (DDP, mmseg's SyncBN)."""
    if norm == "bn":
        return nn.BatchNorm2d
    if norm == "syncbn":
        return nn.SyncBatchNorm
    raise ValueError(f"norm={norm!r}; use 'bn' (one device) or 'syncbn' (DDP, statistics over all GPUs)")


class ConvBNReLU(nn.Module):
    """mmcv's ``ConvModule`` as SETR configures it: bias-free conv ("same" padding), BatchNorm, ReLU."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, norm: type[nn.Module]) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2, bias=False)
        self.bn = norm(out_channels)
        self.activate = nn.ReLU(inplace=True)

    def forward(self, x: Tensor) -> Tensor:
        return self.activate(self.bn(self.conv(x)))


def upsample(scale: int, align_corners: bool) -> nn.Upsample:
    """Bilinear x``scale``; for integer scales the same sampling grid as mmseg's size-based ``Upsample``."""
    return nn.Upsample(scale_factor=float(scale), mode="bilinear", align_corners=align_corners)


def channel_layer_norm(norm: nn.LayerNorm, x: Tensor) -> Tensor:
    """LayerNorm over the channels of every position of a (B, C, H, W) map (mmseg normalises (B, HW, C) tokens)."""
    return norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class UpHead(nn.Module):
    """mmseg's ``SETRUPHead``, the Naive and PUP decoders and their auxiliary heads.

    LayerNorm (eps 1e-6) over the tapped tokens, then ``num_convs`` x (``kernel_size`` conv + BN + ReLU,
    bilinear x``up_scale``), then a 1x1 classifier. (B, C, h, w) -> (B, K, h * up_scale**num_convs, ...).
    Naive: 1 x (1x1 conv, x4); PUP: 4 x (3x3 conv, x2).
    """

    def __init__(self, in_channels: int, channels: int, num_classes: int, num_convs: int, up_scale: int,
                 kernel_size: int, norm: type[nn.Module], align_corners: bool = False) -> None:
        super().__init__()
        if kernel_size not in (1, 3):
            raise ValueError(f"kernel_size={kernel_size}; SETR's up-heads use 1 (Naive) or 3 (PUP)")
        if num_convs < 1:
            raise ValueError(f"num_convs={num_convs}; an up-head needs at least one conv block")
        self.norm = nn.LayerNorm(in_channels, eps=1e-6)
        self.up_convs = nn.ModuleList(
            nn.Sequential(ConvBNReLU(in_channels if i == 0 else channels, channels, kernel_size, norm),
                          upsample(up_scale, align_corners))
            for i in range(num_convs)
        )
        self.cls_seg = nn.Conv2d(channels, num_classes, 1)

    def forward(self, x: Tensor) -> Tensor:
        x = channel_layer_norm(self.norm, x)
        for block in self.up_convs:
            x = block(x)
        return self.cls_seg(x)


class MLAModule(nn.Module):
    """The aggregation of mmseg's ``MLANeck``: per level 1x1 conv -> ``channels``; top-down cumulative sums
    starting from the deepest level; a 3x3 conv per sum.

    Outputs are ordered as mmseg's: ``out[0]`` is the deepest level alone, ``out[-1]`` the sum of all.
    """

    def __init__(self, in_channels: int, channels: int, num_levels: int, norm: type[nn.Module]) -> None:
        super().__init__()
        self.channel_proj = nn.ModuleList(ConvBNReLU(in_channels, channels, 1, norm) for _ in range(num_levels))
        self.feat_extract = nn.ModuleList(ConvBNReLU(channels, channels, 3, norm) for _ in range(num_levels))

    def forward(self, feats: Sequence[Tensor]) -> list[Tensor]:
        projected = [proj(f) for f, proj in zip(feats, self.channel_proj)]
        sums: list[Tensor] = []
        for p in reversed(projected):  # deepest first
            sums.append(p if not sums else sums[-1] + p)
        return [conv(s) for s, conv in zip(sums, self.feat_extract)]


class MLANeck(nn.Module):
    """mmseg's ``MLANeck``: a LayerNorm (eps 1e-6) per tapped block, then :class:`MLAModule`.

    ``num_levels`` maps (B, C, h, w) -> ``num_levels`` maps (B, channels, h, w), deepest level first.
    """

    def __init__(self, in_channels: int, channels: int, num_levels: int, norm: type[nn.Module]) -> None:
        super().__init__()
        self.norm = nn.ModuleList(nn.LayerNorm(in_channels, eps=1e-6) for _ in range(num_levels))
        self.mla = MLAModule(in_channels, channels, num_levels, norm)

    def forward(self, feats: Sequence[Tensor]) -> list[Tensor]:
        if len(feats) != len(self.norm):
            raise ValueError(f"MLANeck expects {len(self.norm)} feature maps, got {len(feats)}")
        return self.mla([channel_layer_norm(n, f) for f, n in zip(feats, self.norm)])


class MLAHead(nn.Module):
    """mmseg's ``SETRMLAHead``: per neck output 2 x (3x3 conv -> ``mla_channels`` + BN + ReLU) and bilinear
    x``up_scale``; concatenated; 1x1 classifier. ``num_levels`` x (B, C, h, w) -> (B, K, h * up_scale, ...)."""

    def __init__(self, in_channels: int, mla_channels: int, num_classes: int, num_levels: int, up_scale: int,
                 norm: type[nn.Module], align_corners: bool = False) -> None:
        super().__init__()
        self.up_convs = nn.ModuleList(
            nn.Sequential(ConvBNReLU(in_channels, mla_channels, 3, norm), ConvBNReLU(mla_channels, mla_channels, 3, norm),
                          upsample(up_scale, align_corners))
            for _ in range(num_levels)
        )
        self.cls_seg = nn.Conv2d(num_levels * mla_channels, num_classes, 1)

    def forward(self, feats: Sequence[Tensor]) -> Tensor:
        return self.cls_seg(torch.cat([block(f) for f, block in zip(feats, self.up_convs)], dim=1))


class ClassifierHead(nn.Module):
    """mmseg's ``FCNHead`` with ``num_convs=0`` (MLA's auxiliary heads): a 1x1 classifier on one neck output."""

    def __init__(self, in_channels: int, num_classes: int) -> None:
        super().__init__()
        self.cls_seg = nn.Conv2d(in_channels, num_classes, 1)

    def forward(self, x: Tensor) -> Tensor:
        return self.cls_seg(x)
