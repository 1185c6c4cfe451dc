"""Semantic segmentation data: the LightningDataModule for ADE20K / Cityscapes / generic layouts.

Batches are ``(images float32 (B, 3, H, W) normalised, masks int64 (B, H, W))`` with ``ignore_index``
(255) on unlabeled and padded pixels. The parts live beside this module: label conventions in
:mod:`~visiontf.data.segmentation_labels`, the mmseg/SETR pipelines in
:mod:`~visiontf.data.transforms.segmentation`, file finding in :mod:`~visiontf.tasks.segmentation.segmentation_files`
and the Dataset in :mod:`~visiontf.tasks.segmentation.segmentation_dataset`; their public names are importable from
here as before.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import albumentations as A
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from torch.utils.data import DataLoader, Dataset

from visiontf.core.config_checks import (
    check_config,
    each,
    fraction,
    non_negative_int,
    optional,
    positive,
    positive_int,
    unit_interval_open_left,
)
from visiontf.data.base import VisionDataModule
from visiontf.data.loading import BatchSamplerLoader, DatasetLayoutError, TrainLoader, default_num_workers, loader_kwargs
from visiontf.data.samplers import eval_batch_sampler, train_sampler
from visiontf.data.segmentation_labels import (
    ADE20K_CLASSES,
    CITYSCAPES_CLASSES,
    EVAL_PROTOCOLS,
    IGNORE_INDEX,
    LAYOUTS,
    LabelError,
    reduce_zero_label,
)
from visiontf.data.transforms.segmentation import (
    CatMaxRatioCrop,
    RandomRescale,
    keep_ratio_size,
    photometric_distortion,
    segmentation_transforms,
)
from visiontf.tasks.segmentation.segmentation_dataset import (
    SegmentationDataset,
    _Collate,
    check_classes_present,
    segmentation_collate,
)
from visiontf.tasks.segmentation.segmentation_files import (
    PAIR_FINDERS,
    ade20k_pairs,
    cityscapes_pairs,
    generic_pairs,
    read_class_names,
    resolve_classes,
)


class SegmentationDataModule(VisionDataModule):
    """Semantic segmentation data for the generic, ADE20K and Cityscapes layouts.

    ``num_classes``, ``class_names`` and ``ignore_index`` are set in ``__init__`` (LightningCLI links
    ``data.num_classes`` to ``model.num_classes`` before ``setup``). Layout defaults: split names
    (``training``/``validation`` for ADE20K), ``reduce_zero_label`` (ADE20K only), ``base_size``
    ((2048, 512); Cityscapes (2048, 1024)) and the class table (``classes.txt`` wins when present).

    Validation images keep their own sizes; evaluation batches hold images of one size only (grouped by
    the image headers), so nothing is padded and the scores do not depend on ``val_batch_size`` (1 by
    default) or the process count. ``predict_dataloader`` runs over the val split.

    ``eval_protocol`` (default: the layout's; ADE20K and Cityscapes ``"mmseg"``, generic ``"resized"``):

    * ``"mmseg"``: mmseg's test pipeline. The image is resized (``val_resize``), the annotation is
      loaded at its original size (after ``reduce_zero_label``; 255 ignored), and val/test batches are
      ``(images, masks, sizes)`` (see :func:`segmentation_collate`): the task resizes the logits to each
      original annotation (bilinear, ``align_corners=False``) and counts IoU there, as mmseg's
      ``postprocess_result`` and ``IoUMetric``. This is the protocol of mmseg's published mIoU.
    * ``"resized"``: the annotation is resized with the image (nearest) and scored at that size;
      batches are ``(images, masks)``. visiontf's protocol before; cheaper, not mmseg's number.

    Masks stored as JPEG are refused (lossy labels) unless ``allow_jpeg_masks: true``.
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
        eval_protocol: Literal["mmseg", "resized"] | None = None,
        allow_jpeg_masks: bool = False,
    ) -> None:
        check_config(type(self).__name__, "data", batch_size=(batch_size, positive_int),
                     val_batch_size=(val_batch_size, positive_int), num_workers=(num_workers, optional(non_negative_int)),
                     hflip=(hflip, fraction), cat_max_ratio=(cat_max_ratio, unit_interval_open_left),
                     ratio_range=(ratio_range, each(positive, 2)))
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
        # the resolved count, so Lightning's hparams merge agrees with the task's num_classes: it merges the initial
        # hyper-parameters (save_hyperparameters' copy), which a num_classes of null left at None
        self.hparams["num_classes"] = self._hparams_initial["num_classes"] = self.num_classes
        self.ignore_index = ignore_index
        self.reduce_zero_label = defaults["reduce_zero_label"] if reduce_zero_label is None else reduce_zero_label
        self.base_size = tuple(base_size) if base_size is not None else defaults["base_size"]
        self.eval_protocol = eval_protocol or defaults["eval_protocol"]
        if self.eval_protocol not in EVAL_PROTOCOLS:
            raise ValueError(f"eval_protocol={eval_protocol!r}; use 'mmseg' (annotations at their original size, "
                             "mmseg's published numbers) or 'resized' (annotations resized with the image)")
        self.train_split = train_split or defaults["train_split"]
        self.val_split = val_split or defaults["val_split"]
        self.test_split = test_split
        self.batch_size = batch_size
        self.val_batch_size = val_batch_size
        self.num_workers = default_num_workers(num_workers)
        self.train_dataset: SegmentationDataset | None = None
        self.val_dataset: SegmentationDataset | None = None
        self.test_dataset: SegmentationDataset | None = None

    def eval_transform(self) -> dict[str, Any]:
        """The eval transform's settings (keys of the segmentation eval settings). ``resize``: the keep-ratio
        scale, or None: validation keeps the original size, so prediction does too (whatever the model's
        published settings resize to)."""
        hp = self.hparams
        resize = None if hp.val_resize is False else tuple(self.base_size if hp.val_resize is True else hp.val_resize)
        return {"mean": tuple(hp.mean), "std": tuple(hp.std), "resize": resize}

    def transforms(self, train: bool) -> A.Compose:
        """The albumentations pipeline this module uses for training or evaluation."""
        hp = self.hparams
        rank = self.trainer.global_rank if self.trainer is not None else 0
        return segmentation_transforms(
            train, crop_size=hp.crop_size, base_size=self.base_size, ratio_range=tuple(hp.ratio_range),
            cat_max_ratio=hp.cat_max_ratio, hflip=hp.hflip, photometric=hp.photometric, mean=hp.mean, std=hp.std,
            ignore_index=self.ignore_index, val_resize=hp.val_resize, seed=hp.seed + rank,
            resize_mask=self.eval_protocol != "mmseg",
        )

    def _dataset(self, split: str, train: bool) -> SegmentationDataset:
        pairs = PAIR_FINDERS[self.layout](self.root, split)
        return SegmentationDataset(pairs, self.num_classes, self.transforms(train), self.reduce_zero_label,
                                   self.ignore_index, self.hparams.strict, self.class_names, seed=self.hparams.seed,
                                   allow_jpeg_masks=self.hparams.allow_jpeg_masks)

    def setup(self, stage: str | None = None) -> None:
        if stage in (None, "fit") and self.train_dataset is None:
            self.train_dataset = self._dataset(self.train_split, train=True)
            check_classes_present(self.train_dataset, self.train_split)
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
        # mmseg's protocol: eval batches carry each image's and original mask's size
        collate = _Collate(self.ignore_index, with_sizes=not train and self.eval_protocol == "mmseg")
        kwargs = loader_kwargs(self.num_workers, self.hparams.seed)
        if train:
            # an epoch-seeded sampler whose keys seed each sample's augmentation (exact resume, any worker count)
            sampler = train_sampler(dataset, self.trainer, self.hparams.seed)
            return TrainLoader(dataset, batch_size=batch_size, collate_fn=collate, sampler=sampler,
                               drop_last=len(dataset) >= 2 * batch_size, **kwargs)
        # eval: batches of one image size over this process's unrepeated share (every val image scored once,
        # so mIoU sums are exact under DDP). Zero padding in a mixed batch reached the ViT's tokens and the
        # sliding windows: the scores moved with the batch size and the process count (docs/segmentation.md)
        batches = eval_batch_sampler(dataset, self.trainer, batch_size, dataset.image_sizes())
        return BatchSamplerLoader(dataset, batch_sampler=batches, collate_fn=collate, **kwargs)

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_dataset, self.batch_size, train=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_dataset, self.val_batch_size, train=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.test_dataset, self.val_batch_size, train=False)

    def predict_dataloader(self) -> DataLoader:
        return self._loader(self.val_dataset, self.val_batch_size, train=False)


__all__ = [
    "ADE20K_CLASSES", "CITYSCAPES_CLASSES", "EVAL_PROTOCOLS", "IGNORE_INDEX", "LAYOUTS", "LabelError", "RandomRescale",
    "CatMaxRatioCrop", "photometric_distortion", "segmentation_transforms", "read_class_names", "generic_pairs",
    "ade20k_pairs", "cityscapes_pairs", "reduce_zero_label", "SegmentationDataset", "resolve_classes",
    "segmentation_collate", "SegmentationDataModule", "keep_ratio_size",
]
