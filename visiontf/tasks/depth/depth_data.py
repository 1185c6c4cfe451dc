"""Monocular depth data (``class_path: visiontf.tasks.depth.depth_data.DepthDataModule``).

Layout under ``root``: ``images/<split>/<name>.<ext>`` and ``depth/<split>/<name>.png``, the depth as a
16-bit PNG in ``1 / depth_scale`` metres (1000: millimetres, NYU's convention; 256 for KITTI's), 0
where nothing was measured (those pixels are neither trained on nor scored).
``tools/make_synthetic.py --task depth`` writes a small set of this layout.

Batches: ``(images (B, 3, H, W) normalised, depth (B, 1, H, W) metres)``, every image and depth map
resized to ``image_size`` (the depth by nearest neighbour, so unmeasured pixels stay 0); training
flips half the images horizontally, drawn from (seed, epoch, index) as the other data modules draw.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from torch.utils.data import DataLoader, Dataset
from torchvision.transforms.v2 import InterpolationMode
from torchvision.transforms.v2 import functional as TF

from visiontf.core.config_checks import check_config, each, non_negative_int, optional, positive, positive_int
from visiontf.data.base import VisionDataModule
from visiontf.data.io import read_image
from visiontf.data.loading import (
    IMAGE_EXTENSIONS,
    DatasetLayoutError,
    EpochIndex,
    TrainLoader,
    default_num_workers,
    loader_kwargs,
    sample_seed,
)
from visiontf.data.samplers import eval_sampler, train_sampler
from visiontf.io.image_files import open_image


def find_pairs(root: Path, split: str) -> list[tuple[Path, Path]]:
    """(image, depth map) files of ``split``, by name; an image without its depth map is an error naming both."""
    images = sorted(p for p in (root / "images" / split).glob("*") if p.suffix.lower() in IMAGE_EXTENSIONS)
    if not images:
        raise DatasetLayoutError(f"{root / 'images' / split}: no images (expected images/{split}/<name>.png beside "
                                 f"depth/{split}/<name>.png; tools/make_synthetic.py --task depth writes an example)")
    pairs = []
    for image in images:
        depth = root / "depth" / split / f"{image.stem}.png"
        if not depth.is_file():
            raise DatasetLayoutError(f"{image}: no depth map {depth} (16-bit PNG, 0 where unmeasured)")
        pairs.append((image, depth))
    return pairs


class DepthDataset(Dataset):
    """(image float (3, h, w) normalised, depth float (1, h, w) in metres) at ``size`` (h, w)."""

    def __init__(self, pairs: Sequence[tuple[Path, Path]], size: Sequence[int], depth_scale: float, mean: Sequence[float],
                 std: Sequence[float], train: bool, seed: int = 0) -> None:
        self.pairs, self.size, self.depth_scale = list(pairs), [int(s) for s in size], float(depth_scale)
        self.mean, self.std, self.train, self.seed = list(mean), list(std), train, seed

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, key: int | EpochIndex) -> tuple[torch.Tensor, torch.Tensor]:
        index = int(key.index if isinstance(key, EpochIndex) else key)
        image_file, depth_file = self.pairs[index]
        image = torch.from_numpy(read_image(image_file)).permute(2, 0, 1).float() / 255
        depth = np.asarray(open_image(depth_file), dtype=np.float32) / self.depth_scale
        if depth.shape != tuple(image.shape[-2:]):
            raise DatasetLayoutError(f"{depth_file}: {depth.shape[1]}x{depth.shape[0]} px, but its image {image_file} is "
                                     f"{image.shape[-1]}x{image.shape[-2]}")
        depth = torch.from_numpy(depth)[None]
        image = TF.resize(image, self.size, interpolation=InterpolationMode.BILINEAR, antialias=True).clamp(0, 1)
        depth = TF.resize(depth, self.size, interpolation=InterpolationMode.NEAREST)
        if self.train and isinstance(key, EpochIndex) and sample_seed(self.seed, key.epoch, key.index) % 2:
            image, depth = image.flip(-1), depth.flip(-1)
        return TF.normalize(image, self.mean, self.std), depth


class DepthDataModule(VisionDataModule):
    """Images and their depth maps (see the module docstring); no classes (``num_classes`` None).

    Args:
        root: the folder holding ``images/`` and ``depth/``.
        image_size: (h, w) every image is resized to, for training and evaluation (a multiple of the
            model's patch size).
        depth_scale: stored units per metre (1000: millimetres; KITTI: 256).
    """

    def __init__(self, root: str | Path, image_size: Sequence[int] = (64, 80), depth_scale: float = 1000.0,
                 train_split: str = "train", val_split: str = "val", batch_size: int = 8, val_batch_size: int | None = None,
                 num_workers: int | None = None, seed: int = 0, mean: Sequence[float] = IMAGENET_DEFAULT_MEAN,
                 std: Sequence[float] = IMAGENET_DEFAULT_STD) -> None:
        check_config(type(self).__name__, "data", image_size=(image_size, each(positive_int, 2)),
                     depth_scale=(depth_scale, positive), batch_size=(batch_size, positive_int),
                     val_batch_size=(val_batch_size, optional(positive_int)),
                     num_workers=(num_workers, optional(non_negative_int)))
        super().__init__()
        self.save_hyperparameters()
        self.root = Path(root)
        if not self.root.is_dir():
            raise DatasetLayoutError(f"{self.root}: dataset root not found (--data.root)")
        self.batch_size = batch_size
        self.num_workers = default_num_workers(num_workers)
        self.train_dataset: DepthDataset | None = None
        self.val_dataset: DepthDataset | None = None

    def eval_transform(self) -> dict[str, Any]:
        """The eval transform's settings (keys of the depth eval settings)."""
        hp = self.hparams
        return {"input_size": (3, *hp.image_size), "mean": tuple(hp.mean), "std": tuple(hp.std)}

    def _dataset(self, split: str, train: bool) -> DepthDataset:
        hp = self.hparams
        return DepthDataset(find_pairs(self.root, split), hp.image_size, hp.depth_scale, hp.mean, hp.std, train, hp.seed)

    def setup(self, stage: str | None = None) -> None:
        if stage in (None, "fit") and self.train_dataset is None:
            self.train_dataset = self._dataset(self.hparams.train_split, train=True)
        if self.val_dataset is None:
            self.val_dataset = self._dataset(self.hparams.val_split, train=False)

    def train_dataloader(self) -> DataLoader:
        sampler = train_sampler(self.train_dataset, self.trainer, self.hparams.seed)
        return TrainLoader(self.train_dataset, batch_size=self.batch_size, sampler=sampler,
                           drop_last=len(self.train_dataset) >= 2 * self.batch_size,
                           **loader_kwargs(self.num_workers, self.hparams.seed))

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_dataset, batch_size=self.hparams.val_batch_size or self.batch_size,
                          sampler=eval_sampler(self.val_dataset, self.trainer), **loader_kwargs(self.num_workers, self.hparams.seed))

    test_dataloader = predict_dataloader = val_dataloader


__all__ = ["DepthDataModule", "DepthDataset", "find_pairs"]
