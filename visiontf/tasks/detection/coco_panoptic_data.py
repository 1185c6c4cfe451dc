"""The COCO panoptic LightningDataModule (``class_path: visiontf.tasks.detection.coco_panoptic_data.CocoPanopticDataModule``).

Trains a mask-predicting detector (``detr_tiny_masks``, ``detr_resnet50_panoptic``) on every panoptic
segment (:class:`~visiontf.tasks.detection.coco_panoptic_dataset.CocoPanoptic`) with DETR's augmentation, and
gives the evaluation what it scores: the panoptic ground truth for PQ (``val_panoptic_file``,
``val_segments_dir``) and, for box and mask AP, a COCO instances file of the thing segments derived
from it (``val_ann_file`` after ``setup``: RLE masks from the PNGs, ``iscrowd`` and areas as in
``segments_info``; written to a temporary folder removed with the data module).
"""
from __future__ import annotations

import json
import shutil
import tempfile
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pycocotools import mask as mask_utils

from visiontf.data.transforms import detection as DT
from visiontf.io.panoptic_ids import read_panoptic_png
from visiontf.tasks.detection.coco_annotations import AnnotationError, load_coco_json
from visiontf.tasks.detection.coco_data import CocoDataModule
from visiontf.tasks.detection.coco_panoptic_dataset import CocoPanoptic, PanopticIndex, parse_panoptic

__all__ = ["CocoPanopticDataModule", "panoptic_to_instances"]


def panoptic_to_instances(index: PanopticIndex, segments_dir: Path) -> dict[str, Any]:
    """A COCO instances dict of the thing segments (panopticapi's ``panoptic2detection``, things only):
    one annotation per segment with its RLE mask, ``bbox``, ``area`` and ``iscrowd``; every category listed."""
    annotations = []
    for img, ann in zip(index.images, index.annotations):
        things = [s for s in ann["segments_info"] if index.is_thing[s["category_id"]]]
        if not things:
            continue
        ids = read_panoptic_png(segments_dir / ann["file_name"])
        for seg in things:
            mask = np.asfortranarray((ids == seg["id"]).astype(np.uint8))
            rle = mask_utils.encode(mask)
            area = int(mask_utils.area(rle))
            if area == 0:
                continue
            annotations.append({"id": len(annotations) + 1, "image_id": img["id"], "category_id": seg["category_id"],
                                "segmentation": {"size": [int(s) for s in rle["size"]], "counts": rle["counts"].decode("ascii")},
                                "area": area, "bbox": [float(v) for v in mask_utils.toBbox(rle)],
                                "iscrowd": int(seg.get("iscrowd", 0))})
    categories = [{"id": c, "name": n, "isthing": int(index.is_thing[c])}
                  for c, n in zip(index.category_ids, [index.class_names[index.cat_id_to_label[c]] for c in index.category_ids])]
    return {"images": [dict(im) for im in index.images], "annotations": annotations, "categories": categories}


class CocoPanopticDataModule(CocoDataModule):
    """COCO-panoptic-layout data: ``root/{train,val}2017`` images, ``root/annotations/panoptic_{train,val}2017.json``
    and their PNG folders ``root/annotations/panoptic_{train,val}2017/`` (``*_segments``; default: the JSON's
    path without ``.json``, panopticapi's convention).

    Everything else is :class:`~visiontf.tasks.detection.coco_data.CocoDataModule`'s (sizes, batches, samplers, label
    spaces; masks always on, no mosaic). ``thing_classes`` (set in ``__init__``) are the class indices of
    the categories with ``isthing`` 1: a mask model's panoptic post-processing takes them from here
    (:class:`~visiontf.tasks.detection.detection_task.DetectionTask` fills in the model's when it has none).
    """

    def __init__(
        self,
        root: str | Path,
        train_images: str = "train2017",
        val_images: str = "val2017",
        train_ann: str = "annotations/panoptic_train2017.json",
        val_ann: str = "annotations/panoptic_val2017.json",
        train_segments: str | None = None,
        val_segments: str | None = None,
        test_images: str | None = None,
        test_ann: str | None = None,
        test_segments: str | None = None,
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
    ):
        super().__init__(root, train_images, val_images, train_ann, val_ann, test_images, test_ann, batch_size, val_batch_size,
                         num_workers, scales, max_size, crop_scales, crop_size, val_size, size_divisibility, pin_memory,
                         persistent_workers, seed, scale_per_batch, aspect_ratio_groups, label_space, 0.0, True)
        self.train_panoptic_file, self.val_panoptic_file = self.train_ann_file, self.val_ann_file
        self.test_panoptic_file = self.test_ann_file
        segments = {"train": train_segments, "val": val_segments, "test": test_segments if test_ann else val_segments}
        files = {"train": self.train_ann_file, "val": self.val_ann_file, "test": self.test_ann_file}
        self.segments_dirs = {s: (self.root / d if d else files[s].with_suffix("")) for s, d in segments.items()}
        self.val_segments_dir, self.test_segments_dir = self.segments_dirs["val"], self.segments_dirs["test"]
        cat_file = self.val_ann_file if self.val_ann_file.is_file() else self.train_ann_file
        self._cat_index = parse_panoptic(load_coco_json(cat_file), cat_file, label_space)
        self.thing_classes = self._cat_index.thing_classes
        self._derived_dir: Path | None = None

    def _dataset(self, img_dir: Path, ann_file: Path, train: bool) -> CocoPanoptic:
        split = next(s for s, f in (("train", self.train_panoptic_file), ("val", self.val_panoptic_file),
                                    ("test", self.test_panoptic_file)) if f == ann_file)
        ds = CocoPanoptic(img_dir, ann_file, self.segments_dirs[split], seed=self.seed, label_space=self.label_space)
        if train:
            ds.transform = DT.build_train_transforms(self.scales, self.max_size, self.crop_scales, self.crop_size,
                                                     seed=self.seed, scale_per_batch=self.scale_per_batch)
        else:
            ds.transform = DT.build_val_transforms(self.val_size, self.max_size)
        if ds.index.category_ids != self._category_ids:
            raise AnnotationError(f"{ann_file}: category ids {ds.index.category_ids} differ from {self._category_ids} in the "
                                  "file num_classes was read from; every split must list the same categories")
        return ds

    def setup(self, stage: str | None = None) -> None:
        self.val_ann_file, self.test_ann_file = self.val_panoptic_file, self.test_panoptic_file
        super().setup(stage)
        # box and mask AP are scored on the thing segments as a COCO instances file
        for split, ds in (("val", self.val_dataset), ("test", self.test_dataset)):
            if ds is not None:
                setattr(self, f"{split}_ann_file", self._instances_file(split, ds))

    def _instances_file(self, split: str, ds: CocoPanoptic) -> Path:
        if self._derived_dir is None:
            self._derived_dir = Path(tempfile.mkdtemp(prefix="visiontf_panoptic_"))
            weakref.finalize(self, shutil.rmtree, str(self._derived_dir), True)
        path = self._derived_dir / f"instances_{split}.json"
        if not path.is_file():
            path.write_text(json.dumps(panoptic_to_instances(ds.index, ds.segments_dir)))
        return path
