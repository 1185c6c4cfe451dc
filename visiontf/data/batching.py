"""Batches of images that differ in size: one padded tensor plus a mask of where the padding is,
and the size buckets that keep evaluation batches free of padding.

The one padding function of visiontf. The detection and segmentation collates and the Predictor
all call :func:`pad_images`, so every padded batch has the same layout (image at the top left,
padding bottom/right), like DETR's ``NestedTensor`` and torchvision's ``ImageList``.

Padding changes a model's outputs: convolutions near the border see the zeros, deformable attention
samples them, so an image's detections depend on its batch neighbours (measured in
``scripts/experiments/eval_batch_invariance.py``). Evaluation and prediction therefore batch only images of
one size (:func:`size_buckets`, :class:`SizeBucketBatchSampler`): each image then meets exactly the
computation it meets alone, at any batch size and on any number of processes.
"""
from __future__ import annotations

from collections.abc import Hashable, Iterator, Sequence
from typing import NamedTuple

import torch
from torch import Tensor
from torch.utils.data import BatchSampler, Sampler


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


def size_buckets(keys: Sequence[Hashable], batch_size: int = 0) -> list[list[int]]:
    """Positions of ``keys`` grouped by equal key (an image's size), each group in its order and the
    groups in the order of their first member, cut into batches of at most ``batch_size`` (0: uncut).

    ``[(64, 80), (80, 64), (64, 80)]`` -> ``[[0, 2], [1]]``.
    """
    groups: dict[Hashable, list[int]] = {}
    for pos, key in enumerate(keys):
        groups.setdefault(key, []).append(pos)
    if batch_size < 1:
        return list(groups.values())
    return [g[i:i + batch_size] for g in groups.values() for i in range(0, len(g), batch_size)]


class SizeBucketBatchSampler(BatchSampler):
    """Batches of the ``sampler``'s indices in which every image has the same size, so nothing is padded.

    ``sizes``: one hashable key per dataset index (the image's size after the eval resize; a key
    of its own for an image whose size is unknown, which is then batched alone). The sampler's
    indices are read once per epoch and grouped with :func:`size_buckets`; under DDP the sampler is
    this rank's (unrepeated) share, so every image sees the same computation on 1 or N processes.
    ``drop_last`` drops the batches shorter than ``batch_size`` (evaluation keeps them).
    """

    def __init__(self, sampler: Sampler[int], batch_size: int, drop_last: bool = False,
                 sizes: Sequence[Hashable] = ()) -> None:
        super().__init__(sampler, batch_size, drop_last)
        self.sizes = list(sizes)

    def _batches(self) -> list[list[int]]:
        order = [int(i) for i in self.sampler]
        if order and max(order) >= len(self.sizes):
            raise ValueError(f"SizeBucketBatchSampler: index {max(order)} but only {len(self.sizes)} sizes")
        batches = [[order[p] for p in b] for b in size_buckets([self.sizes[i] for i in order], self.batch_size)]
        return [b for b in batches if len(b) == self.batch_size] if self.drop_last else batches

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self._batches())

    def __len__(self) -> int:
        return len(self._batches())


__all__ = ["PaddedBatch", "SizeBucketBatchSampler", "pad_images", "size_buckets"]
