"""Non-overlapping patches -> tokens, with timm's ``PatchEmbed`` options and parameter names.

One strided convolution (``proj``). ``dynamic_img_pad`` zero-pads the image at the bottom and right
to a multiple of the patch (timm's arithmetic: ``F.pad(x, (0, pad_w, 0, pad_h))``), so any size is
accepted and the grid is the ceiling of size / patch; without it a size that is not a multiple of
the patch is refused. :meth:`PatchEmbed.set_input_size` changes the nominal image size and, as
timm, the patch size (the kernel resampled with ``timm.layers.resample_patch_embed``).
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def to_pair(x: int | Sequence[int]) -> tuple[int, int]:
    return (x, x) if isinstance(x, int) else (int(x[0]), int(x[1]))


class PatchEmbed(nn.Module):
    """(B, C, H, W) -> tokens (B, h * w, D) and the patch grid (h, w)."""

    def __init__(self, img_size: int | tuple[int, int], patch_size: int | tuple[int, int], in_chans: int, embed_dim: int,
                 bias: bool = True, dynamic_img_pad: bool = False) -> None:
        super().__init__()
        self.patch_size = to_pair(patch_size)
        self.img_size = to_pair(img_size)
        self.dynamic_img_pad = dynamic_img_pad
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=self.patch_size, stride=self.patch_size, bias=bias)

    @property
    def grid_size(self) -> tuple[int, int]:
        """The patch grid of the nominal image size (the grid ``pos_embed`` is stored at)."""
        return self.img_size[0] // self.patch_size[0], self.img_size[1] // self.patch_size[1]

    def dynamic_feat_size(self, img_size: tuple[int, int]) -> tuple[int, int]:
        """The patch grid an image of ``img_size`` gives (rounded up with ``dynamic_img_pad``)."""
        (h, w), (ph, pw) = img_size, self.patch_size
        if self.dynamic_img_pad:
            return math.ceil(h / ph), math.ceil(w / pw)
        return h // ph, w // pw

    def set_input_size(self, img_size: int | tuple[int, int] | None = None, patch_size: int | tuple[int, int] | None = None) -> None:
        """New nominal image size and/or patch size (the kernel resampled as timm's ``resample_patch_embed``)."""
        if patch_size is not None and to_pair(patch_size) != self.patch_size:
            from timm.layers import resample_patch_embed

            new = to_pair(patch_size)
            old = self.proj
            proj = nn.Conv2d(old.in_channels, old.out_channels, kernel_size=new, stride=new, bias=old.bias is not None,
                             device=old.weight.device, dtype=old.weight.dtype)
            with torch.no_grad():
                proj.weight.copy_(resample_patch_embed(old.weight, list(new)))
                if old.bias is not None:
                    proj.bias.copy_(old.bias)
            proj.weight.requires_grad_(old.weight.requires_grad)
            self.proj, self.patch_size = proj, new
        if img_size is not None:
            self.img_size = to_pair(img_size)

    def forward(self, x: Tensor) -> tuple[Tensor, tuple[int, int]]:
        H, W = x.shape[-2:]
        ph, pw = self.patch_size
        if self.dynamic_img_pad:
            x = F.pad(x, (0, (pw - W % pw) % pw, 0, (ph - H % ph) % ph))
        elif H % ph or W % pw:
            raise ValueError(
                f"input {H}x{W} is not divisible by the patch size {self.patch_size}; resize or pad the image, "
                "or build the model with dynamic_img_pad=True (pads bottom/right to a patch multiple, as timm)"
            )
        x = self.proj(x)
        grid = (x.shape[-2], x.shape[-1])
        return x.flatten(2).transpose(1, 2), grid
