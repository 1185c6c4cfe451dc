"""The convolutional encoder and decoder of VQGAN (Esser et al., "Taming Transformers", 2021).

The layout and maths are those of CompVis/taming-transformers
``taming/modules/diffusionmodules/model.py`` (``Encoder``, ``Decoder``, ``ResnetBlock``,
``AttnBlock``, ``Downsample``, ``Upsample``), so a taming state dict loads key for key:
``conv_in``, ``down.{i}.block.{j}.{norm1,conv1,norm2,conv2,nin_shortcut}``,
``down.{i}.attn.{j}.{norm,q,k,v,proj_out}``, ``down.{i}.downsample.conv``,
``mid.{block_1,attn_1,block_2}``, ``up.{i}.block.{j}``, ``up.{i}.upsample.conv``, ``norm_out``,
``conv_out``. Level ``i`` of both the encoder's ``down`` and the decoder's ``up`` works at
``resolution / 2**i`` (taming builds ``up`` from the lowest resolution and prepends, so its
indices follow the encoder's). The attention block runs on ``scaled_dot_product_attention``
instead of the original's explicit ``bmm``/softmax (same maths, one fused kernel).

Every level's channels are ``ch * ch_mult[i]``; GroupNorm has ``norm_groups`` groups (taming: 32), so
those must be multiples of it. A GroupNorm normalises each group over the whole image, so with one
channel per group (32 groups of 32 channels) it removes every feature's mean over the image: a small
model then loses the image's overall colour and brightness (``norm_groups`` below 32 keeps them as
differences between channels of a group). The blocks never see a time embedding (taming's ``temb_ch = 0``), so no
``temb_proj`` exists.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch.nn.functional as F
from torch import Tensor, nn

from visiontf.nn.attention import scaled_dot_product_attention


def swish(x: Tensor) -> Tensor:
    """``x * sigmoid(x)`` (taming's ``nonlinearity``), as one fused SiLU."""
    return F.silu(x)


def group_norm(channels: int, groups: int = 32) -> nn.GroupNorm:
    """taming's ``Normalize``: 32 groups, eps 1e-6, affine."""
    return nn.GroupNorm(num_groups=groups, num_channels=channels, eps=1e-6, affine=True)


class ResnetBlock(nn.Module):
    """norm1 -> swish -> conv1 -> norm2 -> swish -> dropout -> conv2, plus the input (through a 1x1
    ``nin_shortcut`` when the channel count changes)."""

    def __init__(self, in_channels: int, out_channels: int | None = None, dropout: float = 0.0,
                 norm_groups: int = 32) -> None:
        super().__init__()
        out_channels = in_channels if out_channels is None else out_channels
        self.in_channels, self.out_channels = in_channels, out_channels
        self.norm1 = group_norm(in_channels, norm_groups)
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, 1, 1)
        self.norm2 = group_norm(out_channels, norm_groups)
        self.dropout = nn.Dropout(dropout)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, 1, 1)
        if in_channels != out_channels:
            self.nin_shortcut = nn.Conv2d(in_channels, out_channels, 1, 1, 0)

    def forward(self, x: Tensor) -> Tensor:
        """(B, in, H, W) -> (B, out, H, W)."""
        h = self.conv1(swish(self.norm1(x)))
        h = self.conv2(self.dropout(swish(self.norm2(h))))
        if self.in_channels != self.out_channels:
            x = self.nin_shortcut(x)
        return x + h


class AttnBlock(nn.Module):
    """Single-head self-attention over all H*W positions, with 1x1 convolutions as q/k/v/proj_out
    and a residual connection; scale ``C ** -0.5``."""

    def __init__(self, channels: int, norm_groups: int = 32) -> None:
        super().__init__()
        self.in_channels = channels
        self.norm = group_norm(channels, norm_groups)
        self.q = nn.Conv2d(channels, channels, 1)
        self.k = nn.Conv2d(channels, channels, 1)
        self.v = nn.Conv2d(channels, channels, 1)
        self.proj_out = nn.Conv2d(channels, channels, 1)

    def forward(self, x: Tensor) -> Tensor:
        """(B, C, H, W) -> (B, C, H, W)."""
        B, C, H, W = x.shape
        h = self.norm(x)
        # (B, 1, HW, C): one head whose width is C, so SDPA's default scale is taming's C ** -0.5
        q, k, v = (conv(h).flatten(2).transpose(1, 2).unsqueeze(1) for conv in (self.q, self.k, self.v))
        out = scaled_dot_product_attention(q, k, v)
        out = out.squeeze(1).transpose(1, 2).reshape(B, C, H, W)
        return x + self.proj_out(out)


class Downsample(nn.Module):
    """Zero-pad one row at the bottom and one column at the right, then a 3x3 conv of stride 2
    (taming's asymmetric padding): (B, C, H, W) -> (B, C, H // 2, W // 2) for even H, W."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, 2, 0)

    def forward(self, x: Tensor) -> Tensor:
        return self.conv(F.pad(x, (0, 1, 0, 1), mode="constant", value=0.0))


class Upsample(nn.Module):
    """Nearest-neighbour x2, then a 3x3 conv."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, 1, 1)

    def forward(self, x: Tensor) -> Tensor:
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


class _Level(nn.Module):
    """One resolution of the encoder or decoder: ``block`` (ResNet blocks), ``attn`` (an attention
    block after each ResNet block, or none), and ``downsample``/``upsample`` except at the last level."""

    def __init__(self, blocks: list[ResnetBlock], attn: list[AttnBlock]) -> None:
        super().__init__()
        self.block = nn.ModuleList(blocks)
        self.attn = nn.ModuleList(attn)

    def run_blocks(self, h: Tensor) -> Tensor:
        for i, block in enumerate(self.block):
            h = block(h)
            if len(self.attn) > 0:
                h = self.attn[i](h)
        return h


class _Mid(nn.Module):
    """ResNet block, attention, ResNet block at the lowest resolution (``mid.block_1/attn_1/block_2``)."""

    def __init__(self, channels: int, dropout: float, norm_groups: int = 32) -> None:
        super().__init__()
        self.block_1 = ResnetBlock(channels, channels, dropout, norm_groups)
        self.attn_1 = AttnBlock(channels, norm_groups)
        self.block_2 = ResnetBlock(channels, channels, dropout, norm_groups)

    def forward(self, h: Tensor) -> Tensor:
        return self.block_2(self.attn_1(self.block_1(h)))


def _check_channels(ch: int, ch_mult: Sequence[int], norm_groups: int = 32) -> None:
    bad = [ch * m for m in ch_mult if (ch * m) % norm_groups]
    if bad:
        raise ValueError(f"every level's channels (ch * ch_mult = {[ch * m for m in ch_mult]}) must be a multiple of "
                         f"{norm_groups} for GroupNorm({norm_groups}) (norm_groups); {bad} are not")


class Encoder(nn.Module):
    """Image (B, in_channels, H, W) -> latent (B, z_channels, H / f, W / f), ``f = 2 ** (len(ch_mult) - 1)``.

    Level ``i`` has ``num_res_blocks`` ResNet blocks of ``ch * ch_mult[i]`` channels (an attention
    block after each when ``resolution / 2**i`` is in ``attn_resolutions``) and then a Downsample,
    except the last level; then ``mid``, ``norm_out``, swish, ``conv_out``.
    """

    def __init__(self, ch: int = 128, ch_mult: Sequence[int] = (1, 1, 2, 2, 4), num_res_blocks: int = 2,
                 attn_resolutions: Sequence[int] = (16,), resolution: int = 256, z_channels: int = 256,
                 in_channels: int = 3, double_z: bool = False, dropout: float = 0.0, norm_groups: int = 32) -> None:
        super().__init__()
        _check_channels(ch, ch_mult, norm_groups)
        self.num_resolutions = len(ch_mult)
        self.conv_in = nn.Conv2d(in_channels, ch, 3, 1, 1)
        in_mult = (1, *ch_mult)
        levels = []
        block_in = ch
        for i, mult in enumerate(ch_mult):
            block_in, block_out = ch * in_mult[i], ch * mult
            blocks, attn = [], []
            for _ in range(num_res_blocks):
                blocks.append(ResnetBlock(block_in, block_out, dropout, norm_groups))
                block_in = block_out
                if resolution // 2**i in attn_resolutions:
                    attn.append(AttnBlock(block_in, norm_groups))
            level = _Level(blocks, attn)
            if i != self.num_resolutions - 1:
                level.downsample = Downsample(block_in)
            levels.append(level)
        self.down = nn.ModuleList(levels)
        self.mid = _Mid(block_in, dropout, norm_groups)
        self.norm_out = group_norm(block_in, norm_groups)
        self.conv_out = nn.Conv2d(block_in, 2 * z_channels if double_z else z_channels, 3, 1, 1)

    def forward(self, x: Tensor) -> Tensor:
        h = self.conv_in(x)
        for i, level in enumerate(self.down):
            h = level.run_blocks(h)
            if i != self.num_resolutions - 1:
                h = level.downsample(h)
        h = self.mid(h)
        return self.conv_out(swish(self.norm_out(h)))


class Decoder(nn.Module):
    """Latent (B, z_channels, h, w) -> image (B, out_ch, h * f, w * f).

    ``conv_in`` to ``ch * ch_mult[-1]`` channels, ``mid``, then the levels from the lowest
    resolution up: ``num_res_blocks + 1`` ResNet blocks each (attention after each at
    ``attn_resolutions``) and an Upsample except at level 0; ``norm_out``, swish, ``conv_out``.
    """

    def __init__(self, ch: int = 128, ch_mult: Sequence[int] = (1, 1, 2, 2, 4), num_res_blocks: int = 2,
                 attn_resolutions: Sequence[int] = (16,), resolution: int = 256, z_channels: int = 256,
                 out_ch: int = 3, dropout: float = 0.0, give_pre_end: bool = False, norm_groups: int = 32) -> None:
        super().__init__()
        _check_channels(ch, ch_mult, norm_groups)
        self.num_resolutions = len(ch_mult)
        self.give_pre_end = give_pre_end
        block_in = ch * ch_mult[-1]
        self.conv_in = nn.Conv2d(z_channels, block_in, 3, 1, 1)
        self.mid = _Mid(block_in, dropout, norm_groups)
        levels: dict[int, _Level] = {}
        for i in reversed(range(self.num_resolutions)):
            block_out = ch * ch_mult[i]
            blocks, attn = [], []
            for _ in range(num_res_blocks + 1):
                blocks.append(ResnetBlock(block_in, block_out, dropout, norm_groups))
                block_in = block_out
                if resolution // 2**i in attn_resolutions:
                    attn.append(AttnBlock(block_in, norm_groups))
            level = _Level(blocks, attn)
            if i != 0:
                level.upsample = Upsample(block_in)
            levels[i] = level
        # index i is resolution / 2**i, as taming's up.insert(0, ...) leaves it
        self.up = nn.ModuleList(levels[i] for i in range(self.num_resolutions))
        self.norm_out = group_norm(block_in, norm_groups)
        self.conv_out = nn.Conv2d(block_in, out_ch, 3, 1, 1)

    def forward(self, z: Tensor) -> Tensor:
        h = self.mid(self.conv_in(z))
        for i in reversed(range(self.num_resolutions)):
            h = self.up[i].run_blocks(h)
            if i != 0:
                h = self.up[i].upsample(h)
        if self.give_pre_end:
            return h
        return self.conv_out(swish(self.norm_out(h)))
