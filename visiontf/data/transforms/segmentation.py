"""mmsegmentation's SETR pipelines in albumentations, as :mod:`visiontf.data.transforms.detection`
does for DETR.

Training: random rescale of a base scale by 0.5-2.0 (keep ratio) -> random crop with ``cat_max_ratio``
0.75 -> horizontal flip -> photometric distortion -> normalise -> pad to the crop (image 0, mask 255).
Validation resizes to the base scale keeping the ratio (mmseg ``Resize(keep_ratio=True)``) without
cropping, since sliding-window inference handles large images. With ``resize_mask=False`` (mmseg's
test pipeline, which loads the annotation after ``Resize``) the mask keeps its original size.

Every image resize is mmcv's ``imresize(interpolation="bilinear")``: ``cv2.resize`` with
``INTER_LINEAR`` on the uint8 image, no antialiasing (:func:`resize_image_like_mmcv` for tensors).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import albumentations as A
import cv2
import numpy as np
import torch
from albumentations.augmentations.crops.transforms import BaseCrop
from albumentations.core.transforms_interface import DualTransform
from albumentations.pytorch import ToTensorV2
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from torch import Tensor

from visiontf.data.segmentation_labels import IGNORE_INDEX


def keep_ratio_size(h: int, w: int, scale: Sequence[float]) -> tuple[int, int]:
    """mmcv ``rescale_size``: the largest (h, w) with the long side <= max(scale), short side <= min(scale)."""
    factor = min(max(scale) / max(h, w), min(scale) / min(h, w))
    return max(1, int(h * factor + 0.5)), max(1, int(w * factor + 0.5))


def resize_image_like_mmcv(image: Tensor, size: Sequence[int]) -> Tensor:
    """mmcv ``imresize(img, size, interpolation="bilinear")``: ``cv2.resize`` with ``INTER_LINEAR``.

    ``image``: float (3, H, W) in [0, 1] on any device -> float (3, h, w) for ``size`` (h, w), same
    device and dtype. An image of uint8 values (every decoded file) is resized as uint8, which is
    what mmseg resizes, so the result is bit-exact to its pipeline; other values go through cv2's
    float path. torchvision's ``antialias=True`` low-pass filters when downscaling, which mmseg does
    not; its ``antialias=False`` bilinear is the same interpolation but misses cv2's fixed-point
    uint8 rounding by up to one level (measured in docs/segmentation.md).
    """
    h, w = int(size[0]), int(size[1])
    arr = image.detach().float().permute(1, 2, 0).cpu().numpy()
    levels = np.round(arr * 255.0)
    if np.abs(levels - arr * 255.0).max(initial=0.0) < 1e-3:
        out = cv2.resize(levels.astype(np.uint8), (w, h), interpolation=cv2.INTER_LINEAR).astype(np.float32) / 255.0
    else:
        out = cv2.resize(np.ascontiguousarray(arr), (w, h), interpolation=cv2.INTER_LINEAR)
    if out.ndim == 2:  # cv2 drops a single channel axis
        out = out[..., None]
    return torch.from_numpy(out).permute(2, 0, 1).to(device=image.device, dtype=image.dtype)


class RandomRescale(DualTransform):
    """mmseg ``RandomResize(scale, ratio_range, keep_ratio=True)``: scale the base scale by a random
    ratio, then resize keeping the aspect ratio (bilinear image, nearest mask).

    ``ratio_range=(1, 1)`` is the deterministic ``Resize(scale, keep_ratio=True)`` used for validation;
    ``resize_mask=False`` leaves the mask at its original size (mmseg's test pipeline).
    """

    def __init__(self, base_size: Sequence[int], ratio_range: tuple[float, float] = (0.5, 2.0), p: float = 1.0,
                 resize_mask: bool = True):
        super().__init__(p=p)
        self.base_size = tuple(base_size)
        self.ratio_range = tuple(ratio_range)
        self.resize_mask = resize_mask

    def get_params_dependent_on_data(self, params: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
        h, w = params["shape"][:2]
        lo, hi = self.ratio_range
        ratio = lo if lo == hi else self.py_random.uniform(lo, hi)
        return {"out_size": keep_ratio_size(h, w, [s * ratio for s in self.base_size])}

    def apply(self, img: np.ndarray, out_size: tuple[int, int], **params: Any) -> np.ndarray:
        return cv2.resize(img, (out_size[1], out_size[0]), interpolation=cv2.INTER_LINEAR)

    def apply_to_mask(self, mask: np.ndarray, out_size: tuple[int, int], **params: Any) -> np.ndarray:
        if not self.resize_mask:
            return mask
        return cv2.resize(mask, (out_size[1], out_size[0]), interpolation=cv2.INTER_NEAREST)

    def get_transform_init_args_names(self) -> tuple[str, ...]:
        return ("base_size", "ratio_range", "resize_mask")


class CatMaxRatioCrop(BaseCrop):
    """mmseg ``RandomCrop(crop_size, cat_max_ratio)``: a random crop of at most (height, width); re-drawn
    up to ``max_tries`` times while one class covers ``cat_max_ratio`` or more of the crop's non-ignored
    pixels (or only one class is present), so crops are not dominated by sky/road/wall.

    When no draw passes, the last one is kept (as mmseg does). Smaller images are cropped whole and
    padded later.
    """

    def __init__(self, height: int, width: int, cat_max_ratio: float = 0.75, ignore_index: int = IGNORE_INDEX,
                 max_tries: int = 10, p: float = 1.0):
        super().__init__(p=p)
        self.height, self.width = height, width
        self.cat_max_ratio = cat_max_ratio
        self.ignore_index = ignore_index
        self.max_tries = max_tries

    def _draw(self, h: int, w: int) -> tuple[int, int, int, int]:
        ch, cw = min(h, self.height), min(w, self.width)
        y = self.py_random.randint(0, h - ch)
        x = self.py_random.randint(0, w - cw)
        return x, y, x + cw, y + ch

    def passes(self, mask: np.ndarray, coords: tuple[int, int, int, int]) -> bool:
        """Whether a crop of ``mask`` at ``coords`` satisfies the class-ratio rule."""
        x0, y0, x1, y1 = coords
        crop = mask[y0:y1, x0:x1]
        if crop.dtype == np.uint8:  # bincount counts in one pass; unique sorts the crop
            counts = np.bincount(crop.ravel(), minlength=256)
            if 0 <= self.ignore_index < 256:
                counts[self.ignore_index] = 0
            counts = counts[counts > 0]
        else:
            labels, counts = np.unique(crop, return_counts=True)
            counts = counts[labels != self.ignore_index]
        return len(counts) > 1 and counts.max() / counts.sum() < self.cat_max_ratio

    def get_params_dependent_on_data(self, params: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
        h, w = params["shape"][:2]
        coords = self._draw(h, w)
        mask = data.get("mask")
        if mask is not None and self.cat_max_ratio < 1.0:
            for _ in range(self.max_tries - 1):
                if self.passes(mask, coords):
                    break
                coords = self._draw(h, w)
        return {"crop_coords": coords}

    def get_transform_init_args_names(self) -> tuple[str, ...]:
        return ("height", "width", "cat_max_ratio", "ignore_index", "max_tries")


def photometric_distortion() -> list[A.BasicTransform]:
    """mmseg ``PhotoMetricDistortion`` in albumentations: brightness +-32, contrast x[0.5, 1.5],
    saturation x[0.5, 1.5], hue +-18 OpenCV units (of 180), i.e. 0.1 of the circle, each with probability 0.5."""
    return [
        A.RandomBrightnessContrast(brightness_limit=32 / 255, contrast_limit=0.0, p=0.5),
        A.RandomBrightnessContrast(brightness_limit=0.0, contrast_limit=0.5, p=0.5),
        A.ColorJitter(brightness=0, contrast=0, saturation=(0.5, 1.5), hue=0, p=0.5),
        A.ColorJitter(brightness=0, contrast=0, saturation=0, hue=18 / 180, p=0.5),
    ]


def _hw(size: int | Sequence[int]) -> tuple[int, int]:
    return (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))


def segmentation_transforms(
    train: bool,
    crop_size: int | Sequence[int] = 512,
    base_size: Sequence[int] = (2048, 512),
    ratio_range: tuple[float, float] = (0.5, 2.0),
    cat_max_ratio: float = 0.75,
    hflip: float = 0.5,
    photometric: bool = True,
    mean: Sequence[float] = IMAGENET_DEFAULT_MEAN,
    std: Sequence[float] = IMAGENET_DEFAULT_STD,
    ignore_index: int = IGNORE_INDEX,
    val_resize: bool | Sequence[int] = True,
    seed: int | None = None,
    resize_mask: bool = True,
) -> A.Compose:
    """The mmseg/SETR pipelines; call as ``t(image=uint8 HxWx3, mask=uint8 HxW)``.

    ``crop_size`` is (height, width) or an int; ``base_size`` is mmseg's scale (long, short in any order).
    ``val_resize``: ``True`` resizes to ``base_size`` keeping the ratio, ``False`` keeps the original size,
    a pair resizes keeping the ratio to that scale. ``resize_mask`` (evaluation only): ``False`` keeps
    the mask at its original size while the image is resized, as mmseg's test pipeline.
    """
    norm = [A.Normalize(mean=tuple(mean), std=tuple(std), max_pixel_value=255.0)]
    if not train:
        ops: list[Any] = []
        if val_resize is not False:
            scale = base_size if val_resize is True else val_resize
            ops.append(RandomRescale(scale, ratio_range=(1.0, 1.0), resize_mask=resize_mask))
        return A.Compose([*ops, *norm, ToTensorV2()], seed=seed)
    ch, cw = _hw(crop_size)
    ops = [RandomRescale(base_size, ratio_range), CatMaxRatioCrop(ch, cw, cat_max_ratio, ignore_index)]
    if hflip > 0:
        ops.append(A.HorizontalFlip(p=hflip))
    if photometric:
        ops.extend(photometric_distortion())
    # Pad after normalising so padded pixels are 0 in the normalised image, as mmseg's data preprocessor does.
    pad = A.PadIfNeeded(min_height=ch, min_width=cw, position="top_left", border_mode=cv2.BORDER_CONSTANT,
                        fill=0, fill_mask=ignore_index)
    return A.Compose([*ops, *norm, pad, ToTensorV2()], seed=seed)
