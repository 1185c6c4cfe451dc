"""The COCO detection LightningDataModule (``class_path: visiontf.tasks.detection.coco_data.CocoDataModule``).

Built from :mod:`visiontf.tasks.detection.coco_annotations` (reading and validating annotation files) and
:mod:`visiontf.tasks.detection.coco_dataset` (the Dataset and its padding collate); the dataset's files are
found by :mod:`visiontf.tasks.detection.detection_layouts`.
"""
from __future__ import annotations

import logging
import statistics
from collections.abc import Hashable, Sequence
from functools import partial
from pathlib import Path
from typing import Any, Literal

from torch.utils.data import DataLoader, Dataset

from visiontf.core.config_checks import ConfigError, check_config, each, fraction, non_negative_int, optional, positive_int
from visiontf.data.base import DetectionDataModule
from visiontf.data.loading import BatchSamplerLoader, EpochIndex, TrainLoader, default_num_workers, loader_kwargs
from visiontf.data.mixup import MixUp, MixUpCollate
from visiontf.data.samplers import aspect_ratio_groups, eval_batch_sampler, train_sampler
from visiontf.data.transforms import detection as DT
from visiontf.tasks.detection.coco_annotations import AnnotationError, label_maps, load_coco_json, parse_categories
from visiontf.tasks.detection.coco_dataset import CocoDetection, collate_detection
from visiontf.tasks.detection.detection_layouts import resolve_detection_layout

log = logging.getLogger(__name__)

__all__ = ["CocoDataModule", "ScheduledCocoDetection"]


class _EpochTagged:
    """A training dataset whose targets carry their sample's ``epoch`` (None without one), for a collate that draws by
    epoch (:class:`~visiontf.data.mixup.MixUpCollate`, which removes it)."""

    def __getitem__(self, key: int | EpochIndex) -> tuple[Any, dict[str, Any]]:
        image, target = super().__getitem__(key)  # type: ignore[misc]
        target["epoch"] = key.epoch if isinstance(key, EpochIndex) else None
        return image, target


class ScheduledCocoDetection(CocoDetection):
    """A training :class:`~visiontf.tasks.detection.coco_dataset.CocoDetection` whose augmentation follows an
    :class:`~visiontf.data.transforms.detection.AugmentationSchedule`: each sample takes the pipeline of its key's
    epoch (the train sampler's :class:`~visiontf.data.loading.EpochIndex`), seeded for that sample as always."""

    schedule = DT.AugmentationSchedule()
    pipelines: dict[str, Any] = {}
    draws_mosaics = False

    def follow(self, schedule: DT.AugmentationSchedule, mosaic: bool, pipelines: dict[str, Any]) -> None:
        """Take ``pipelines`` (one per :data:`~visiontf.data.transforms.detection.SCHEDULE_STAGES` stage) by ``schedule``."""
        self.schedule, self.draws_mosaics, self.pipelines = schedule, mosaic, dict(pipelines)

    def __getitem__(self, key: int | EpochIndex) -> tuple[Any, dict[str, Any]]:
        stage = self.schedule.stage(key.epoch if isinstance(key, EpochIndex) else None, self.draws_mosaics)
        self.transform = self.pipelines[stage]
        self.mosaic = stage == "mosaic"  # the mosaic's partner images are loaded only for it
        return super().__getitem__(key)


class _TaggedCocoDetection(_EpochTagged, CocoDetection):
    pass


class _TaggedScheduledCocoDetection(_EpochTagged, ScheduledCocoDetection):
    pass


class CocoDataModule(DetectionDataModule):
    """COCO-layout detection data (``root/train2017``, ``root/annotations/instances_*.json``, ...).

    With the ``*_images`` / ``*_ann`` paths left at their defaults, ``root`` may also hold a
    Roboflow/CVAT COCO export or a YOLO dataset (``data.yaml``); see :mod:`visiontf.tasks.detection.detection_layouts`.

    ``num_classes``, ``class_names``, ``label_to_cat_id``, ``cat_id_to_label`` and ``val_ann_file``
    are set in ``__init__`` (from the val annotation file's categories, or the train file's when
    there is no val file) so that LightningCLI can link them to the model. Loaders use plain
    ``shuffle``; Lightning swaps in a ``DistributedSampler`` under DDP.

    Sizes default to DETR's; ``scales``/``max_size``/``crop_scales``/``crop_size``/``val_size`` shrink
    them for small images. ``test_*`` default to the val split.

    Less padding in training batches (both off by default, which keeps DETR's augmentation draws):
    ``scale_per_batch`` gives every image of a batch the same random scale (YOLO's and RT-DETR's
    multi-scale training), and ``aspect_ratio_groups`` > 1 fills each batch from one of that many
    aspect-ratio bins (torchvision's ``GroupedBatchSampler``, Detectron2's aspect-ratio grouping),
    read from the annotated image sizes. With DETR's per-image scales much of a batch is padding on the
    synthetic sets; both options together cut it (docs/record/speed.md#measurements-behind-comments-in-the-code).

    ``mosaic`` (0 by default) is the probability that a training image is a 2x2 mosaic of four
    (albumentations' ``Mosaic``, each fitted into a cell of the median image size): four images' objects
    at half their size, so more queries are matched per image. This is DEIM's "dense one-to-one" matching
    (Huang et al., CVPR 2025), against the duplicate detections of a short one-to-one training.

    An augmentation schedule by epoch (:class:`~visiontf.data.transforms.detection.AugmentationSchedule`; both off by
    default): ``strong_aug_epochs: [start, stop]`` runs the strong augmentation (DETR's random crop and the mosaic)
    only in epochs ``start <= epoch < stop``, a flip and the multi-scale resize before, a flip and one resize to
    ``val_size`` from ``stop`` on (D-FINE stops its strong augmentation and multi-scale training for its last epochs,
    DEIM also starts it at epoch 4); ``mosaic_epochs: [start, stop]`` draws mosaics only in those epochs (DEIM: the
    first half). Each training sample's epoch comes with its key, so the schedule holds in every worker process and
    on resume.

    ``mixup: {prob, epochs, ratio}`` (:class:`~visiontf.data.mixup.MixUp`; off by default) is DEIM's MixUp: with
    probability ``prob`` in epochs ``epochs[0] <= epoch < epochs[1]``, the collate mixes each training image with the
    batch's previous one and keeps the boxes of both (DEIM: probability 0.5 in its mosaic epochs).

    ``label_space: category_id`` makes the class index the COCO category id (``num_classes`` = the
    largest id + 1: 91 for COCO), as the original DETR, Deformable DETR and DINO train: their published
    checkpoints then evaluate and fine-tune with their class heads. The default numbers the categories
    0..K-1 (``label_to_cat_id`` maps them back in results files).

    ``masks: true`` also reads each annotation's instance mask (polygons or RLE, with pycocotools), which
    follows the image through every augmentation: what a model with a mask head (``detr_tiny_masks``,
    ``detr_resnet50_panoptic``) trains on, and what lets validation score mask AP (``segm``) besides boxes.
    """

    def __init__(
        self,
        root: str | Path,
        train_images: str = "train2017",
        val_images: str = "val2017",
        train_ann: str = "annotations/instances_train2017.json",
        val_ann: str = "annotations/instances_val2017.json",
        test_images: str | None = None,
        test_ann: str | None = None,
        batch_size: int = 2,
        val_batch_size: int | None = None,
        num_workers: int | None = None,
        scales: Sequence[int] = DT.DETR_SCALES,
        max_size: int = DT.DETR_MAX_SIZE,
        crop_scales: Sequence[int] = DT.DETR_CROP_SCALES,
        crop_size: tuple[int, int] = DT.DETR_CROP_SIZE,
        val_size: int = DT.DETR_VAL_SIZE,
        size_divisibility: int = 0,
        pin_memory: bool | None = None,
        persistent_workers: bool | None = None,
        seed: int = 0,
        scale_per_batch: bool = False,
        aspect_ratio_groups: int = 0,
        label_space: Literal["contiguous", "category_id"] = "contiguous",
        mosaic: float = 0.0,
        masks: bool = False,
        strong_aug_epochs: tuple[int, int] | None = None,
        mosaic_epochs: tuple[int, int] | None = None,
        mixup: MixUp | None = None,
    ):
        check_config(type(self).__name__, "data", batch_size=(batch_size, positive_int),
                     val_batch_size=(val_batch_size, optional(positive_int)),
                     num_workers=(num_workers, optional(non_negative_int)), scales=(scales, each(positive_int)),
                     max_size=(max_size, positive_int), crop_scales=(crop_scales, each(positive_int)),
                     crop_size=(crop_size, each(positive_int, 2)), val_size=(val_size, positive_int),
                     size_divisibility=(size_divisibility, non_negative_int),
                     aspect_ratio_groups=(aspect_ratio_groups, non_negative_int), mosaic=(mosaic, fraction))
        try:  # a typed section, kept as a plain mapping in the hyper-parameters
            self.mixup = None if mixup is None else MixUp.of(mixup)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"CocoDataModule: data.init_args.{e}") from None
        mixup = None if self.mixup is None else self.mixup.as_dict()
        super().__init__()
        self.save_hyperparameters()
        self.root = Path(root)
        # the standard COCO paths, or a Roboflow/CVAT export or a YOLO set found under root (visiontf.tasks.detection.detection_layouts)
        paths = resolve_detection_layout(self.root, train_images=train_images, val_images=val_images, train_ann=train_ann,
                                         val_ann=val_ann, test_images=test_images, test_ann=test_ann)
        self.layout = paths.layout
        self.train_images, self.train_ann_file = paths.train_images, paths.train_ann
        self.val_images, self.val_ann_file = paths.val_images, paths.val_ann
        self.test_images, self.test_ann_file = paths.test_images, paths.test_ann
        self.batch_size = batch_size
        self.val_batch_size = val_batch_size or batch_size
        self.num_workers = default_num_workers(num_workers)
        resolved = loader_kwargs(self.num_workers, seed, pin_memory, persistent_workers)
        self.pin_memory, self.persistent_workers = resolved["pin_memory"], resolved["persistent_workers"]
        self.scales, self.max_size = tuple(scales), max_size
        self.crop_scales, self.crop_size, self.val_size = tuple(crop_scales), tuple(crop_size), val_size
        self.size_divisibility = size_divisibility
        self.seed = seed
        self.scale_per_batch, self.aspect_ratio_groups = bool(scale_per_batch), int(aspect_ratio_groups)
        self.mosaic = float(mosaic)
        self.masks = bool(masks)
        try:
            self.schedule = DT.AugmentationSchedule(None if strong_aug_epochs is None else tuple(strong_aug_epochs),
                                                    None if mosaic_epochs is None else tuple(mosaic_epochs))
        except (TypeError, ValueError) as e:
            raise ConfigError(f"CocoDataModule: data.init_args.strong_aug_epochs / mosaic_epochs: {e}") from None

        # Categories only (the full train file can be large): the smaller val file normally has them.
        cat_file = self.val_ann_file if self.val_ann_file.is_file() else self.train_ann_file
        self.label_space = label_space
        self._category_ids, names = parse_categories(load_coco_json(cat_file), cat_file)
        self._category_file = cat_file
        self.cat_id_to_label, self.class_names = label_maps(self._category_ids, names, label_space, cat_file)
        self.label_to_cat_id = {label: c for c, label in self.cat_id_to_label.items()}
        self.num_classes = len(self.class_names)
        shown = ", ".join(f"{n} (id {c})" for c, n in list(zip(self._category_ids, names))[:10])
        space = "" if label_space == "contiguous" else f" (class index = category id: {self.num_classes} outputs)"
        log.info("%d classes from %s%s: %s%s", len(names), cat_file, space, shown, ", ..." if len(names) > 10 else "")
        if self.schedule != DT.AugmentationSchedule() or self.mixup is not None:
            # the windows are set by epoch, far from where a run shows them: say once what each epoch gets
            mix = "" if self.mixup is None else (f"; MixUp with probability {self.mixup.prob:g} in "
                                                 f"{self.schedule.window(self.mixup.epochs)}")
            log.info("training augmentation by epoch: %s%s", self.schedule.describe(self.mosaic), mix)
        self.train_dataset: CocoDetection | None = None
        self.val_dataset: CocoDetection | None = None
        self.test_dataset: CocoDetection | None = None

    def eval_transform(self) -> dict[str, Any]:
        """The eval transform's settings (keys of the detection eval settings)."""
        return {"min_size": int(self.val_size), "max_size": int(self.max_size), "mean": tuple(DT.IMAGENET_MEAN),
                "std": tuple(DT.IMAGENET_STD)}

    def _dataset(self, img_dir: Path, ann_file: Path, train: bool) -> CocoDetection:
        mosaic = self.mosaic if train else 0.0
        scheduled = train and self.schedule != DT.AugmentationSchedule()
        kind = ScheduledCocoDetection if scheduled else CocoDetection
        if train and self.mixup is not None:  # the collate draws MixUp by the samples' epoch
            kind = _TaggedScheduledCocoDetection if scheduled else _TaggedCocoDetection
        ds = kind(img_dir, ann_file, seed=self.seed, label_space=self.label_space, mosaic=mosaic > 0, masks=self.masks)
        if train:  # after parsing: the mosaic cell is sized from the split's images
            cell = self._mosaic_cell(ds) if mosaic else None
            build = partial(DT.build_train_transforms, self.scales, self.max_size, self.crop_scales, self.crop_size, seed=self.seed,
                            scale_per_batch=self.scale_per_batch)
            ds.transform = build(mosaic=mosaic, mosaic_cell=cell)
            if scheduled:
                ds.follow(self.schedule, mosaic > 0, {
                    "mosaic": ds.transform, "strong": build(), "weak": build(crop=False),
                    "plain": DT.build_train_transforms((self.val_size,), self.max_size, seed=self.seed, crop=False)})
        else:
            ds.transform = DT.build_val_transforms(self.val_size, self.max_size)
        if ds.index.category_ids != self._category_ids:
            raise AnnotationError(
                f"{ann_file}: category ids {ds.index.category_ids} differ from {self._category_ids} in the file "
                "num_classes was read from; every split must list the same categories"
            )
        renamed = [(c, a, self.class_names[self.cat_id_to_label[c]]) for c, a in zip(self._category_ids, ds.index.class_names)
                   if a != self.class_names[self.cat_id_to_label[c]]]
        if renamed:  # same ids, other classes: one split's labels would be trained or scored as the other's
            shown = "; ".join(f"id {c}: {a!r} here, {b!r} there" for c, a, b in renamed[:6])
            raise AnnotationError(
                f"{ann_file}: category names differ from {self._category_file} for the same ids ({shown}); every split must "
                "list the same categories: correct the names (or the ids) in one of the files"
            )
        return ds

    @staticmethod
    def _mosaic_cell(ds: CocoDetection) -> tuple[int, int]:
        """A mosaic cell is the median annotated image (h, w): most images fill their cell."""
        sizes = [(im["height"], im["width"]) for im in ds.index.images
                 if isinstance(im.get("height"), int) and isinstance(im.get("width"), int) and im["height"] > 0 and im["width"] > 0]
        if not sizes:
            raise AnnotationError(f"{ds.ann_file}: data.init_args.mosaic needs the images' width and height in the file "
                                  "to size the mosaic cells; add them, or set mosaic 0")
        hs, ws = zip(*sizes)
        return int(statistics.median(hs)), int(statistics.median(ws))

    def teardown(self, stage: str | None = None) -> None:
        # one line per split counting the images whose real size differed from the annotation
        for ds in (self.train_dataset, self.val_dataset, self.test_dataset):
            if ds is not None:
                ds.log_size_mismatches()

    def setup(self, stage: str | None = None) -> None:
        if stage in ("fit", None) and self.train_dataset is None:
            self.train_dataset = self._dataset(self.train_images, self.train_ann_file, train=True)
        if stage in ("fit", "validate", "predict", None) and self.val_dataset is None:
            self.val_dataset = self._dataset(self.val_images, self.val_ann_file, train=False)
        if stage in ("test", None) and self.test_dataset is None:
            self.test_dataset = self._dataset(self.test_images, self.test_ann_file, train=False)

    def _loader(self, ds: Dataset | None, batch_size: int, shuffle: bool, name: str) -> DataLoader:
        if ds is None:
            raise RuntimeError(f"CocoDataModule: {name} dataset not set up; call setup() with the matching stage first")
        # train: epoch-seeded order whose keys seed each sample's augmentation (exact resume, any worker
        # count); eval under DDP: each image once across ranks (CocoMetric de-duplicates repeats too)
        collate: Any = partial(collate_detection, size_divisibility=self.size_divisibility)
        if shuffle and self.mixup is not None:
            collate = MixUpCollate(self.mixup, self.seed, self.size_divisibility)
        kwargs = loader_kwargs(self.num_workers, self.seed, self.pin_memory, self.persistent_workers)
        if shuffle:
            sampler = train_sampler(ds, self.trainer, self.seed, **self._batch_layout(ds, batch_size))
            return TrainLoader(ds, batch_size=batch_size, sampler=sampler, collate_fn=collate, **kwargs)
        # eval: batches of one resized size (no padding), so the stats do not depend on the batch size
        # or the process count (visiontf.data.batching)
        batches = eval_batch_sampler(ds, self.trainer, batch_size, self._eval_sizes(ds))
        return BatchSamplerLoader(ds, batch_sampler=batches, collate_fn=collate, **kwargs)

    def _eval_sizes(self, ds: CocoDetection) -> list[Hashable]:
        """Each image's size after the eval resize, from its annotated width/height (no image is read).
        An image without them gets a key of its own: it is evaluated alone. One whose real size differs
        from the annotation (warned about when it is read) may share a batch with another size."""
        sizes: list[Hashable] = []
        for i, im in enumerate(ds.index.images):
            h, w = im.get("height"), im.get("width")
            known = isinstance(h, int) and isinstance(w, int) and h > 0 and w > 0
            sizes.append(DT.resized_hw(h, w, self.val_size, self.max_size) if known else ("unknown size", i))
        return sizes

    def _batch_layout(self, ds: CocoDetection, batch_size: int) -> dict[str, Any]:
        # batch numbers in the keys only when something is shared by a batch (the default keeps the keys,
        # and so the augmentations, of earlier versions)
        if not (self.scale_per_batch or self.aspect_ratio_groups > 1):
            return {}
        groups = None
        if self.aspect_ratio_groups > 1:
            # the annotated sizes (an image without them counts as square): no image is read for this
            sizes = [(im.get("height") or 1, im.get("width") or 1) for im in ds.index.images]
            groups = aspect_ratio_groups(sizes, self.aspect_ratio_groups)
        return {"batch_size": batch_size, "group_ids": groups}

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_dataset, self.batch_size, True, "train")

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_dataset, self.val_batch_size, False, "val")

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.test_dataset, self.val_batch_size, False, "test")

    def predict_dataloader(self) -> DataLoader:
        return self._loader(self.val_dataset, self.val_batch_size, False, "predict")
