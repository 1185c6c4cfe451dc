"""Image classification data: an ImageFolder dataset, albumentations pipelines and a LightningDataModule.

Batches are ``(images float32 (B, 3, H, W) normalised with mean/std, labels int64 (B,))``.
Class indices come from the sorted (non-empty) class folders of the TRAIN split and every other
split is mapped through the same table, so a class missing from val never shifts the indices.
"""
from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import albumentations as A
import torch
from albumentations.pytorch import ToTensorV2
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from torch.utils.data import DataLoader, Dataset

from visiontf.core.config_checks import (
    check_config,
    each,
    fraction,
    non_negative,
    non_negative_int,
    optional,
    positive_int,
    unit_interval_open_left,
)
from visiontf.data.base import VisionDataModule
from visiontf.data.class_folders import LAYOUT_HINT, class_dirs, find_classes, images_in
from visiontf.data.io import read_image
from visiontf.data.loading import (
    AugmentedDataset,
    DatasetLayoutError,
    EpochIndex,
    TrainLoader,
    default_num_workers,
    loader_kwargs,
)
from visiontf.data.samplers import eval_sampler, train_sampler

log = logging.getLogger(__name__)


class ImageFolderDataset(AugmentedDataset):
    """Images under ``root/<class_name>/**`` with integer labels.

    Args:
        root: the split folder (for example ``data/train``).
        transform: albumentations-style callable, ``transform(image=HxWx3 uint8)["image"]``; ``None`` returns
            the uint8 array.
        class_names: the class table (index = position). ``None`` derives it from ``root``'s sorted
            non-empty folders; pass the training split's table for val/test so indices agree. A folder of
            ``root`` that is not in the table raises :class:`DatasetLayoutError`.
        seed: with the data modules' train sampler, each sample's augmentation is drawn from
            (seed, epoch, index); see :class:`~visiontf.data.loading.AugmentedDataset`.

    Images are read with :func:`visiontf.data.io.read_image`: grayscale, RGBA, palette and 16-bit files
    become RGB uint8, and unreadable files raise ``ImageReadError`` naming the path.
    """

    def __init__(
        self,
        root: str | Path,
        transform: Callable[..., dict[str, Any]] | None = None,
        class_names: Sequence[str] | None = None,
        seed: int = 0,
    ) -> None:
        self.root = Path(root)
        self.transform = transform
        self.seed = seed
        self.class_names = list(class_names) if class_names is not None else find_classes(self.root)
        index = {name: i for i, name in enumerate(self.class_names)}
        self.samples: list[tuple[Path, int]] = []
        empty, skipped_files, broken = [], 0, []
        for d in class_dirs(self.root):
            images, others, links = images_in(d)
            skipped_files += others
            broken += links
            if not images:
                empty.append(d.name)
                continue
            if d.name not in index:
                raise DatasetLayoutError(
                    f"{d}: class folder {d.name!r} is not among the {len(self.class_names)} training classes "
                    f"{self.class_names[:20]}{'...' if len(self.class_names) > 20 else ''}; every split must use "
                    "the training split's class folders (rename it, add it to train with images, or remove it)"
                )
            self.samples.extend((p, index[d.name]) for p in images)
        if skipped_files:
            log.warning("%s: ignoring %d non-image file(s) in class folders", self.root, skipped_files)
        if broken:
            log.warning("%s: left out %d broken symbolic link(s) (e.g. %s); fix or remove them", self.root, len(broken),
                        [str(p.relative_to(self.root)) for p in broken[:5]])
        if empty:
            log.warning("%s: %d class folder(s) hold no images: %s", self.root, len(empty), empty)
        if not self.samples:
            raise DatasetLayoutError(f"{self.root}: no images found ({LAYOUT_HINT})")

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, key: int | EpochIndex) -> tuple[Any, int]:
        path, label = self.samples[self.sample_index(key)]
        image = read_image(path)
        if self.transform is not None:
            image = self.transform(image=image)["image"]
        return image, label

    @property
    def targets(self) -> list[int]:
        """Labels in sample order (for samplers that balance classes)."""
        return [label for _, label in self.samples]


def _rand_augment(spec: str) -> A.BaseCompose:
    """An albumentations approximation of timm's ``rand-m<M>-n<N>`` RandAugment."""
    parts = spec.split("-")
    if parts[0] != "rand":
        raise ValueError(f"auto_augment={spec!r}: only 'rand-m<magnitude>-n<ops>' (timm RandAugment style) is supported")
    m, n = 9.0, 2
    for part in parts[1:]:
        key = re.match(r"[a-z]+", part)
        if key is None:
            raise ValueError(f"auto_augment={spec!r}: cannot parse {part!r}")
        value = part[key.end():]
        if key.group() == "m":
            m = float(value)
        elif key.group() == "n":
            n = int(value)
        else:
            log.info("auto_augment %r: option %r has no albumentations counterpart; ignored", spec, part)
    f = min(max(m, 0.0), 10.0) / 10.0
    ops = [
        A.Affine(rotate=(-30 * f, 30 * f), p=1.0),
        A.Affine(shear={"x": (-17 * f, 17 * f), "y": (0, 0)}, p=1.0),
        A.Affine(shear={"x": (0, 0), "y": (-17 * f, 17 * f)}, p=1.0),
        A.Affine(translate_percent={"x": (-0.45 * f, 0.45 * f), "y": (0, 0)}, p=1.0),
        A.Affine(translate_percent={"x": (0, 0), "y": (-0.45 * f, 0.45 * f)}, p=1.0),
        A.Equalize(p=1.0),
        A.AutoContrast(p=1.0),
        A.InvertImg(p=1.0),
        A.Posterize(num_bits=(max(1, int(8 - 4 * f)), 8), p=1.0),
        A.Solarize(threshold_range=(1.0 - f, 1.0), p=1.0),
        A.RandomBrightnessContrast(brightness_limit=0.9 * f, contrast_limit=0.9 * f, p=1.0),
        A.ColorJitter(brightness=0, contrast=0, saturation=(max(0.0, 1 - 0.9 * f), 1 + 0.9 * f), hue=0, p=1.0),
        A.Sharpen(alpha=(0.0, max(0.9 * f, 1e-3)), p=1.0),
    ]
    return A.SomeOf(ops, n=n, p=1.0)


def classification_transforms(
    image_size: int,
    train: bool,
    mean: Sequence[float] = IMAGENET_DEFAULT_MEAN,
    std: Sequence[float] = IMAGENET_DEFAULT_STD,
    crop_pct: float = 0.875,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
    hflip: float = 0.5,
    color_jitter: float | None = 0.4,
    auto_augment: str | None = None,
    seed: int | None = None,
) -> A.Compose:
    """timm-style pipelines in albumentations.

    Train: RandomResizedCrop(scale, ratio) -> HorizontalFlip -> RandAugment (``auto_augment``) or
    ColorJitter (timm applies jitter only without auto-augment) -> Normalize -> tensor.
    Eval: resize the shorter side to ``floor(image_size / crop_pct)`` -> center crop -> Normalize -> tensor.
    """
    norm = [A.Normalize(mean=tuple(mean), std=tuple(std), max_pixel_value=255.0), ToTensorV2()]
    if not train:
        resize = math.floor(image_size / crop_pct)
        return A.Compose(
            [A.SmallestMaxSize(max_size=resize), A.CenterCrop(image_size, image_size), *norm], seed=seed
        )
    ops: list[Any] = [A.RandomResizedCrop(size=(image_size, image_size), scale=scale, ratio=ratio)]
    if hflip > 0:
        ops.append(A.HorizontalFlip(p=hflip))
    if auto_augment:
        ops.append(_rand_augment(auto_augment))
    elif color_jitter:
        ops.append(A.ColorJitter(brightness=color_jitter, contrast=color_jitter, saturation=color_jitter, hue=0, p=0.8))
    return A.Compose([*ops, *norm], seed=seed)


class ClassificationDataModule(VisionDataModule):
    """ImageFolder classification data with timm-style albumentations pipelines.

    ``num_classes`` and ``class_names`` are set in ``__init__`` (from the train split's folders) so
    LightningCLI can link ``data.num_classes`` to ``model.num_classes`` before ``setup``.
    ``predict_dataloader`` runs over the val split with the eval pipeline.

    Args:
        root: dataset root holding the split folders.
        image_size: square training/eval crop size.
        num_workers: loader workers; ``None`` means ``min(4, os.cpu_count())``.
        auto_augment: ``None`` or ``"rand-m<M>-n<N>"`` (albumentations approximation of RandAugment).
        color_jitter: ColorJitter strength when ``auto_augment`` is off; ``None``/0 disables it.
        crop_pct: eval center-crop fraction (shorter side resized to ``image_size / crop_pct``).
        seed: seed of the augmentation RNG and of the shuffling order.
    """

    def __init__(
        self,
        root: str | Path,
        image_size: int = 224,
        batch_size: int = 32,
        num_workers: int | None = None,
        train_split: str = "train",
        val_split: str = "val",
        test_split: str | None = None,
        mean: tuple[float, float, float] = IMAGENET_DEFAULT_MEAN,
        std: tuple[float, float, float] = IMAGENET_DEFAULT_STD,
        auto_augment: str | None = None,
        color_jitter: float | None = 0.4,
        hflip: float = 0.5,
        scale: tuple[float, float] = (0.08, 1.0),
        crop_pct: float = 0.875,
        seed: int = 0,
    ) -> None:
        check_config(type(self).__name__, "data", image_size=(image_size, positive_int), batch_size=(batch_size, positive_int),
                     num_workers=(num_workers, optional(non_negative_int)), crop_pct=(crop_pct, unit_interval_open_left),
                     hflip=(hflip, fraction), color_jitter=(color_jitter, optional(non_negative)),
                     scale=(scale, each(unit_interval_open_left, 2)))
        super().__init__()
        self.save_hyperparameters()
        self.root = Path(root)
        self.batch_size = batch_size
        self.num_workers = default_num_workers(num_workers)
        self.class_names: list[str] = find_classes(self.root / train_split)
        self.num_classes: int = len(self.class_names)
        if self.num_classes < 2:  # allowed here (the data can be inspected); ClassificationTask refuses it
            log.warning("%s: one class folder with images (%r); a classifier needs two classes or more",
                        self.root / train_split, self.class_names[0])
        if auto_augment:
            _rand_augment(auto_augment)  # fail at construction, not in a worker
        self.train_dataset: ImageFolderDataset | None = None
        self.val_dataset: ImageFolderDataset | None = None
        self.test_dataset: ImageFolderDataset | None = None

    def eval_transform(self) -> dict[str, Any]:
        """The eval transform's settings (keys of the classification eval settings)."""
        hp = self.hparams
        return {"input_size": (3, hp.image_size, hp.image_size), "crop_pct": float(hp.crop_pct),
                "mean": tuple(hp.mean), "std": tuple(hp.std)}

    def _transforms(self, train: bool) -> A.Compose:
        hp = self.hparams
        rank = self.trainer.global_rank if self.trainer is not None else 0
        return classification_transforms(
            hp.image_size, train, hp.mean, hp.std, hp.crop_pct, scale=tuple(hp.scale), hflip=hp.hflip,
            color_jitter=hp.color_jitter, auto_augment=hp.auto_augment, seed=hp.seed + rank,
        )

    def _dataset(self, split: str, train: bool) -> ImageFolderDataset:
        return ImageFolderDataset(self.root / split, self._transforms(train), class_names=self.class_names,
                                  seed=self.hparams.seed)

    def setup(self, stage: str | None = None) -> None:
        hp = self.hparams
        if stage in (None, "fit") and self.train_dataset is None:
            self.train_dataset = self._dataset(hp.train_split, train=True)
        if stage in (None, "fit", "validate", "predict") and self.val_dataset is None:
            self.val_dataset = self._dataset(hp.val_split, train=False)
        if stage in (None, "test") and self.test_dataset is None:
            if hp.test_split is None:
                if stage == "test":
                    raise DatasetLayoutError("ClassificationDataModule: no test_split configured; pass test_split=<folder>")
            else:
                self.test_dataset = self._dataset(hp.test_split, train=False)

    def _eval_loader(self, dataset: Dataset | None) -> DataLoader:
        assert dataset is not None, "call setup() first"
        # under DDP each sample is scored exactly once (no padding repeats), so accuracy is exact
        return DataLoader(dataset, batch_size=self.batch_size, shuffle=False,
                          sampler=eval_sampler(dataset, self.trainer), **loader_kwargs(self.num_workers, self.hparams.seed))

    def train_dataloader(self) -> DataLoader:
        assert self.train_dataset is not None, "call setup('fit') first"
        n = len(self.train_dataset)
        # Dropping a ragged last batch keeps batch statistics steady, unless that would leave no batch at all.
        drop_last = n >= 2 * self.batch_size
        # an epoch-seeded sampler whose keys seed each sample's augmentation (exact resume, any worker count)
        sampler = train_sampler(self.train_dataset, self.trainer, self.hparams.seed)
        return TrainLoader(self.train_dataset, batch_size=self.batch_size, sampler=sampler, drop_last=drop_last,
                           **loader_kwargs(self.num_workers, self.hparams.seed))

    def val_dataloader(self) -> DataLoader:
        return self._eval_loader(self.val_dataset)

    def test_dataloader(self) -> DataLoader:
        return self._eval_loader(self.test_dataset)

    def predict_dataloader(self) -> DataLoader:
        return self._eval_loader(self.val_dataset)

    @staticmethod
    def denormalize(images: torch.Tensor, mean: Sequence[float] = IMAGENET_DEFAULT_MEAN,
                    std: Sequence[float] = IMAGENET_DEFAULT_STD) -> torch.Tensor:
        """Back to uint8 (B, 3, H, W) for drawing."""
        m = torch.tensor(mean, device=images.device).view(1, 3, 1, 1)
        s = torch.tensor(std, device=images.device).view(1, 3, 1, 1)
        return ((images * s + m) * 255).round().clamp(0, 255).to(torch.uint8)


__all__ = [
    "IMAGENET_DEFAULT_MEAN", "IMAGENET_DEFAULT_STD", "DatasetLayoutError", "find_classes", "ImageFolderDataset",
    "classification_transforms", "ClassificationDataModule",
]
