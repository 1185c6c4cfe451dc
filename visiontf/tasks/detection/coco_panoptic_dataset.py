"""The COCO panoptic format (https://cocodataset.org/#format-data, "Panoptic Segmentation"): its file,
checked, and a Dataset of images with one mask, box and label per segment.

A panoptic set is a JSON file (``images``, ``annotations`` with one entry per image: its PNG's
``file_name`` and ``segments_info`` [{``id``, ``category_id``, ``iscrowd``, ``bbox``, ``area``}],
``categories`` with ``isthing``) and a folder of PNGs whose colours are segment ids
(:mod:`visiontf.io.panoptic_ids`; id 0 is unlabelled). As facebookresearch/detr's ``CocoPanoptic`` the
Dataset gives every segment, things, stuff and crowd regions alike, as a target (mask, label, box);
boxes are each mask's pixel extent (the ``bbox`` COCO writes in ``segments_info``).
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torchvision.ops import box_convert

from visiontf.core.saved_arguments import short_repr
from visiontf.data.io import read_image
from visiontf.data.loading import AugmentedDataset, EpochIndex
from visiontf.data.transforms import detection as DT
from visiontf.io.coco_fields import panoptic_category_problem, segment_problem
from visiontf.io.image_files import outside_its_folder
from visiontf.io.panoptic_ids import VOID, read_panoptic_png
from visiontf.tasks.detection.coco_annotations import (
    FILE_NAME_FIX,
    AnnotationError,
    label_maps,
    load_coco_json,
    parse_categories,
)

log = logging.getLogger("visiontf.tasks.detection.coco_data")

__all__ = ["CocoPanoptic", "PanopticIndex", "parse_panoptic"]


@dataclass
class PanopticIndex:
    """A checked panoptic file: ``images[i]`` and its annotation ``annotations[i]`` (same order)."""

    ann_file: Path
    images: list[dict]
    annotations: list[dict]
    category_ids: list[int]
    class_names: list[str]
    is_thing: dict[int, bool]
    label_space: str = "contiguous"
    cat_id_to_label: dict[int, int] = field(default_factory=dict)

    @property
    def label_to_cat_id(self) -> dict[int, int]:
        return {label: c for c, label in self.cat_id_to_label.items()}

    @property
    def thing_classes(self) -> tuple[int, ...]:
        """The class indices of the categories with ``isthing`` 1."""
        return tuple(sorted(self.cat_id_to_label[c] for c, thing in self.is_thing.items() if thing))


def parse_panoptic(data: dict, ann_file: str | Path, label_space: str = "contiguous") -> PanopticIndex:
    """Check a loaded panoptic file (every image annotated once, known categories, ``isthing`` given)."""
    ann_file = Path(ann_file)
    category_ids, names = parse_categories(data, ann_file)
    for i, category in enumerate(data["categories"]):
        if (problem := panoptic_category_problem(category)) is not None:
            raise AnnotationError(f"{ann_file}: categories[{i}] has {problem}")
    is_thing = {c["id"]: c["isthing"] == 1 for c in data["categories"]}
    cat_to_label, class_names = label_maps(category_ids, names, label_space, ann_file)
    by_image: dict[Any, dict] = {}
    for i, ann in enumerate(data["annotations"]):
        if not isinstance(ann, dict) or any(k not in ann for k in ("image_id", "file_name", "segments_info")):
            raise AnnotationError(f"{ann_file}: annotations[{i}] needs 'image_id', 'file_name' (its PNG) and 'segments_info'")
        if (why := outside_its_folder(ann["file_name"])) is not None:
            raise AnnotationError(f"{ann_file}: annotations[{i}].file_name is {short_repr(ann['file_name'])}, {why}; "
                                  f"{FILE_NAME_FIX}")
        if not isinstance(ann["image_id"], int) or isinstance(ann["image_id"], bool):
            raise AnnotationError(f"{ann_file}: annotations[{i}] has image_id {short_repr(ann['image_id'])}; COCO image ids "
                                  "are integers")
        if ann["image_id"] in by_image:
            raise AnnotationError(f"{ann_file}: image id {ann['image_id']} has two annotations; a panoptic file has one per image")
        if not isinstance(ann["segments_info"], list):
            raise AnnotationError(f"{ann_file}: image id {ann['image_id']}: segments_info is {short_repr(ann['segments_info'])}, "
                                  "not a list of segments ([] for an image without any)")
        problem = next((p for p in map(segment_problem, ann["segments_info"]) if p is not None), None)
        if problem is not None:
            raise AnnotationError(f"{ann_file}: image id {ann['image_id']} has {problem}")
        ids = [s["id"] for s in ann["segments_info"]]
        if len(set(ids)) != len(ids):
            raise AnnotationError(f"{ann_file}: image id {ann['image_id']}: segment ids {ids[:8]} must be distinct integers "
                                  "> 0 (0 is unlabelled)")
        unknown = sorted({s.get("category_id") for s in ann["segments_info"]} - set(cat_to_label), key=str)
        if unknown:
            raise AnnotationError(f"{ann_file}: image id {ann['image_id']} has segments of category id(s) {unknown[:5]}, "
                                  f"which are not in 'categories' (ids {category_ids[:10]})")
        by_image[ann["image_id"]] = ann
    images = []
    for i, img in enumerate(data["images"]):
        if not isinstance(img, dict) or "id" not in img or "file_name" not in img:
            raise AnnotationError(f"{ann_file}: images[{i}] needs 'id' and 'file_name'")
        if (why := outside_its_folder(img["file_name"])) is not None:
            raise AnnotationError(f"{ann_file}: images[{i}].file_name is {short_repr(img['file_name'])}, {why}; "
                                  f"{FILE_NAME_FIX}")
        if img["id"] not in by_image:
            raise AnnotationError(f"{ann_file}: image id {img['id']} ({img['file_name']}) has no entry in 'annotations'; "
                                  "a panoptic file annotates every image (an image without segments has segments_info [])")
        images.append(img)
    extra = sorted(set(by_image) - {img["id"] for img in images}, key=str)
    if extra:
        raise AnnotationError(f"{ann_file}: annotations name image id(s) {extra[:5]} that are not in 'images'")
    if not images:
        raise AnnotationError(f"{ann_file}: 'images' is empty, so this split has nothing to train or evaluate on")
    return PanopticIndex(ann_file, images, [by_image[img["id"]] for img in images], category_ids, class_names, is_thing,
                         label_space, cat_to_label)


class CocoPanoptic(AugmentedDataset):
    """Images and their panoptic segments as detection targets with masks.

    Args:
        img_dir: the images (``images[i]["file_name"]``).
        ann_file: the panoptic JSON.
        segments_dir: its PNGs (``annotations[i]["file_name"]``); default: ``ann_file`` without ``.json``
            (panopticapi's convention, COCO's ``annotations/panoptic_val2017/``).
        transforms, seed, label_space: as :class:`~visiontf.tasks.detection.coco_dataset.CocoDetection`.

    Item: ``(image, target)``, target with ``boxes`` (N, 4) normalised cxcywh, ``labels``, ``masks``
    (N, h, w) uint8, ``image_id``, ``orig_size``, ``size`` (as ``CocoDetection(masks=True)``).
    """

    def __init__(self, img_dir: str | Path, ann_file: str | Path, segments_dir: str | Path | None = None,
                 transforms: Callable[..., dict] | None = None, seed: int = 0, label_space: str = "contiguous") -> None:
        self.img_dir, self.ann_file = Path(img_dir), Path(ann_file)
        self.segments_dir = Path(segments_dir) if segments_dir is not None else self.ann_file.with_suffix("")
        for folder, what in ((self.img_dir, "image folder (*_images)"), (self.segments_dir, "PNG folder (*_segments)")):
            if not folder.is_dir():
                raise FileNotFoundError(f"{folder}: panoptic {what} not found")
        self.index = parse_panoptic(load_coco_json(self.ann_file), self.ann_file, label_space)
        self.transform = transforms if transforms is not None else DT.build_normalize_transforms()
        self.seed = seed
        self.masks = True

    @property
    def class_names(self) -> list[str]:
        return self.index.class_names

    def __len__(self) -> int:
        return len(self.index.images)

    def log_size_mismatches(self) -> int:
        """Nothing to count: an image whose PNG has another size is an error (see :meth:`load`)."""
        return 0

    def load(self, idx: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[np.ndarray]]:
        """Image ``idx`` (HWC uint8), its segments' COCO ``xywh`` boxes, labels and (H, W) uint8 masks."""
        info, ann = self.index.images[idx], self.index.annotations[idx]
        image = read_image(self.img_dir / info["file_name"])
        png = self.segments_dir / ann["file_name"]
        if not png.is_file():
            raise AnnotationError(f"{png}: PNG of image id {info['id']} not found (check *_segments and 'file_name')")
        ids = read_panoptic_png(png)
        if ids.shape != image.shape[:2]:
            raise AnnotationError(f"{png}: {ids.shape[1]}x{ids.shape[0]} px, but its image {info['file_name']} is "
                                  f"{image.shape[1]}x{image.shape[0]}; a panoptic PNG has its image's size")
        unlisted = sorted(set(np.unique(ids).tolist()) - {s["id"] for s in ann["segments_info"]} - {VOID})
        if unlisted:  # its pixels would train as neither a segment nor unlabelled: a broken annotation
            raise AnnotationError(f"{png}: segment id(s) {unlisted[:5]} are painted in the PNG of image id {info['id']} "
                                  f"but not listed in its segments_info ({self.ann_file}); list them with their category, "
                                  "or paint them 0 (unlabelled)")
        boxes, labels, masks, absent = [], [], [], []
        for seg in ann["segments_info"]:
            m = ids == seg["id"]
            ys, xs = np.nonzero(m.any(1))[0], np.nonzero(m.any(0))[0]
            if not len(ys):
                absent.append(seg["id"])
                continue
            boxes.append([xs[0], ys[0], xs[-1] + 1 - xs[0], ys[-1] + 1 - ys[0]])
            labels.append(self.index.cat_id_to_label[seg["category_id"]])
            masks.append(m.astype(np.uint8))
        if absent:
            log.warning("%s: segments %s of image id %s are listed but have no pixel in %s; not trained on",
                        self.ann_file, absent[:5], info["id"], png.name)
        return (image, np.asarray(boxes, dtype=np.float32).reshape(-1, 4), np.asarray(labels, dtype=np.int64), masks)

    def __getitem__(self, key: int | EpochIndex) -> tuple[torch.Tensor, dict[str, Any]]:
        idx = self.sample_index(key)
        image, boxes, labels, masks = self.load(idx)
        h, w = image.shape[:2]
        shared = self.batch_draw(key)
        extra = {} if shared is None else {"batch_draw": shared}
        out = self.transform(image=image, bboxes=boxes, labels=labels, ann_index=np.arange(len(boxes)), masks=masks, **extra)
        img_t = out["image"]
        th, tw = int(img_t.shape[-2]), int(img_t.shape[-1])
        kept = np.asarray(out["ann_index"], dtype=np.int64)
        tboxes = torch.as_tensor(np.asarray(out["bboxes"], dtype=np.float32).reshape(-1, 4))
        tboxes = box_convert(tboxes, "xywh", "cxcywh") / torch.tensor([tw, th, tw, th], dtype=torch.float32)
        kept_masks = [torch.as_tensor(out["masks"][i]) for i in kept.tolist()]
        return img_t, {
            "boxes": tboxes,
            "labels": torch.as_tensor(labels[kept], dtype=torch.int64),
            "masks": torch.stack(kept_masks).to(torch.uint8) if kept_masks else torch.zeros((0, th, tw), dtype=torch.uint8),
            "image_id": int(self.index.images[idx]["id"]),
            "orig_size": torch.tensor([h, w]),
            "size": torch.tensor([th, tw]),
        }
