"""Semantic segmentation data: ADE20K / Cityscapes / generic datasets, mmseg-style albumentations
pipelines and a LightningDataModule.

Batches are ``(images float32 (B, 3, H, W) normalised, masks int64 (B, H, W))`` with ``ignore_index``
(255) on unlabeled and padded pixels. The training pipeline follows mmsegmentation's SETR configs:
random rescale of a base scale by 0.5-2.0 (keep ratio) -> random crop with ``cat_max_ratio`` 0.75 ->
horizontal flip -> photometric distortion -> normalise -> pad to the crop (image 0, mask 255).
Validation resizes to the base scale keeping the ratio (mmseg ``Resize(keep_ratio=True)``) without
cropping, since sliding-window inference handles large images.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import albumentations as A
import cv2
import lightning as L
import numpy as np
import torch
from albumentations.augmentations.crops.transforms import BaseCrop
from albumentations.core.transforms_interface import DualTransform
from albumentations.pytorch import ToTensorV2
from torch.utils.data import DataLoader, Dataset

from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD

from visiontf.data.batching import pad_images
from visiontf.data.io import read_image, read_mask
from visiontf.data.loading import IMAGE_EXTENSIONS, DatasetLayoutError, default_num_workers, loader_kwargs
from visiontf.data.samplers import eval_sampler, train_sampler

logger = logging.getLogger(__name__)

IGNORE_INDEX = 255

ADE20K_CLASSES = (
    "wall", "building", "sky", "floor", "tree", "ceiling", "road", "bed", "windowpane", "grass", "cabinet",
    "sidewalk", "person", "earth", "door", "table", "mountain", "plant", "curtain", "chair", "car", "water",
    "painting", "sofa", "shelf", "house", "sea", "mirror", "rug", "field", "armchair", "seat", "fence", "desk",
    "rock", "wardrobe", "lamp", "bathtub", "railing", "cushion", "base", "box", "column", "signboard",
    "chest of drawers", "counter", "sand", "sink", "skyscraper", "fireplace", "refrigerator", "grandstand",
    "path", "stairs", "runway", "case", "pool table", "pillow", "screen door", "stairway", "river", "bridge",
    "bookcase", "blind", "coffee table", "toilet", "flower", "book", "hill", "bench", "countertop", "stove",
    "palm", "kitchen island", "computer", "swivel chair", "boat", "bar", "arcade machine", "hovel", "bus",
    "towel", "light", "truck", "tower", "chandelier", "awning", "streetlight", "booth", "television receiver",
    "airplane", "dirt track", "apparel", "pole", "land", "bannister", "escalator", "ottoman", "bottle",
    "buffet", "poster", "stage", "van", "ship", "fountain", "conveyer belt", "canopy", "washer", "plaything",
    "swimming pool", "stool", "barrel", "basket", "waterfall", "tent", "bag", "minibike", "cradle", "oven",
    "ball", "food", "step", "tank", "trade name", "microwave", "pot", "animal", "bicycle", "lake",
    "dishwasher", "screen", "blanket", "sculpture", "hood", "sconce", "vase", "traffic light", "tray",
    "ashcan", "fan", "pier", "crt screen", "plate", "monitor", "bulletin board", "shower", "radiator",
    "glass", "clock", "flag",
)
CITYSCAPES_CLASSES = (
    "road", "sidewalk", "building", "wall", "fence", "pole", "traffic light", "traffic sign", "vegetation",
    "terrain", "sky", "person", "rider", "car", "truck", "bus", "train", "motorcycle", "bicycle",
)

#: Per-layout defaults: split folder names, class table, reduce-zero-label and mmseg's base scale.
LAYOUTS: dict[str, dict[str, Any]] = {
    "generic": {"train_split": "train", "val_split": "val", "classes": None, "reduce_zero_label": False,
                "base_size": (2048, 512)},
    "ade20k": {"train_split": "training", "val_split": "validation", "classes": ADE20K_CLASSES,
               "reduce_zero_label": True, "base_size": (2048, 512)},
    "cityscapes": {"train_split": "train", "val_split": "val", "classes": CITYSCAPES_CLASSES,
                   "reduce_zero_label": False, "base_size": (2048, 1024)},
}


class LabelError(ValueError):
    """A mask holds labels outside ``[0, num_classes)`` other than the ignore value (``strict=True``)."""


# ---- transforms -----------------------------------------------------------------------------------

def keep_ratio_size(h: int, w: int, scale: Sequence[float]) -> tuple[int, int]:
    """mmcv ``rescale_size``: the largest (h, w) with the long side <= max(scale), short side <= min(scale)."""
    factor = min(max(scale) / max(h, w), min(scale) / min(h, w))
    return max(1, int(h * factor + 0.5)), max(1, int(w * factor + 0.5))


class RandomRescale(DualTransform):
    """mmseg ``RandomResize(scale, ratio_range, keep_ratio=True)``: scale the base scale by a random
    ratio, then resize keeping the aspect ratio (bilinear image, nearest mask).

    ``ratio_range=(1, 1)`` is the deterministic ``Resize(scale, keep_ratio=True)`` used for validation.
    """

    def __init__(self, base_size: Sequence[int], ratio_range: tuple[float, float] = (0.5, 2.0), p: float = 1.0):
        super().__init__(p=p)
        self.base_size = tuple(base_size)
        self.ratio_range = tuple(ratio_range)

    def get_params_dependent_on_data(self, params: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
        h, w = params["shape"][:2]
        lo, hi = self.ratio_range
        ratio = lo if lo == hi else self.py_random.uniform(lo, hi)
        return {"out_size": keep_ratio_size(h, w, [s * ratio for s in self.base_size])}

    def apply(self, img: np.ndarray, out_size: tuple[int, int], **params: Any) -> np.ndarray:
        return cv2.resize(img, (out_size[1], out_size[0]), interpolation=cv2.INTER_LINEAR)

    def apply_to_mask(self, mask: np.ndarray, out_size: tuple[int, int], **params: Any) -> np.ndarray:
        return cv2.resize(mask, (out_size[1], out_size[0]), interpolation=cv2.INTER_NEAREST)

    def get_transform_init_args_names(self) -> tuple[str, ...]:
        return ("base_size", "ratio_range")


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
        if crop.dtype == np.uint8:  # bincount is ~10x faster than unique on big crops
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
) -> A.Compose:
    """The mmseg/SETR pipelines; call as ``t(image=uint8 HxWx3, mask=uint8 HxW)``.

    ``crop_size`` is (height, width) or an int; ``base_size`` is mmseg's scale (long, short in any order).
    ``val_resize``: ``True`` resizes to ``base_size`` keeping the ratio, ``False`` keeps the original size,
    a pair resizes keeping the ratio to that scale.
    """
    norm = [A.Normalize(mean=tuple(mean), std=tuple(std), max_pixel_value=255.0)]
    if not train:
        ops: list[Any] = []
        if val_resize is not False:
            scale = base_size if val_resize is True else val_resize
            ops.append(RandomRescale(scale, ratio_range=(1.0, 1.0)))
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


# ---- datasets ------------------------------------------------------------------------------------

def read_class_names(path: str | Path) -> list[str]:
    """One class name a line (trailing blank lines ignored); index = line number."""
    path = Path(path)
    if not path.is_file():
        raise DatasetLayoutError(f"{path}: class list not found; write one class name a line (background first)")
    lines = path.read_text().splitlines()
    while lines and not lines[-1].strip():
        lines.pop()
    names = [line.strip() for line in lines]
    if not names:
        raise DatasetLayoutError(f"{path}: class list is empty")
    blank = [i + 1 for i, n in enumerate(names) if not n]
    if blank:
        raise DatasetLayoutError(f"{path}: blank class name on line(s) {blank}; every line up to the last is a class")
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise DatasetLayoutError(f"{path}: duplicate class names {dupes}")
    return names


def _pairs(image_dir: Path, mask_for: Callable[[Path], Path], pattern: str, layout_hint: str) -> list[tuple[Path, Path]]:
    if not image_dir.is_dir():
        raise DatasetLayoutError(f"{image_dir}: split folder not found ({layout_hint})")
    images = sorted(p for p in image_dir.glob(pattern) if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS)
    if not images:
        raise DatasetLayoutError(f"{image_dir}: no images matching {pattern!r} ({layout_hint})")
    pairs = []
    for img in images:
        mask = mask_for(img)
        if not mask.is_file():
            raise DatasetLayoutError(f"{img}: mask not found, expected {mask} ({layout_hint})")
        pairs.append((img, mask))
    return pairs


def generic_pairs(root: str | Path, split: str) -> list[tuple[Path, Path]]:
    """``images/<split>/<name>.<ext>`` with ``masks/<split>/<name>.png``."""
    root = Path(root)
    hint = "expected <root>/images/<split>/<name>.jpg and <root>/masks/<split>/<name>.png"
    return _pairs(root / "images" / split, lambda p: root / "masks" / split / p.relative_to(root / "images" / split)
                  .with_suffix(".png"), "**/*", hint)


def ade20k_pairs(root: str | Path, split: str) -> list[tuple[Path, Path]]:
    """``images/<split>/*.jpg`` with ``annotations/<split>/*.png`` (ADEChallengeData2016)."""
    root = Path(root)
    hint = "expected ADEChallengeData2016 layout <root>/images/{training,validation}/*.jpg and <root>/annotations/..."
    return _pairs(root / "images" / split, lambda p: root / "annotations" / split / f"{p.stem}.png", "*.jpg", hint)


def cityscapes_pairs(root: str | Path, split: str) -> list[tuple[Path, Path]]:
    """``leftImg8bit/<split>/<city>/*_leftImg8bit.png`` with ``gtFine/<split>/<city>/*_gtFine_labelTrainIds.png``."""
    root = Path(root)
    hint = ("expected <root>/leftImg8bit/<split>/<city>/*_leftImg8bit.png and "
            "<root>/gtFine/<split>/<city>/*_gtFine_labelTrainIds.png (make the trainIds with cityscapesscripts' "
            "createTrainIdLabelImgs)")

    def mask_for(p: Path) -> Path:
        stem = p.name[: -len("_leftImg8bit.png")]
        return root / "gtFine" / split / p.parent.name / f"{stem}_gtFine_labelTrainIds.png"

    return _pairs(root / "leftImg8bit" / split, mask_for, "*/*_leftImg8bit.png", hint)


PAIR_FINDERS: dict[str, Callable[[str | Path, str], list[tuple[Path, Path]]]] = {
    "generic": generic_pairs, "ade20k": ade20k_pairs, "cityscapes": cityscapes_pairs,
}


def reduce_zero_label(mask: np.ndarray, ignore_index: int = IGNORE_INDEX) -> np.ndarray:
    """ADE20K convention: label 0 ("other") becomes ignore, every other label moves down by one."""
    out = mask.astype(np.int32) - 1
    out[mask == 0] = ignore_index
    out[mask == ignore_index] = ignore_index
    return out.astype(np.uint8)


class SegmentationDataset(Dataset):
    """(image, mask) pairs read with :mod:`visiontf.data.io` and passed through an albumentations transform.

    Args:
        pairs: (image path, mask path) list, e.g. from :func:`generic_pairs`.
        num_classes: K; valid labels are ``0..K-1`` and ``ignore_index``.
        transform: ``transform(image=, mask=)`` returning tensors (see :func:`segmentation_transforms`);
            ``None`` returns the uint8 arrays.
        reduce_zero_label: apply the ADE20K mapping (0 -> ignore, others -1) before checking labels.
        strict: labels outside ``[0, K)`` raise :class:`LabelError`; otherwise they become ``ignore_index``,
            with a warning naming the first files and a running count.

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
    ) -> None:
        if not 1 <= num_classes <= 255 or (num_classes > ignore_index and 0 <= ignore_index < 256):
            raise ValueError(f"num_classes={num_classes} must be in 1..{min(255, ignore_index)} (ignore_index {ignore_index})")
        self.pairs = [(Path(i), Path(m)) for i, m in pairs]
        self.num_classes = num_classes
        self.transform = transform
        self.reduce_zero_label = reduce_zero_label
        self.ignore_index = ignore_index
        self.strict = strict
        self.class_names = list(class_names) if class_names is not None else [f"class_{k}" for k in range(num_classes)]
        self.bad_label_files: set[Path] = set()
        self.bad_label_pixels = 0

    def __len__(self) -> int:
        return len(self.pairs)

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
                logger.warning("%s: %d pixel(s) with labels %s outside [0, %d) mapped to ignore %d",
                               path, n, values, self.num_classes, self.ignore_index)
            elif count % 100 == 0 or count == self.MAX_NAMED_WARNINGS + 1:
                logger.warning("%d mask files so far had labels outside [0, %d), %d pixels mapped to ignore",
                               count, self.num_classes, self.bad_label_pixels)
        mask = mask.copy()
        mask[bad] = self.ignore_index
        return mask

    def load(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """The checked uint8 image (H, W, 3) and label map (H, W) of sample ``i``, before the transform."""
        img_path, mask_path = self.pairs[i]
        image = read_image(img_path)
        mask = read_mask(mask_path)
        if image.shape[:2] != mask.shape:
            raise DatasetLayoutError(
                f"{img_path} is {image.shape[1]}x{image.shape[0]} (WxH) but its mask {mask_path} is "
                f"{mask.shape[1]}x{mask.shape[0]}; a mask must have its image's size"
            )
        if self.reduce_zero_label:
            mask = reduce_zero_label(mask, self.ignore_index)
        return image, self._check_labels(mask, mask_path)

    def __getitem__(self, i: int) -> tuple[Any, Any]:
        image, mask = self.load(i)
        if self.transform is None:
            return image, mask
        out = self.transform(image=image, mask=mask)
        return out["image"], torch.as_tensor(out["mask"]).long()


def resolve_classes(root: str | Path, layout: str, num_classes: int | None = None) -> list[str]:
    """Class names of a dataset: ``classes.txt`` if present, else the layout's table (ADE20K 150,
    Cityscapes 19), else ``num_classes`` placeholders. A given ``num_classes`` must agree with the list."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r}; expected one of {sorted(LAYOUTS)}")
    path = Path(root) / "classes.txt"
    builtin = LAYOUTS[layout]["classes"]
    if path.is_file():
        names = read_class_names(path)
        if num_classes is not None and num_classes != len(names):
            raise DatasetLayoutError(f"{path}: lists {len(names)} classes but num_classes={num_classes}; make them agree")
        return names
    if num_classes is None:
        if builtin is None:
            raise DatasetLayoutError(
                f"{path}: class list not found; the generic layout needs classes.txt (one name a line, background "
                "first) or an explicit num_classes"
            )
        return list(builtin)
    if builtin is not None and num_classes == len(builtin):
        return list(builtin)
    return [f"class_{k}" for k in range(num_classes)]


def segmentation_collate(batch: Sequence[tuple[torch.Tensor, torch.Tensor]], ignore_index: int = IGNORE_INDEX
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack samples, padding bottom/right to the largest size: images with 0, masks with ``ignore_index``."""
    images = pad_images([img for img, _ in batch]).images
    masks = pad_images([torch.as_tensor(mask, dtype=torch.int64) for _, mask in batch], fill=ignore_index).images
    return images, masks


class _Collate:
    """Picklable collate bound to an ignore value (worker processes pickle it under spawn)."""

    def __init__(self, ignore_index: int) -> None:
        self.ignore_index = ignore_index

    def __call__(self, batch):
        return segmentation_collate(batch, self.ignore_index)


# ---- data module ---------------------------------------------------------------------------------

class SegmentationDataModule(L.LightningDataModule):
    """Semantic segmentation data for the generic, ADE20K and Cityscapes layouts.

    ``num_classes``, ``class_names`` and ``ignore_index`` are set in ``__init__`` (LightningCLI links
    ``data.num_classes`` to ``model.num_classes`` before ``setup``). Layout defaults: split names
    (``training``/``validation`` for ADE20K), ``reduce_zero_label`` (ADE20K only), ``base_size``
    ((2048, 512); Cityscapes (2048, 1024)) and the class table (``classes.txt`` wins when present).

    Validation images keep their own sizes, so ``val_batch_size`` is 1 by default; larger batches are
    padded (masks with ``ignore_index``). ``predict_dataloader`` runs over the val split.
    """

    def __init__(
        self,
        root: str | Path,
        layout: str = "generic",
        num_classes: int | None = None,
        crop_size: int | tuple[int, int] = 512,
        base_size: tuple[int, int] | None = None,
        ratio_range: tuple[float, float] = (0.5, 2.0),
        cat_max_ratio: float = 0.75,
        hflip: float = 0.5,
        photometric: bool = True,
        val_resize: bool | tuple[int, int] = True,
        batch_size: int = 8,
        val_batch_size: int = 1,
        num_workers: int | None = None,
        ignore_index: int = IGNORE_INDEX,
        reduce_zero_label: bool | None = None,
        strict: bool = False,
        train_split: str | None = None,
        val_split: str | None = None,
        test_split: str | None = None,
        mean: tuple[float, float, float] = IMAGENET_DEFAULT_MEAN,
        std: tuple[float, float, float] = IMAGENET_DEFAULT_STD,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        if layout not in LAYOUTS:
            raise ValueError(f"layout={layout!r}; expected one of {sorted(LAYOUTS)}")
        defaults = LAYOUTS[layout]
        self.root = Path(root)
        if not self.root.is_dir():
            raise DatasetLayoutError(f"{self.root}: dataset root not found")
        self.layout = layout
        self.class_names: list[str] = resolve_classes(self.root, layout, num_classes)
        self.num_classes: int = len(self.class_names)
        # the resolved count, so Lightning's hparams merge agrees with the task's num_classes
        self.hparams["num_classes"] = self.num_classes
        self.ignore_index = ignore_index
        self.reduce_zero_label = defaults["reduce_zero_label"] if reduce_zero_label is None else reduce_zero_label
        self.base_size = tuple(base_size) if base_size is not None else defaults["base_size"]
        self.train_split = train_split or defaults["train_split"]
        self.val_split = val_split or defaults["val_split"]
        self.test_split = test_split
        self.batch_size = batch_size
        self.val_batch_size = val_batch_size
        self.num_workers = default_num_workers(num_workers)
        self.train_dataset: SegmentationDataset | None = None
        self.val_dataset: SegmentationDataset | None = None
        self.test_dataset: SegmentationDataset | None = None

    def transforms(self, train: bool) -> A.Compose:
        """The albumentations pipeline this module uses for training or evaluation."""
        hp = self.hparams
        rank = self.trainer.global_rank if self.trainer is not None else 0
        return segmentation_transforms(
            train, crop_size=hp.crop_size, base_size=self.base_size, ratio_range=tuple(hp.ratio_range),
            cat_max_ratio=hp.cat_max_ratio, hflip=hp.hflip, photometric=hp.photometric, mean=hp.mean, std=hp.std,
            ignore_index=self.ignore_index, val_resize=hp.val_resize, seed=hp.seed + rank,
        )

    def _dataset(self, split: str, train: bool) -> SegmentationDataset:
        pairs = PAIR_FINDERS[self.layout](self.root, split)
        return SegmentationDataset(pairs, self.num_classes, self.transforms(train), self.reduce_zero_label,
                                   self.ignore_index, self.hparams.strict, self.class_names)

    def setup(self, stage: str | None = None) -> None:
        if stage in (None, "fit") and self.train_dataset is None:
            self.train_dataset = self._dataset(self.train_split, train=True)
        if stage in (None, "fit", "validate", "predict") and self.val_dataset is None:
            self.val_dataset = self._dataset(self.val_split, train=False)
        if stage in (None, "test") and self.test_dataset is None:
            if self.test_split is None:
                if stage == "test":
                    raise DatasetLayoutError("SegmentationDataModule: no test_split configured; pass test_split=<folder>")
            else:
                self.test_dataset = self._dataset(self.test_split, train=False)

    def _loader(self, dataset: Dataset | None, batch_size: int, train: bool) -> DataLoader:
        assert dataset is not None, "call setup() first"
        # under DDP every val image is scored exactly once (no padding repeats), so mIoU sums are exact
        extra: dict[str, Any] = {"sampler": eval_sampler(dataset, self.trainer)}
        if train:
            # one process: an epoch-seeded sampler (exact resume); DDP: shuffle=True lets Lightning inject its own
            sampler = train_sampler(dataset, self.trainer, self.hparams.seed)
            extra = {"shuffle": sampler is None, "sampler": sampler, "drop_last": len(dataset) >= 2 * batch_size}
        return DataLoader(dataset, batch_size=batch_size, collate_fn=_Collate(self.ignore_index),
                          **extra, **loader_kwargs(self.num_workers))

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_dataset, self.batch_size, train=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_dataset, self.val_batch_size, train=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.test_dataset, self.val_batch_size, train=False)

    def predict_dataloader(self) -> DataLoader:
        return self._loader(self.val_dataset, self.val_batch_size, train=False)


__all__ = [
    "ADE20K_CLASSES", "CITYSCAPES_CLASSES", "IGNORE_INDEX", "LAYOUTS", "LabelError", "RandomRescale",
    "CatMaxRatioCrop", "photometric_distortion", "segmentation_transforms", "read_class_names", "generic_pairs",
    "ade20k_pairs", "cityscapes_pairs", "reduce_zero_label", "SegmentationDataset", "resolve_classes",
    "segmentation_collate", "SegmentationDataModule", "keep_ratio_size",
]
