"""Reference: the Swin Transformer of IDEA-Research/DINO (``models/dino/swin_transformer.py``), in our words.

Written for the parity tests (``tests/test_dino_swin.py``): the same module tree and parameter names as
DINO's ``SwinTransformer`` (so one state dict loads into it, DINO's code and
:mod:`visiontf.models.backbones.dino_swin`) and the same arithmetic, step by step, with an explicit softmax:

* the image is zero-padded bottom/right to a multiple of the 4-pixel patch; conv 4x4; LayerNorm;
* a block: LayerNorm, reshape to (B, H, W, C), zero-pad bottom/right to a multiple of the window,
  roll by -window // 2 (odd blocks), partition into windows, attention with the relative position
  bias (and on shifted blocks a mask of -100 between the nine regions of the padded grid), merge,
  roll back, crop, residual; then LayerNorm, MLP (GELU), residual;
* patch merging: zero-pad odd sides, concatenate x[0::2, 0::2], x[1::2, 0::2], x[0::2, 1::2],
  x[1::2, 1::2], LayerNorm(4C), Linear(4C -> 2C, no bias); it ends stages 0-2 (``layers.i.downsample``);
* the outputs of the stages in ``out_indices`` through ``norm{i}``, as (B, C, H, W).

``benchmarks/dino_swin_parity.py`` checks this file against DINO's own code (result in docs/backbones.md).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def _windows(x: Tensor, w: int) -> Tensor:
    B, H, W, C = x.shape
    x = x.reshape(B, H // w, w, W // w, w, C).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(B * (H // w) * (W // w), w * w, C)


def _unwindows(x: Tensor, w: int, B: int, H: int, W: int) -> Tensor:
    x = x.reshape(B, H // w, W // w, w, w, -1).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(B, H, W, -1)


class Attention(nn.Module):
    def __init__(self, dim, window, heads):
        super().__init__()
        self.heads, self.window = heads, window
        self.relative_position_bias_table = nn.Parameter(torch.zeros((2 * window - 1) * (2 * window - 1), heads))
        # token a = (a // window, a % window); index of the offset (dy, dx) of a from b, both shifted to >= 0
        a = torch.arange(window * window)
        dy = a[:, None] // window - a[None, :] // window + window - 1
        dx = a[:, None] % window - a[None, :] % window + window - 1
        self.register_buffer("relative_position_index", dy * (2 * window - 1) + dx)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x, mask):
        n, N, C = x.shape
        d = C // self.heads
        q, k, v = self.qkv(x).reshape(n, N, 3, self.heads, d).permute(2, 0, 3, 1, 4)
        logits = (q * d ** -0.5) @ k.transpose(-2, -1)
        bias = self.relative_position_bias_table[self.relative_position_index.flatten()].reshape(N, N, self.heads)
        logits = logits + bias.permute(2, 0, 1)[None]
        if mask is not None:
            windows = mask.shape[0]
            logits = (logits.reshape(n // windows, windows, self.heads, N, N) + mask[None, :, None]).reshape(n, self.heads, N, N)
        out = logits.softmax(-1) @ v
        return self.proj(out.transpose(1, 2).reshape(n, N, C))


class Mlp(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, dim, heads, window, shift):
        super().__init__()
        self.window, self.shift = window, shift
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = Attention(dim, window, heads)
        self.mlp = Mlp(dim)

    def forward(self, x, H, W, mask):
        B, _, C = x.shape
        w, s = self.window, self.shift
        y = self.norm1(x).reshape(B, H, W, C)
        y = F.pad(y, (0, 0, 0, (w - W % w) % w, 0, (w - H % w) % w))
        Hp, Wp = y.shape[1], y.shape[2]
        if s:
            y = torch.roll(y, (-s, -s), (1, 2))
        y = _unwindows(self.attn(_windows(y, w), mask if s else None), w, B, Hp, Wp)
        if s:
            y = torch.roll(y, (s, s), (1, 2))
        x = x + y[:, :H, :W].reshape(B, H * W, C)
        return x + self.mlp(self.norm2(x))


class Merge(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.reduction = nn.Linear(4 * dim, 2 * dim, bias=False)
        self.norm = nn.LayerNorm(4 * dim)

    def forward(self, x, H, W):
        B, _, C = x.shape
        x = x.reshape(B, H, W, C)
        if H % 2 or W % 2:
            x = F.pad(x, (0, 0, 0, W % 2, 0, H % 2))
        parts = [x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]]
        return self.reduction(self.norm(torch.cat(parts, -1).reshape(B, -1, 4 * C)))


def region_mask(H, W, w, s):
    """-100 between the nine regions of the padded (H, W) grid, per window pair; 0 within one."""
    Hp, Wp = -(-H // w) * w, -(-W // w) * w
    label = torch.zeros(1, Hp, Wp, 1)
    n = 0
    for rows in (slice(0, -w), slice(-w, -s), slice(-s, None)):
        for cols in (slice(0, -w), slice(-w, -s), slice(-s, None)):
            label[:, rows, cols, :] = n
            n += 1
    ids = _windows(label, w)[..., 0]
    diff = ids[:, None, :] - ids[:, :, None]
    return diff.masked_fill(diff != 0, -100.0).masked_fill(diff == 0, 0.0)


class Stage(nn.Module):
    def __init__(self, dim, depth, heads, window, merge):
        super().__init__()
        self.window = window
        self.blocks = nn.ModuleList(Block(dim, heads, window, 0 if i % 2 == 0 else window // 2) for i in range(depth))
        self.downsample = Merge(dim) if merge else None


class Patches(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.proj = nn.Conv2d(3, dim, 4, 4)
        self.norm = nn.LayerNorm(dim)


class ReferenceSwin(nn.Module):
    def __init__(self, embed_dim=96, depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24), window_size=7, out_indices=(1, 2, 3)):
        super().__init__()
        self.out_indices = tuple(out_indices)
        self.patch_embed = Patches(embed_dim)
        self.dims = [embed_dim * 2 ** i for i in range(len(depths))]
        self.layers = nn.ModuleList(
            Stage(self.dims[i], depths[i], num_heads[i], window_size, i < len(depths) - 1) for i in range(len(depths))
        )
        for i in self.out_indices:
            self.add_module(f"norm{i}", nn.LayerNorm(self.dims[i]))

    def forward(self, images):
        H, W = images.shape[-2:]
        if W % 4:
            images = F.pad(images, (0, 4 - W % 4))
        if H % 4:
            images = F.pad(images, (0, 0, 0, 4 - H % 4))
        x = self.patch_embed.proj(images)
        B, C, H, W = x.shape
        x = self.patch_embed.norm(x.flatten(2).transpose(1, 2))
        outs = []
        for i, stage in enumerate(self.layers):
            w = stage.window
            mask = region_mask(H, W, w, w // 2)
            for block in stage.blocks:
                x = block(x, H, W, mask)
            if i in self.out_indices:
                y = getattr(self, f"norm{i}")(x)
                outs.append(y.reshape(B, H, W, -1).permute(0, 3, 1, 2))
            if stage.downsample is not None:
                x = stage.downsample(x, H, W)
                H, W = (H + 1) // 2, (W + 1) // 2
        return outs
