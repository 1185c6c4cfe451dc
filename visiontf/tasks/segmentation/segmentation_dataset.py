"""The segmentation Dataset (checked label maps through an albumentations transform) and its collate."""
from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from visiontf.data.batching import pad_images
from visiontf.data.io import ImageReadError, image_size, read_image, read_mask
from visiontf.data.loading import AugmentedDataset, DatasetLayoutError, EpochIndex
from visiontf.data.segmentation_labels import IGNORE_INDEX, LabelError, reduce_zero_label

log = logging.getLogger(__name__)


class SegmentationDataset(AugmentedDataset):
    """(image, mask) pairs read with :mod:`visiontf.data.io` and passed through an albumentations transform.

    Args:
        pairs: (image path, mask path) list, e.g. from :func:`generic_pairs`.
        num_classes: K; valid labels are ``0..K-1`` and ``ignore_index``.
        transform: ``transform(image=, mask=)`` returning tensors (see :func:`segmentation_transforms`);
            ``None`` returns the uint8 arrays.
        reduce_zero_label: apply the ADE20K mapping (0 -> ignore, others -1) before checking labels.
        strict: labels outside ``[0, K)`` raise :class:`LabelError`; otherwise they become ``ignore_index``,
            with a warning naming the first files and a running count.
        seed: with the data modules' train sampler, each sample's augmentation is drawn from
            (seed, epoch, index); see :class:`~visiontf.data.loading.AugmentedDataset`.
        allow_jpeg_masks: read masks stored as JPEG (refused by default: lossy labels, see
            :func:`~visiontf.data.io.read_mask`).

    Returns ``(image float32 (3, H, W), mask int64 (H, W))`` with a transform.
    """

    #: Files named individually in warnings before switching to periodic summaries.
    MAX_NAMED_WARNINGS = 10

    def __init__(
        self,
        pairs: Sequence[tuple[str | Path, str | Path]],
        num_classes: int,
        transform: Callable[..., dict[str, Any]] | None = None,
        reduce_zero_label: bool = False,
        ignore_index: int = IGNORE_INDEX,
        strict: bool = False,
        class_names: Sequence[str] | None = None,
        seed: int = 0,
        allow_jpeg_masks: bool = False,
    ) -> None:
        if not 1 <= num_classes <= 255:
            raise DatasetLayoutError(f"{num_classes} classes (classes.txt's lines, or num_classes): masks hold 8-bit labels "
                                     "(0..255, 255 the ignore value), so a dataset has 1..255 classes; list fewer")
        if num_classes > ignore_index >= 0:
            raise DatasetLayoutError(f"{num_classes} classes with ignore_index {ignore_index}: the ignore value would be a "
                                     f"class's label; give ignore_index a value of {num_classes} or more (255 by default)")
        self.pairs = [(Path(i), Path(m)) for i, m in pairs]
        self.num_classes = num_classes
        self.transform = transform
        self.seed = seed
        self.reduce_zero_label = reduce_zero_label
        self.ignore_index = ignore_index
        self.strict = strict
        self.allow_jpeg_masks = allow_jpeg_masks
        self.class_names = list(class_names) if class_names is not None else [f"class_{k}" for k in range(num_classes)]
        self.bad_label_files: set[Path] = set()
        self.bad_label_pixels = 0

    def __len__(self) -> int:
        return len(self.pairs)

    def image_sizes(self) -> list[Hashable]:
        """Each image's upright (width, height) from its header (no pixel is decoded): the size buckets of
        evaluation batches, since the eval transform is a function of the size. An image whose header
        cannot be read gets a key of its own (batched alone; reading it then names the problem)."""
        sizes: list[Hashable] = []
        for i, (img_path, _) in enumerate(self.pairs):
            try:
                sizes.append(image_size(img_path))
            except ImageReadError:
                sizes.append(("unreadable header", i))
        return sizes

    def _check_labels(self, mask: np.ndarray, path: Path) -> np.ndarray:
        bad = (mask >= self.num_classes) & (mask != self.ignore_index)
        if not bad.any():
            return mask
        values = sorted(int(v) for v in np.unique(mask[bad]))
        if self.strict:
            raise LabelError(
                f"{path}: labels {values} outside [0, {self.num_classes}) (ignore {self.ignore_index})"
                f"{' after reduce-zero-label' if self.reduce_zero_label else ''}; fix the mask, raise num_classes "
                "/ the class list, or pass strict=False to map them to ignore"
            )
        n = int(bad.sum())
        if path not in self.bad_label_files:
            self.bad_label_files.add(path)
            self.bad_label_pixels += n
            count = len(self.bad_label_files)
            if count <= self.MAX_NAMED_WARNINGS:
                log.warning("%s: %d pixel(s) with labels %s outside [0, %d) mapped to ignore %d",
                               path, n, values, self.num_classes, self.ignore_index)
            elif count % 100 == 0 or count == self.MAX_NAMED_WARNINGS + 1:
                log.warning("%d mask files so far had labels outside [0, %d), %d pixels mapped to ignore",
                               count, self.num_classes, self.bad_label_pixels)
        mask = mask.copy()
        mask[bad] = self.ignore_index
        return mask

    def load(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """The checked uint8 image (H, W, 3) and label map (H, W) of sample ``i``, before the transform."""
        img_path, mask_path = self.pairs[i]
        image = read_image(img_path)
        mask = read_mask(mask_path, allow_jpeg=self.allow_jpeg_masks)
        if image.shape[:2] != mask.shape:
            raise DatasetLayoutError(
                f"{img_path} is {image.shape[1]}x{image.shape[0]} (WxH) but its mask {mask_path} is "
                f"{mask.shape[1]}x{mask.shape[0]}; a mask must have its image's size"
            )
        if self.reduce_zero_label:
            mask = reduce_zero_label(mask, self.ignore_index)
        return image, self._check_labels(mask, mask_path)

    def __getitem__(self, key: int | EpochIndex) -> tuple[Any, Any]:
        image, mask = self.load(self.sample_index(key))
        if self.transform is None:
            return image, mask
        out = self.transform(image=image, mask=mask)
        return out["image"], torch.as_tensor(out["mask"]).long()


def check_classes_present(dataset: SegmentationDataset, split: str) -> None:
    """Refuse a training split whose masks, every one of them, hold a single class.

    Binary masks saved as 0/255 are the usual cause: 255 is the ignore value, so the foreground would never be
    trained on, and the scores on such a validation split are perfect (mIoU 1.0) without a word. The masks are
    read spread over the split first and the look stops at the second class seen, so a sound split costs a mask or
    two, and one whose other classes are rare is read until one of them turns up, never refused.
    """
    if dataset.num_classes < 2 or not dataset.pairs:
        return
    count = len(dataset.pairs)
    spread = np.linspace(0, count - 1, num=min(count, 64)).round().astype(int).tolist()
    order = list(dict.fromkeys([*spread, *range(count)]))
    seen: set[int] = set()
    ignored = total = 0
    for i in order:
        mask = read_mask(dataset.pairs[i][1], allow_jpeg=dataset.allow_jpeg_masks)
        if dataset.reduce_zero_label:
            mask = reduce_zero_label(mask, dataset.ignore_index)
        values, counts = np.unique(mask, return_counts=True)
        for value, n in zip(values.tolist(), counts.tolist()):
            if value == dataset.ignore_index:
                ignored += n
            elif value < dataset.num_classes:
                seen.add(value)
        total += mask.size
        if len(seen) >= 2:
            return
    only = f"class {next(iter(seen))} ({dataset.class_names[next(iter(seen))]})" if seen else "no class"
    binary = (f"; {ignored / total:.0%} of their pixels are {dataset.ignore_index}, the ignore value: binary masks saved "
              f"as 0/{dataset.ignore_index}? Save the foreground as its class index (1 for the second line of "
              "classes.txt)") if ignored else ""
    raise LabelError(
        f"{dataset.pairs[0][1].parent}: all {count} {split} masks hold {only} and no other of the "
        f"{dataset.num_classes} classes{binary}; a model trained on one class learns nothing, and its scores on such "
        "masks are perfect")


def segmentation_collate(batch: Sequence[tuple[torch.Tensor, torch.Tensor]], ignore_index: int = IGNORE_INDEX,
                         with_sizes: bool = False) -> tuple[torch.Tensor, ...]:
    """Stack samples, padding bottom/right to the largest size: images with 0, masks with ``ignore_index``.

    ``with_sizes`` (mmseg's test protocol, where each mask keeps its original size while its image is
    resized) adds ``sizes`` int64 (B, 4): each sample's image height and width before padding, then
    its mask's, so the task can drop the padding and resize the logits to the mask
    (``(images, masks, sizes)``; without it ``(images, masks)``).
    """
    images = pad_images([img for img, _ in batch]).images
    masks = pad_images([torch.as_tensor(mask, dtype=torch.int64) for _, mask in batch], fill=ignore_index).images
    if not with_sizes:
        return images, masks
    sizes = torch.tensor([[*img.shape[-2:], *torch.as_tensor(mask).shape[-2:]] for img, mask in batch], dtype=torch.int64)
    return images, masks, sizes


class _Collate:
    """Picklable collate bound to an ignore value (worker processes pickle it under spawn)."""

    def __init__(self, ignore_index: int, with_sizes: bool = False) -> None:
        self.ignore_index = ignore_index
        self.with_sizes = with_sizes

    def __call__(self, batch):
        return segmentation_collate(batch, self.ignore_index, self.with_sizes)
