"""Image restoration data (IPT): the LightningDataModule for SR benchmark layouts, paired sets and clean folders.

Batches are ``(lq float32 (B, 3, h, w), clean float32 (B, 3, h*s, w*s), task int64 (B,))`` in [0, 1],
one task per batch. The layouts and the image reading are :mod:`visiontf.tasks.restoration.restoration_files`,
the crops and degradations :mod:`visiontf.tasks.restoration.restoration_dataset`, MATLAB's bicubic
:mod:`visiontf.data.transforms.imresize`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from torch.utils.data import DataLoader

from visiontf.core.config_checks import check_config, non_negative_int, optional, positive_int
from visiontf.data.base import VisionDataModule
from visiontf.data.loading import DatasetLayoutError, TrainLoader, default_num_workers, loader_kwargs
from visiontf.data.samplers import eval_sampler, train_sampler
from visiontf.tasks.restoration.restoration_dataset import RestorationDataset, check_records, restoration_collate, task_scale
from visiontf.tasks.restoration.restoration_files import LAYOUTS, find_records


class RestorationDataModule(VisionDataModule):
    """Restoration data for one or several tasks (super-resolution ``sr_xN``, denoising
    ``denoise_sigmaN``, paired tasks such as ``derain``).

    Args:
        root: the training images: a folder of the ``layout`` (see :mod:`visiontf.tasks.restoration.restoration_files`);
            when it has a ``train_split`` sub-folder, that one.
        val_root: the validation images (default: ``root``'s ``val_split`` sub-folder).
        tasks: task names, in the model's order (the task index of a batch is the model's head).
        layout: ``auto``, ``benchmark``, ``div2k``, ``srf``, ``paired`` or ``clean``.
        lq_dir, gt_dir: the folders of a ``paired`` layout (e.g. ``rain`` / ``norain``).
        patch_size: training crop on the low-quality image (48, IPT's window).
        repeat: crops per image per epoch (small sets: an epoch is then long enough for a validation).
        val_crop: validate on the centre ``val_crop`` pixels of each clean image (None: whole images).
        strict: a bad image (unreadable, smaller than a crop) is an error instead of a counted skip.
        cache: keep decoded images and their bicubic LR versions in memory.

    There is no class count: ``num_classes`` is None (the CLI links it into the task, which takes None).
    """

    def __init__(
        self,
        root: str | Path,
        val_root: str | Path | None = None,
        tasks: list[str] | None = None,
        layout: str = "auto",
        lq_dir: str | None = None,
        gt_dir: str | None = None,
        train_split: str = "train",
        val_split: str = "val",
        patch_size: int = 48,
        augment: bool = True,
        repeat: int = 1,
        val_crop: int | None = None,
        batch_size: int = 16,
        val_batch_size: int = 1,
        num_workers: int | None = None,
        seed: int = 0,
        strict: bool = False,
        cache: bool = True,
    ) -> None:
        check_config(type(self).__name__, "data", batch_size=(batch_size, positive_int),
                     val_batch_size=(val_batch_size, positive_int), num_workers=(num_workers, optional(non_negative_int)),
                     patch_size=(patch_size, positive_int), repeat=(repeat, positive_int),
                     val_crop=(val_crop, optional(positive_int)))
        super().__init__()
        self.save_hyperparameters()
        if layout not in LAYOUTS:
            raise DatasetLayoutError(f"layout={layout!r}; use one of {LAYOUTS}")
        self.root = Path(root)
        if not self.root.is_dir():
            raise DatasetLayoutError(f"{self.root}: dataset root not found")
        self.tasks = list(tasks or ["sr_x2"])
        self.batch_size, self.val_batch_size = batch_size, val_batch_size
        self.num_workers = default_num_workers(num_workers)
        self.train_dataset: RestorationDataset | None = None
        self.val_dataset: RestorationDataset | None = None

    def _folder(self, given: str | Path | None, split: str) -> Path:
        if given is not None:
            return Path(given)
        sub = self.root / split
        return sub if sub.is_dir() else self.root

    def _dataset(self, folder: Path, split: str, train: bool) -> RestorationDataset:
        hp = self.hparams
        records, _ = find_records(folder, split, self.tasks, hp.layout, hp.lq_dir, hp.gt_dir)
        scale = max(task_scale(t) for t in self.tasks)
        # validation: SSIM's 11x11 window must fit inside the scale's border cut
        min_size = hp.patch_size * scale if train else 3 * scale + 11
        records = check_records(records, min_size, hp.strict, f"{folder} ({'train' if train else 'val'})")
        return RestorationDataset(records, self.tasks, train, hp.patch_size, hp.augment, hp.repeat, hp.seed,
                                  hp.cache, None if train else hp.val_crop)

    def setup(self, stage: str | None = None) -> None:
        hp = self.hparams
        if stage in (None, "fit") and self.train_dataset is None:
            self.train_dataset = self._dataset(self._folder(None, hp.train_split), hp.train_split, train=True)
        if stage in (None, "fit", "validate", "test", "predict") and self.val_dataset is None:
            self.val_dataset = self._dataset(self._folder(hp.val_root, hp.val_split), hp.val_split, train=False)

    def eval_transform(self) -> dict[str, Any]:
        """Settings a Predictor needs from the data: the task order (the restoration eval settings' ``tasks``)."""
        return {"tasks": tuple(self.tasks)}

    def train_dataloader(self) -> DataLoader:
        assert self.train_dataset is not None, "call setup() first"
        # batch_size in the sampler: each key carries its batch, whose draw picks the batch's task
        sampler = train_sampler(self.train_dataset, self.trainer, self.hparams.seed, batch_size=self.batch_size)
        return TrainLoader(self.train_dataset, batch_size=self.batch_size, sampler=sampler, collate_fn=restoration_collate,
                           drop_last=len(self.train_dataset) >= 2 * self.batch_size,
                           **loader_kwargs(self.num_workers, self.hparams.seed))

    def val_dataloader(self) -> DataLoader:
        assert self.val_dataset is not None, "call setup() first"
        return DataLoader(self.val_dataset, batch_size=self.val_batch_size, collate_fn=restoration_collate,
                          sampler=eval_sampler(self.val_dataset, self.trainer),
                          **loader_kwargs(self.num_workers, self.hparams.seed))

    test_dataloader = predict_dataloader = val_dataloader


__all__ = ["RestorationDataModule"]
