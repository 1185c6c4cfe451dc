"""Any folder of images (searched recursively, no labels) for training image tokenizers.

Training samples: a random rescale (the short side drawn log-uniformly between ``crop_size`` and
``max_scale`` x the image's short side), a random ``crop_size`` crop and a horizontal flip, drawn from
(seed, epoch, index) by the data modules' train sampler, so a resumed run sees the same crops.
``color_augment`` (off by default) also draws, from the same (seed, epoch, index), a colour change of
each training crop (:func:`color_augmentation`): so that a training set of few, partly grayscale photos
still shows the model colour casts, brighter and more saturated scenes.
Evaluation: the short side resized to ``val_size``, the centre ``val_size`` square. Images are
``float32 (3, H, W)`` in [-1, 1] (``x / 127.5 - 1``, as taming feeds VQGAN).

``labels`` (off by default) makes each image's class its first folder under the root
(``root/<class>/.../x.jpg``, classes in sorted order), for class-conditional transformers: samples are then
``(image, label)``.

Unreadable files: ``on_bad_image="skip"`` (default) replaces them by the next readable image, with
one warning per file and a count in :attr:`ImageFolderDataset.skipped`; ``"raise"`` stops naming the file.
"""
from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Literal

import albumentations as A
import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader

from visiontf.core.config_checks import check_config, non_negative_int, one_of, positive, positive_int
from visiontf.data.base import VisionDataModule
from visiontf.data.class_folders import find_classes
from visiontf.data.io import ImageReadError, read_image
from visiontf.data.loading import (
    IMAGE_EXTENSIONS,
    AugmentedDataset,
    DatasetLayoutError,
    EpochIndex,
    TrainLoader,
    default_num_workers,
    loader_kwargs,
    sample_seed,
)
from visiontf.data.samplers import eval_sampler, train_sampler

log = logging.getLogger(__name__)


def list_images(root: str | Path) -> list[Path]:
    """Image files under ``root`` (recursively, hidden files and folders skipped), sorted."""
    root = Path(root)
    if not root.is_dir():
        raise DatasetLayoutError(f"{root}: image folder not found; give a folder that holds images (any depth)")
    files = sorted(p for p in root.rglob("*") if p.suffix.lower() in IMAGE_EXTENSIONS and p.is_file()
                   and not any(part.startswith(".") for part in p.relative_to(root).parts))
    if not files:
        raise DatasetLayoutError(f"{root}: no images (extensions {', '.join(IMAGE_EXTENSIONS)}) in it or below it")
    return files


def _resize(img: np.ndarray, h: int, w: int) -> np.ndarray:
    return np.asarray(Image.fromarray(img).resize((w, h), Image.BICUBIC, reducing_gap=None))


def to_tensor(img: np.ndarray) -> torch.Tensor:
    """uint8 (H, W, 3) -> float32 (3, H, W) in [-1, 1]."""
    return torch.from_numpy(np.array(img, dtype=np.uint8)).permute(2, 0, 1).float() / 127.5 - 1.0


def color_augmentation(seed: int = 0) -> A.Compose:
    """A random colour change of a uint8 (H, W, 3) crop that keeps its hues: a colour cast (per-channel
    shifts of up to 20 levels, which is what colours a grayscale photo), brightness, contrast and saturation
    jitter, and a small hue turn. Geometry is left alone.

    Channel swaps, full hue turns and negatives are left out on purpose: a small tokenizer trained on crops
    of any colour spends its few codes on brightness patterns and reconstructs photos almost grayscale
    (docs/generation.md, "Colour")."""
    return A.Compose([
        A.RGBShift(r_shift_limit=20, g_shift_limit=20, b_shift_limit=20, p=0.5),
        A.ColorJitter(brightness=0.3, contrast=0.3, saturation=(0.7, 1.5), hue=0.05, p=0.8),
    ], seed=seed)


class ImageFolderDataset(AugmentedDataset):
    """Images of ``files``: random crops (``train``) or centre crops, ``repeat`` passes per epoch."""

    def __init__(self, files: list[Path], size: int, train: bool, max_scale: float = 1.0, repeat: int = 1,
                 seed: int = 0, on_bad_image: Literal["skip", "raise"] = "skip", cache: bool = False,
                 color_augment: bool = False, labels: list[int] | None = None) -> None:
        if labels is not None and len(labels) != len(files):
            raise ValueError(f"{len(labels)} labels for {len(files)} images")
        self.labels = None if labels is None else list(labels)
        self.files, self.size, self.train, self.max_scale = list(files), size, train, max_scale
        self.repeat, self.seed, self.on_bad_image, self.cache = repeat, seed, on_bad_image, cache
        # AugmentedDataset.sample_index seeds self.transform from (seed, epoch, index) for each sample
        self.transform = color_augmentation(seed) if (train and color_augment) else None
        self.skipped: set[Path] = set()
        self._cache: dict[int, np.ndarray] = {}

    def __len__(self) -> int:
        return len(self.files) * self.repeat

    def _read(self, i: int) -> np.ndarray:
        if i in self._cache:
            return self._cache[i]
        img = read_image(self.files[i])
        if self.cache:
            self._cache[i] = img
        return img

    def _readable(self, i: int) -> tuple[int, np.ndarray]:
        for k in range(len(self.files)):
            j = (i + k) % len(self.files)
            if self.files[j] in self.skipped:
                continue
            try:
                return j, self._read(j)
            except (ImageReadError, OSError) as e:
                if self.on_bad_image == "raise":
                    raise
                self.skipped.add(self.files[j])
                log.warning("skipping an unreadable image (%d so far): %s", len(self.skipped), e)
        raise DatasetLayoutError(f"none of the {len(self.files)} images could be read (e.g. {self.files[0]})")

    def __getitem__(self, key: int | EpochIndex) -> tuple[torch.Tensor] | tuple[torch.Tensor, torch.Tensor]:
        read, image = self._image(key)
        if self.labels is None:
            return (image,)
        # the label of the file actually read (an unreadable one is replaced by the next)
        return image, torch.tensor(self.labels[read], dtype=torch.long)

    def _image(self, key: int | EpochIndex) -> tuple[int, torch.Tensor]:
        """(index of the file read, its crop as a tensor)."""
        index = self.sample_index(key)
        epoch = key.epoch if isinstance(key, EpochIndex) else 0
        read, img = self._readable(index % len(self.files))
        H, W = img.shape[:2]
        s = self.size
        if not self.train:
            scale = s / min(H, W)
            h, w = max(s, round(H * scale)), max(s, round(W * scale))
            img = _resize(img, h, w)
            top, left = (h - s) // 2, (w - s) // 2
            return read, to_tensor(img[top:top + s, left:left + s])
        rng = np.random.default_rng(sample_seed(self.seed, epoch, index))
        short = min(H, W)
        hi = max(s, short * self.max_scale)
        target = math.exp(rng.uniform(math.log(s), math.log(hi))) if hi > s else s
        scale = target / short
        h, w = max(s, round(H * scale)), max(s, round(W * scale))
        top, left = int(rng.integers(0, h - s + 1)), int(rng.integers(0, w - s + 1))
        if (h, w) != (H, W):  # resample only the crop's box of the source (the whole image took most of the time)
            sy, sx = H / h, W / w
            box = (left * sx, top * sy, (left + s) * sx, (top + s) * sy)
            crop = np.asarray(Image.fromarray(img).resize((s, s), Image.BICUBIC, box=box, reducing_gap=None))
        else:
            crop = img[top:top + s, left:left + s]
        if rng.random() < 0.5:
            crop = crop[:, ::-1]
        if self.transform is not None:
            crop = self.transform(image=np.ascontiguousarray(crop))["image"]
        return read, to_tensor(crop)


class TokenizerDataModule(VisionDataModule):
    """Images of any folder for :class:`~visiontf.tasks.generation.tokenizer_task.TokenizerTask`.

    Args:
        root: the training images (any folder, searched recursively).
        val_root: validation images (any folder); None: ``val_count`` images of ``root`` held out
            (the last ones in sorted order), or no validation when ``val_count`` is 0.
        crop_size: training crop (a multiple of the model's downsampling factor).
        val_size: evaluation centre crop after resizing the short side to it.
        max_scale: the largest rescale of a training image (1: its own resolution at most).
        repeat: passes over the training images per epoch (small folders).
        cache: keep decoded images in memory (small folders; per worker process).
        color_augment: a random colour change of each training crop (:func:`color_augmentation`; off by
            default): for small or partly grayscale training sets that must reconstruct colour photos.
        labels: each image's class is its first folder under ``root`` (``val_root``: the same class names);
            batches are ``(images, labels)`` and ``num_classes`` / ``class_names`` say the classes, for a
            class-conditional transformer. Off: images only (a tokenizer, an unconditional transformer).
    """

    def __init__(self, root: str, val_root: str | None = None, val_count: int = 0, crop_size: int = 64,
                 val_size: int = 128, max_scale: float = 1.0, repeat: int = 1, batch_size: int = 16,
                 val_batch_size: int | None = None, num_workers: int | None = None, seed: int = 0,
                 on_bad_image: Literal["skip", "raise"] = "skip", cache: bool = False,
                 color_augment: bool = False, labels: bool = False) -> None:
        super().__init__()
        check_config(type(self).__name__, "data", crop_size=(crop_size, positive_int), val_size=(val_size, positive_int),
                     batch_size=(batch_size, positive_int), repeat=(repeat, positive_int),
                     val_count=(val_count, non_negative_int), max_scale=(max_scale, positive),
                     on_bad_image=(on_bad_image, one_of("skip", "raise")))
        self.save_hyperparameters()
        self.batch_size = batch_size
        self.num_workers = default_num_workers(num_workers)
        self.train_dataset = self.val_dataset = None
        self.class_names: list[str] | None = None
        if labels:  # known before setup: the CLI links num_classes into the task at instantiation
            for file in list_images(root):  # refused here, where classification only warns: it would have no class
                self._class_of(file, root)
            # the class folders by the classification layout's rule (ImageFolderDataModule's): one meaning of a class
            self.class_names = find_classes(root)
            self.num_classes = len(self.class_names)

    @staticmethod
    def _class_of(file: Path, root: str) -> str:
        parts = file.relative_to(root).parts
        if len(parts) < 2:
            raise DatasetLayoutError(f"{file}: with labels, every image must be in a class folder "
                                     f"({root}/<class>/{file.name}); move it into one, or set data.init_args.labels false")
        return parts[0]

    def _labels(self, files: list[Path], root: str) -> list[int] | None:
        if self.class_names is None:
            return None
        index = {c: i for i, c in enumerate(self.class_names)}
        labels = []
        for f in files:
            c = self._class_of(f, root)
            if c not in index:
                raise DatasetLayoutError(f"{f}: class folder {c!r} is not one of the {len(index)} training classes "
                                         f"({', '.join(self.class_names[:8])}{', ...' if len(index) > 8 else ''})")
            labels.append(index[c])
        return labels

    def setup(self, stage: str | None = None) -> None:
        hp = self.hparams
        files = list_images(hp.root)
        val_files = list_images(hp.val_root) if hp.val_root else files[len(files) - hp.val_count:] if hp.val_count else []
        if not hp.val_root and hp.val_count:
            if hp.val_count >= len(files):
                raise DatasetLayoutError(f"{hp.root}: val_count={hp.val_count} leaves no training image of {len(files)}")
            files = files[: len(files) - hp.val_count]
        common = dict(seed=hp.seed, on_bad_image=hp.on_bad_image, cache=hp.cache)
        self.train_dataset = ImageFolderDataset(files, hp.crop_size, True, hp.max_scale, hp.repeat,
                                                color_augment=hp.color_augment, labels=self._labels(files, hp.root),
                                                **common)
        val_labels = self._labels(val_files, hp.val_root or hp.root) if val_files else None
        self.val_dataset = ImageFolderDataset(val_files, hp.val_size, False, labels=val_labels, **common) \
            if val_files else None
        log.info("%d training images (x%d per epoch), %d validation images", len(files), hp.repeat, len(val_files))

    def train_dataloader(self) -> DataLoader:
        sampler = train_sampler(self.train_dataset, self.trainer, self.hparams.seed)
        drop_last = len(self.train_dataset) >= self.batch_size
        return TrainLoader(self.train_dataset, batch_size=self.batch_size, sampler=sampler, drop_last=drop_last,
                           **loader_kwargs(self.num_workers, self.hparams.seed))

    def val_dataloader(self) -> DataLoader | list:
        if self.val_dataset is None:
            return []
        return DataLoader(self.val_dataset, batch_size=self.hparams.val_batch_size or self.batch_size, shuffle=False,
                          sampler=eval_sampler(self.val_dataset, self.trainer),
                          **loader_kwargs(self.num_workers, self.hparams.seed))
