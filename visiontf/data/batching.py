"""Batches of images that differ in size: one padded tensor plus a mask of where the padding is.

The one padding function of visiontf. The detection and segmentation collates and the Predictor
all call :func:`pad_images`, so every padded batch has the same layout (image at the top left,
padding bottom/right), like DETR's ``NestedTensor`` and torchvision's ``ImageList``.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor


class PaddedBatch(NamedTuple):
    """Images of different sizes in one tensor.

    ``images``: (B, ..., H, W), each item at the top left, the rest filled; ``mask``: (B, H, W) bool,
    True on padding. Unpacks as ``images, mask = batch``.
    """

    images: Tensor
    mask: Tensor

    def to(self, device: torch.device | str) -> PaddedBatch:
        return PaddedBatch(self.images.to(device), self.mask.to(device))

    @property
    def padded(self) -> bool:
        """Whether any pixel is padding (a model may then skip its key-padding mask)."""
        return bool(self.mask.any())


def pad_images(images: Sequence[Tensor], size_divisibility: int = 0, fill: float | int = 0) -> PaddedBatch:
    """Stack (..., h, w) tensors into (B, ..., H, W) with H, W the largest sizes, filled with ``fill``
    bottom/right (rounded up to a multiple of ``size_divisibility`` when > 0).

    Works for images (C, h, w) and label maps (h, w) alike; dtype and device follow the first item.
    """
    if not images:
        raise ValueError("pad_images needs at least one image")
    H = max(int(im.shape[-2]) for im in images)
    W = max(int(im.shape[-1]) for im in images)
    if size_divisibility > 0:
        H = -(-H // size_divisibility) * size_divisibility
        W = -(-W // size_divisibility) * size_divisibility
    first = images[0]
    out = first.new_full((len(images), *first.shape[:-2], H, W), fill)
    mask = torch.ones((len(images), H, W), dtype=torch.bool, device=first.device)
    for i, im in enumerate(images):
        h, w = im.shape[-2:]
        out[i, ..., :h, :w].copy_(im)
        mask[i, :h, :w] = False
    return PaddedBatch(out, mask)


__all__ = ["PaddedBatch", "pad_images"]
