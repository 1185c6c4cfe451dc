"""DETR's detection augmentation, built from albumentations 2.0.8.

Train (as in facebookresearch/detr ``make_coco_transforms``): horizontal flip p 0.5, then with p 0.5
either a multi-scale resize of the shorter side (longer side capped), or resize to one of
``crop_scales`` -> random crop of a random size in ``crop_size`` -> the multi-scale resize.
Val: one fixed shorter side with the same cap. Both end with ImageNet normalisation and a CHW
float tensor. Boxes travel in COCO ``xywh`` pixels; boxes cut away by a crop are dropped together
with their ``labels`` and ``ann_index`` entries.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# albumentations checks PyPI for a newer release on import; there is no network here.
os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")

import albumentations as A  # noqa: E402
import cv2  # noqa: E402
import numpy as np  # noqa: E402
from albumentations.augmentations.crops.transforms import BaseCrop  # noqa: E402
from albumentations.pytorch import ToTensorV2  # noqa: E402
from timm.data import IMAGENET_DEFAULT_MEAN as IMAGENET_MEAN  # noqa: E402
from timm.data import IMAGENET_DEFAULT_STD as IMAGENET_STD  # noqa: E402

#: DETR's defaults (full-size COCO training).
DETR_SCALES = tuple(range(480, 801, 32))
DETR_MAX_SIZE = 1333
DETR_CROP_SCALES = (400, 500, 600)
DETR_CROP_SIZE = (384, 600)
DETR_VAL_SIZE = 800

LABEL_FIELDS = ("labels", "ann_index")

__all__ = [
    "SCHEDULE_STAGES",
    "AugmentationSchedule",
    "DETR_CROP_SCALES",
    "DETR_CROP_SIZE",
    "DETR_MAX_SIZE",
    "DETR_SCALES",
    "DETR_VAL_SIZE",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "RandomShortestSideResize",
    "RandomSizeCrop",
    "bbox_params",
    "build_normalize_transforms",
    "build_train_transforms",
    "build_val_transforms",
    "resized_hw",
]


def resized_hw(height: int, width: int, size: int, max_size: int | None = None) -> tuple[int, int]:
    """Output (h, w) when the shorter side goes to ``size`` with the longer side at most ``max_size``.

    Same rounding as DETR's ``get_size_with_aspect_ratio``: the target shorter side is lowered to
    ``round(max_size * short / long)`` when needed, the longer side is truncated (``int``), and an
    image already at the target size is left alone. No side goes below 1 pixel: an extreme aspect
    ratio (10 x 10000) gives a 1-pixel side instead of 0, which resizing refuses.
    """
    if max_size is not None:
        short, long = float(min(height, width)), float(max(height, width))
        if long / short * size > max_size:
            size = max(1, int(round(max_size * short / long)))
    if (width <= height and width == size) or (height <= width and height == size):
        return height, width
    if width < height:
        return max(1, int(size * height / width)), size
    return size, max(1, int(size * width / height))


class RandomShortestSideResize(A.DualTransform):
    """Resize the shorter side to a size drawn from ``sizes``, longer side capped at ``max_size``.

    albumentations' ``SmallestMaxSize`` has no cap on the longer side and rounds differently, so
    this follows DETR's ``RandomResize`` exactly (:func:`resized_hw`). Boxes are normalised inside
    albumentations, so they need no change.

    ``per_batch``: when the pipeline is called with ``batch_draw=u`` (a number in [0, 1) that the
    samples of a batch share, :meth:`~visiontf.data.loading.AugmentedDataset.batch_draw`), the size
    is ``sizes[int(u * len(sizes))]``, the same for the whole batch, as in the multi-scale training of
    YOLO and RT-DETR: a batch then pads far less than one of mixed sizes. Without ``batch_draw`` (a
    loader without batch keys), each image draws its own size.
    """

    def __init__(
        self,
        sizes: Sequence[int],
        max_size: int | None = None,
        interpolation: int = cv2.INTER_LINEAR,
        p: float = 1.0,
        per_batch: bool = False,
    ):
        super().__init__(p=p)
        if not sizes:
            raise ValueError("RandomShortestSideResize: sizes must name at least one shorter-side length")
        self.sizes = tuple(int(s) for s in sizes)
        self.max_size = None if max_size is None else int(max_size)
        self.interpolation = interpolation
        self.per_batch = per_batch

    def get_params_dependent_on_data(self, params: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
        height, width = params["shape"][:2]
        size = self.py_random.choice(self.sizes)  # drawn in any case: the stream of later draws stays the same
        shared = data.get("batch_draw") if self.per_batch else None
        if shared is not None:
            size = self.sizes[min(int(shared * len(self.sizes)), len(self.sizes) - 1)]
        return {"out_hw": resized_hw(height, width, size, self.max_size)}

    def apply(self, img: np.ndarray, out_hw: tuple[int, int], **params: Any) -> np.ndarray:
        if img.shape[:2] == tuple(out_hw):
            return img
        return cv2.resize(img, (out_hw[1], out_hw[0]), interpolation=self.interpolation)

    def apply_to_mask(self, mask: np.ndarray, out_hw: tuple[int, int], **params: Any) -> np.ndarray:
        if mask.shape[:2] == tuple(out_hw):
            return mask
        return cv2.resize(mask, (out_hw[1], out_hw[0]), interpolation=cv2.INTER_NEAREST)

    def apply_to_bboxes(self, bboxes: np.ndarray, **params: Any) -> np.ndarray:
        return bboxes

    def get_transform_init_args_names(self) -> tuple[str, ...]:
        return ("sizes", "max_size", "interpolation", "per_batch")


class RandomSizeCrop(BaseCrop):
    """Crop a random ``h x w`` window, each side drawn uniformly from ``[min_size, max_size]``.

    DETR's ``RandomSizeCrop``: sides are clipped to the image (an image smaller than ``min_size``
    is kept whole along that side instead of failing), then the window position is uniform.
    """

    def __init__(self, min_size: int, max_size: int, p: float = 1.0):
        super().__init__(p=p)
        if min_size > max_size:
            raise ValueError(f"RandomSizeCrop: min_size {min_size} > max_size {max_size}")
        self.min_size = int(min_size)
        self.max_size = int(max_size)

    def get_params_dependent_on_data(self, params: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
        height, width = params["shape"][:2]
        w = self.py_random.randint(min(self.min_size, width), min(width, self.max_size))
        h = self.py_random.randint(min(self.min_size, height), min(height, self.max_size))
        top = self.py_random.randint(0, height - h)
        left = self.py_random.randint(0, width - w)
        return {"crop_coords": (left, top, left + w, top + h)}

    def get_transform_init_args_names(self) -> tuple[str, ...]:
        return ("min_size", "max_size")


def bbox_params() -> A.BboxParams:
    """COCO ``xywh`` boxes, clipped to the image; boxes left without area are removed."""
    return A.BboxParams(format="coco", label_fields=list(LABEL_FIELDS), clip=True, filter_invalid_bboxes=True)


def _finish() -> list[A.BasicTransform]:
    return [A.Normalize(mean=IMAGENET_MEAN, std=IMAGENET_STD, max_pixel_value=255.0), ToTensorV2()]


def build_train_transforms(
    scales: Sequence[int] = DETR_SCALES,
    max_size: int = DETR_MAX_SIZE,
    crop_scales: Sequence[int] = DETR_CROP_SCALES,
    crop_size: tuple[int, int] = DETR_CROP_SIZE,
    seed: int | None = None,
    scale_per_batch: bool = False,
    mosaic: float = 0.0,
    mosaic_cell: tuple[int, int] | None = None,
    crop: bool = True,
) -> A.Compose:
    """DETR's training augmentation. Call with ``image=, bboxes=, labels=, ann_index=`` (and
    ``batch_draw=``, see below).

    ``seed`` seeds the pipeline's own RNG (albumentations ignores global seeds). ``scale_per_batch``:
    the final size (from ``scales``) follows the call's ``batch_draw``, so that a batch shares it
    (:class:`RandomShortestSideResize`); the crop path's first resize stays per image.

    ``mosaic`` > 0: with that probability the image is first a 2x2 mosaic of itself and three others
    (albumentations' ``Mosaic``; each fitted into a ``mosaic_cell`` (h, w) cell, the whole grid kept), so it
    holds about four images' objects at half their size before DETR's resizes: DEIM's dense one-to-one
    matching (more matched queries per image). The call then needs ``mosaic_metadata=``: the three
    others as dicts of the same fields (:class:`~visiontf.tasks.detection.coco_dataset.CocoDetection` gives them).

    ``crop=False`` leaves DETR's random-crop path out: the flip and the multi-scale resize only (an augmentation
    schedule's weak stage, :class:`AugmentationSchedule`).
    """
    multi_scale = RandomShortestSideResize(scales, max_size, per_batch=scale_per_batch)
    crop_path = A.Sequential(
        [
            RandomShortestSideResize(crop_scales, max_size),
            RandomSizeCrop(*crop_size),
            RandomShortestSideResize(scales, max_size, per_batch=scale_per_batch),
        ],
        p=1.0,
    )
    first: list[A.BasicTransform] = []
    if mosaic > 0:
        if mosaic_cell is None:
            raise ValueError("build_train_transforms: mosaic needs mosaic_cell, the (h, w) of one mosaic cell")
        h, w = mosaic_cell
        first.append(A.Mosaic(grid_yx=(2, 2), cell_shape=(h, w), target_size=(2 * h, 2 * w), fit_mode="contain",
                              fill=114, p=mosaic))
    resize = A.OneOf([multi_scale, crop_path], p=1.0) if crop else multi_scale
    return A.Compose(
        [*first, A.HorizontalFlip(p=0.5), resize, *_finish()],
        bbox_params=bbox_params(),
        seed=seed,
    )


#: the stages of :class:`AugmentationSchedule`, strongest first
SCHEDULE_STAGES = ("mosaic", "strong", "weak", "plain")


@dataclass(frozen=True)
class AugmentationSchedule:
    """Which training augmentation an epoch gets: the real-time DETRs' schedules (D-FINE stops its strong augmentation
    for its last epochs; DEIM also starts it late and mixes mosaics in only in between).

    Args:
        strong_epochs: ``(start, stop)``: the strong augmentation (DETR's random crop, and the mosaic) runs in epochs
            ``start <= epoch < stop``; before, the ``"weak"`` stage (a flip and the multi-scale resize); from ``stop``
            on, the ``"plain"`` stage (a flip and one resize to the evaluation size, no multi-scale: the originals'
            last epochs). None: strong in every epoch.
        mosaic_epochs: ``(start, stop)``: the mosaic (with the data module's ``mosaic`` probability) only in these
            epochs, inside the strong ones. None: in every strong epoch.

    ``stage(epoch)`` is ``"mosaic"`` (strong with the mosaic), ``"strong"``, ``"weak"`` or ``"plain"``; a sample
    without an epoch (a loader other than the data module's) gets the strongest.
    """

    strong_epochs: tuple[int, int] | None = None
    mosaic_epochs: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        for name in ("strong_epochs", "mosaic_epochs"):
            value = getattr(self, name)
            if value is not None and (len(value) != 2 or not 0 <= value[0] <= value[1]):
                raise ValueError(f"{name} must be (start, stop) epochs with 0 <= start <= stop, got {value}")

    @staticmethod
    def window(span: Sequence[int] | None) -> str:
        """An epoch window ``(start, stop)`` in words for the log (``epochs 4-28``; None: ``every epoch``)."""
        return "every epoch" if span is None else f"epochs {span[0]}-{span[1] - 1}" if span[1] > span[0] else "no epoch"

    def describe(self, mosaic: float = 0.0) -> str:
        """The schedule in words, for the training log: which epochs get which stage (``mosaic``: its probability)."""
        window = self.window
        parts = []
        if self.strong_epochs is not None and self.strong_epochs[0] > 0:
            parts.append(f"epochs 0-{self.strong_epochs[0] - 1}: a flip and the multi-scale resize")
        parts.append(f"{window(self.strong_epochs)}: the strong augmentation (the random crop"
                     + (f", mosaics with probability {mosaic:g} in {window(self.mosaic_epochs)}" if mosaic > 0 else "") + ")")
        if self.strong_epochs is not None:
            parts.append(f"from epoch {self.strong_epochs[1]}: a flip and one resize to the evaluation size")
        return "; ".join(parts)

    def stage(self, epoch: int | None, mosaic: bool) -> str:
        """The stage of ``epoch`` (``mosaic``: the data module draws mosaics at all)."""
        if epoch is not None and self.strong_epochs is not None:
            start, stop = self.strong_epochs
            if epoch < start:
                return "weak"
            if epoch >= stop:
                return "plain"
        in_mosaic = epoch is None or self.mosaic_epochs is None or self.mosaic_epochs[0] <= epoch < self.mosaic_epochs[1]
        return "mosaic" if mosaic and in_mosaic else "strong"


def build_val_transforms(size: int = DETR_VAL_SIZE, max_size: int = DETR_MAX_SIZE) -> A.Compose:
    """DETR's evaluation transform: shorter side ``size`` (longer side at most ``max_size``)."""
    return A.Compose([RandomShortestSideResize([size], max_size), *_finish()], bbox_params=bbox_params())


def build_normalize_transforms() -> A.Compose:
    """No geometry: ImageNet normalisation and a CHW tensor only (boxes pass through)."""
    # NoOp declares bbox support, so albumentations does not warn that nothing handles the boxes.
    return A.Compose([A.NoOp(), *_finish()], bbox_params=bbox_params())
