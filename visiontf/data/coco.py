"""COCO-format detection: a validating Dataset, a padding collate and a LightningDataModule.

The annotation file is checked once on load. Problems that make the file unusable (malformed
JSON, missing top-level keys, duplicate ids, an annotation naming an unknown category, a bbox that
is not four numbers) raise :class:`AnnotationError` naming the file, the entry and the fix.
Problems confined to single annotations are repaired or dropped, counted, and logged in one line
per kind: annotations for unknown images (dropped), degenerate or non-finite boxes (dropped),
boxes reaching outside the image (clipped; dropped when nothing is left), crowd regions (kept in
the file for evaluation, not trained on). Image ids and annotations' ``image_id`` must be integers
(a string id is an error naming the entry).

An image whose real size differs from the annotation's ``width``/``height`` (EXIF rotation, a
re-encoded copy) is used at its real size: its boxes are clipped to the real image, not the
annotated one. The first such image is named in a warning; the data module's ``teardown`` logs one
line counting them all (counted across DataLoader workers).
"""
from __future__ import annotations

import ctypes
import json
import logging
import math
import multiprocessing as mp
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset
from torchvision.ops import box_convert

from visiontf.config_checks import check_config, each, non_negative_int, optional, positive_int
from visiontf.data import detection_transforms as DT
from visiontf.data.batching import pad_images
from visiontf.data.io import ImageReadError, read_image
from visiontf.data.layouts import resolve_detection_layout
from visiontf.data.loading import AugmentedDataset, EpochIndex, TrainLoader, default_num_workers, loader_kwargs
from visiontf.data.samplers import aspect_ratio_groups, eval_sampler, train_sampler
from visiontf.errors import UserError

log = logging.getLogger(__name__)

__all__ = [
    "AnnotationError",
    "CocoDataModule",
    "CocoDetection",
    "CocoIndex",
    "collate_detection",
    "load_coco_json",
    "parse_coco",
]

#: How many offending ids a log line or error message lists.
_SHOW = 5


class AnnotationError(UserError, ValueError):
    """The annotation file cannot be used as it is; the message names the file, entry and fix."""


def load_coco_json(ann_file: str | Path) -> dict:
    """Read a COCO annotation file; malformed JSON is reported with its line and column."""
    ann_file = Path(ann_file)
    if not ann_file.is_file():
        raise AnnotationError(f"{ann_file}: annotation file not found (check the dataset root and the *_ann paths)")
    try:
        with open(ann_file, encoding="utf-8") as f:
            data = json.load(f)
    except json.JSONDecodeError as e:
        raise AnnotationError(
            f"{ann_file}: malformed JSON at line {e.lineno} column {e.colno}: {e.msg}. "
            "Fix the file (e.g. `python -m json.tool FILE` shows the spot) or regenerate it."
        ) from e
    except UnicodeDecodeError as e:
        raise AnnotationError(f"{ann_file}: not UTF-8 text ({e}); COCO annotation files are UTF-8 JSON") from e
    if not isinstance(data, dict):
        raise AnnotationError(f"{ann_file}: top level is a {type(data).__name__}, expected a JSON object with "
                              "'images', 'annotations' and 'categories'")
    missing = [k for k in ("images", "annotations", "categories") if k not in data]
    if missing:
        raise AnnotationError(
            f"{ann_file}: missing top-level key(s) {missing}; a COCO detection file needs 'images', "
            "'annotations' (may be an empty list) and 'categories'"
        )
    for key in ("images", "annotations", "categories"):
        if not isinstance(data[key], list):
            raise AnnotationError(f"{ann_file}: '{key}' is a {type(data[key]).__name__}, expected a list")
    return data


@dataclass
class CocoIndex:
    """The validated content of a COCO file, in the form training needs.

    ``boxes[i]`` are the trainable (non-crowd, valid, clipped) boxes of ``images[i]`` in COCO
    ``xywh`` pixels, ``labels[i]`` their contiguous labels and ``ann_ids[i]`` their annotation ids.
    """

    ann_file: Path
    images: list[dict]
    category_ids: list[int]
    class_names: list[str]
    boxes: list[np.ndarray] = field(default_factory=list)
    labels: list[np.ndarray] = field(default_factory=list)
    ann_ids: list[np.ndarray] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    #: every valid (finite, positive-size, non-crowd) box of ``images[i]`` before clipping to the
    #: annotated size, and its label: what the real size is applied to when the sizes disagree
    raw_boxes: list[np.ndarray] = field(default_factory=list)
    raw_labels: list[np.ndarray] = field(default_factory=list)

    @property
    def cat_id_to_label(self) -> dict[int, int]:
        return {c: i for i, c in enumerate(self.category_ids)}

    @property
    def label_to_cat_id(self) -> dict[int, int]:
        return dict(enumerate(self.category_ids))


def parse_categories(data: dict, ann_file: Path) -> tuple[list[int], list[str]]:
    """Category ids sorted ascending (label i <-> ``ids[i]``) and their names."""
    cats: dict[int, str] = {}
    for i, cat in enumerate(data["categories"]):
        if not isinstance(cat, dict) or "id" not in cat:
            raise AnnotationError(f"{ann_file}: categories[{i}] has no 'id'; each category needs an integer id and a name")
        cid = cat["id"]
        if not isinstance(cid, int) or isinstance(cid, bool):
            raise AnnotationError(f"{ann_file}: categories[{i}] id {cid!r} is not an integer")
        if cid in cats:
            raise AnnotationError(f"{ann_file}: category id {cid} appears twice in 'categories'; ids must be unique")
        cats[cid] = str(cat.get("name", cid))
    if not cats:
        raise AnnotationError(f"{ann_file}: 'categories' is empty; list every class as {{'id': ..., 'name': ...}}")
    for cid in _grouping_categories(data):
        log.info("%s: category %d (%r) is only the supercategory of the others and has no annotations (as Roboflow "
                 "exports write); not a class", ann_file, cid, cats.pop(cid))
    if not cats:
        raise AnnotationError(f"{ann_file}: 'categories' lists only supercategories; list every class as {{'id': ..., 'name': ...}}")
    ids = sorted(cats)
    return ids, [cats[c] for c in ids]


def _grouping_categories(data: dict) -> list[int]:
    """Ids of categories that only group the others: named as another category's ``supercategory`` and
    without annotations. Roboflow exports list the project itself this way, as category 0."""
    parents = {c.get("supercategory") for c in data["categories"] if isinstance(c, dict)}
    used = {a.get("category_id") for a in data["annotations"] if isinstance(a, dict)}
    return [c["id"] for c in data["categories"]
            if isinstance(c, dict) and c.get("name") in parents and c.get("id") not in used
            and any(o.get("supercategory") == c.get("name") and o is not c for o in data["categories"] if isinstance(o, dict))]


def _log_dropped(ann_file: Path, kind: str, ids: list[Any], action: str, level: int = logging.WARNING,
                 note: str = "") -> None:
    if ids:
        log.log(level, "%s: %s %d annotation(s) with %s (e.g. annotation ids %s)%s",
                ann_file, action, len(ids), kind, ids[:_SHOW], note)


def parse_coco(data: dict, ann_file: str | Path) -> CocoIndex:
    """Validate a loaded COCO dict (see the module docstring) and index it per image."""
    ann_file = Path(ann_file)
    category_ids, class_names = parse_categories(data, ann_file)
    cat_to_label = {c: i for i, c in enumerate(category_ids)}

    images: list[dict] = []
    image_pos: dict[int, int] = {}
    for i, img in enumerate(data["images"]):
        if not isinstance(img, dict) or "id" not in img or "file_name" not in img:
            raise AnnotationError(f"{ann_file}: images[{i}] needs 'id' and 'file_name' (got {str(img)[:80]})")
        if not isinstance(img["id"], int) or isinstance(img["id"], bool):
            raise AnnotationError(
                f"{ann_file}: images[{i}] ({img['file_name']!r}) has id {img['id']!r}, a {type(img['id']).__name__}; "
                "COCO image ids are integers (convert them, and the annotations' image_id, to numbers)"
            )
        if img["id"] in image_pos:
            raise AnnotationError(f"{ann_file}: image id {img['id']} appears twice in 'images'; ids must be unique")
        image_pos[img["id"]] = i
        images.append(img)

    per_image: dict[int, list[tuple[list[float], int, int]]] = defaultdict(list)
    raw: dict[int, list[tuple[list[float], int]]] = defaultdict(list)
    unknown_image, degenerate, outside, clipped, crowd = [], [], [], [], []
    for i, ann in enumerate(data["annotations"]):
        if not isinstance(ann, dict):
            raise AnnotationError(f"{ann_file}: annotations[{i}] is not an object")
        aid = ann.get("id", f"#{i}")
        for key in ("image_id", "category_id", "bbox"):
            if key not in ann:
                raise AnnotationError(f"{ann_file}: annotation id {aid} (annotations[{i}]) has no '{key}'")
        if ann["category_id"] not in cat_to_label:
            raise AnnotationError(
                f"{ann_file}: annotation id {aid} has category_id {ann['category_id']!r}, which is not in "
                f"'categories' (ids {category_ids}); add the category or remove the annotation"
            )
        if not isinstance(ann["image_id"], int) or isinstance(ann["image_id"], bool):
            raise AnnotationError(
                f"{ann_file}: annotation id {aid} has image_id {ann['image_id']!r}, a {type(ann['image_id']).__name__}; "
                "COCO image ids are integers (convert them to numbers)"
            )
        bbox = ann["bbox"]
        if not isinstance(bbox, (list, tuple)) or len(bbox) != 4 or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in bbox
        ):
            raise AnnotationError(
                f"{ann_file}: annotation id {aid} has bbox {bbox!r}; expected [x, y, width, height] (4 numbers, pixels)"
            )
        pos = image_pos.get(ann["image_id"])
        if pos is None:
            unknown_image.append(aid)
            continue
        if ann.get("iscrowd", 0):
            crowd.append(aid)
            continue
        x, y, w, h = (float(v) for v in bbox)
        if not all(math.isfinite(v) for v in (x, y, w, h)) or w <= 0 or h <= 0:
            degenerate.append(aid)
            continue
        raw[pos].append(([x, y, w, h], cat_to_label[ann["category_id"]]))
        img = images[pos]
        iw, ih = img.get("width"), img.get("height")
        if iw is not None and ih is not None:
            x0, y0 = max(x, 0.0), max(y, 0.0)
            x1, y1 = min(x + w, float(iw)), min(y + h, float(ih))
            if x1 <= x0 or y1 <= y0:
                outside.append(aid)
                continue
            if (x0, y0, x1, y1) != (x, y, x + w, y + h):
                clipped.append(aid)
                x, y, w, h = x0, y0, x1 - x0, y1 - y0
        per_image[pos].append(([x, y, w, h], cat_to_label[ann["category_id"]], ann.get("id", -1)))

    _log_dropped(ann_file, "an image_id not in 'images'", unknown_image, "dropped")
    _log_dropped(ann_file, "a degenerate bbox (width or height <= 0, or not finite)", degenerate, "dropped")
    real = "; judged by the annotated width/height: an image file of another size is clipped to its real size instead"
    _log_dropped(ann_file, "a bbox entirely outside its image", outside, "dropped", note=real)
    _log_dropped(ann_file, "a bbox reaching outside its image", clipped, "clipped", logging.INFO, note=real)
    _log_dropped(ann_file, "iscrowd=1 (kept for evaluation)", crowd, "not training on", logging.INFO)

    index = CocoIndex(ann_file, images, category_ids, class_names)
    for pos in range(len(images)):
        entries = per_image.get(pos, [])
        index.boxes.append(np.array([e[0] for e in entries], dtype=np.float32).reshape(-1, 4))
        index.labels.append(np.array([e[1] for e in entries], dtype=np.int64))
        index.ann_ids.append(np.array([e[2] for e in entries], dtype=np.int64))
        index.raw_boxes.append(np.array([e[0] for e in raw.get(pos, [])], dtype=np.float32).reshape(-1, 4))
        index.raw_labels.append(np.array([e[1] for e in raw.get(pos, [])], dtype=np.int64))
    index.counts = {
        "unknown_image": len(unknown_image),
        "degenerate": len(degenerate),
        "outside": len(outside),
        "clipped": len(clipped),
        "crowd": len(crowd),
    }
    return index


class CocoDetection(AugmentedDataset):
    """Images and boxes of a COCO detection file.

    Args:
        img_dir: folder holding the images named by ``file_name``.
        ann_file: COCO ``instances_*.json``.
        transforms: an albumentations ``Compose`` called as ``t(image=, bboxes=, labels=, ann_index=)``
            with COCO ``xywh`` boxes and ending in a CHW tensor (see
            :mod:`visiontf.data.detection_transforms`); ``None`` only normalises.
        seed: with the data module's train sampler, each sample's augmentation is drawn from
            (seed, epoch, index); with other loaders it is mixed into a per-worker reseeding so that
            workers draw different augmentations (see :class:`~visiontf.data.loading.AugmentedDataset`).

    Item: ``(image, target)`` with ``image`` a normalised float CHW tensor and ``target`` holding
    ``boxes`` (N, 4) normalised ``cxcywh`` relative to the transformed unpadded image, ``labels``
    int64 contiguous, ``image_id`` int, ``orig_size`` and ``size`` tensors ``(h, w)``.
    """

    def __init__(
        self,
        img_dir: str | Path,
        ann_file: str | Path,
        transforms: Callable[..., dict] | None = None,
        seed: int = 0,
    ):
        self.img_dir = Path(img_dir)
        self.ann_file = Path(ann_file)
        if not self.img_dir.is_dir():
            raise FileNotFoundError(f"{self.img_dir}: image folder not found (check the dataset root and *_images)")
        self.index = parse_coco(load_coco_json(self.ann_file), self.ann_file)
        if not self.index.images:
            raise AnnotationError(
                f"{self.ann_file}: 'images' is empty, so this split has nothing to train or evaluate on; "
                "check the file and the *_images/*_ann paths"
            )
        self.transform = transforms if transforms is not None else DT.build_normalize_transforms()
        self.seed = seed
        # which images had another size than annotated: made here, before any DataLoader worker starts,
        # so that workers share it (inherited with fork, passed along with spawn)
        self._size_mismatch: Any = mp.Array(ctypes.c_bool, len(self.index.images), lock=True)

    def _flags(self) -> Any:
        if self._size_mismatch is None:
            self._size_mismatch = mp.Array(ctypes.c_bool, len(self.index.images), lock=True)
        return self._size_mismatch

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        from multiprocessing import context

        if context.get_spawning_popen() is None:  # pickle/deepcopy outside a worker start: nothing shared
            state["_size_mismatch"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def size_mismatches(self) -> list[int]:
        """Positions of the images loaded so far whose real size differs from their annotated width/height."""
        flags = self._flags()
        with flags.get_lock():
            return [i for i, flag in enumerate(flags) if flag]

    def _note_size_mismatch(self, idx: int, path: Path, real: tuple[int, int], annotated: tuple[Any, Any]) -> None:
        flags = self._flags()
        with flags.get_lock():
            first = not any(flags)
            flags[idx] = True
        if first:
            log.warning("%s: image is %dx%d but %s says %sx%s (image id %s); using the real size (boxes clipped to it). "
                        "Further cases are counted, not named", path, real[0], real[1], self.ann_file.name, annotated[0],
                        annotated[1], self.index.images[idx]["id"])

    def log_size_mismatches(self) -> int:
        """One line counting the images whose real size differed from the annotation (see the module docstring)."""
        found = self.size_mismatches()
        if found:
            names = [self.index.images[i]["file_name"] for i in found[:_SHOW]]
            log.warning("%s: %d image(s) whose real size differs from their annotated width/height (e.g. %s); the real "
                        "size was used. Fix width/height in the file (EXIF rotation?) to silence this",
                        self.ann_file, len(found), names)
        return len(found)

    @property
    def transforms(self) -> Callable[..., dict]:
        """The albumentations pipeline (``transform``, the name the other datasets use)."""
        return self.transform

    @property
    def class_names(self) -> list[str]:
        return list(self.index.class_names)

    @property
    def cat_id_to_label(self) -> dict[int, int]:
        return self.index.cat_id_to_label

    @property
    def label_to_cat_id(self) -> dict[int, int]:
        return self.index.label_to_cat_id

    @property
    def num_classes(self) -> int:
        return len(self.index.category_ids)

    def __len__(self) -> int:
        return len(self.index.images)

    def __getitem__(self, key: int | EpochIndex) -> tuple[torch.Tensor, dict[str, Any]]:
        idx = self.sample_index(key)
        info = self.index.images[idx]
        path = self.img_dir / info["file_name"]
        if not path.is_file() and not path.is_symlink():  # a broken link gets its own message from read_image
            raise ImageReadError(f"{path}: file not found (image id {info['id']} in "
                                 f"{self.ann_file.name}; check the dataset root, the *_images path and the file_name)")
        image = read_image(path)
        h, w = image.shape[:2]
        annotated = (info.get("width"), info.get("height"))
        if annotated == (w, h):
            boxes, labels = self.index.boxes[idx], self.index.labels[idx]
        else:  # no size in the file, or another one: the real image decides
            if annotated != (None, None):
                self._note_size_mismatch(idx, path, (w, h), annotated)
            boxes, labels = clip_boxes(self.index.raw_boxes[idx], self.index.raw_labels[idx], w, h)
        shared = self.batch_draw(key)
        extra = {} if shared is None else {"batch_draw": shared}
        out = self.transform(image=image, bboxes=boxes, labels=labels, ann_index=np.arange(len(boxes)), **extra)
        img_t = out["image"]
        th, tw = int(img_t.shape[-2]), int(img_t.shape[-1])
        kept = np.asarray(out["ann_index"], dtype=np.int64)
        tboxes = torch.as_tensor(np.asarray(out["bboxes"], dtype=np.float32).reshape(-1, 4))
        tboxes = box_convert(tboxes, "xywh", "cxcywh") / torch.tensor([tw, th, tw, th], dtype=torch.float32)
        target = {
            "boxes": tboxes,
            # Labels are looked up by the surviving index: albumentations returns label fields as floats.
            "labels": torch.as_tensor(labels[kept], dtype=torch.int64),
            "image_id": int(info["id"]),
            "orig_size": torch.tensor([h, w]),
            "size": torch.tensor([th, tw]),
        }
        return img_t, target


def clip_boxes(boxes: np.ndarray, labels: np.ndarray, width: int, height: int) -> tuple[np.ndarray, np.ndarray]:
    """COCO ``xywh`` boxes (N, 4) clipped to a ``width`` x ``height`` image; boxes left empty are dropped."""
    if len(boxes) == 0:
        return boxes, labels
    x0 = np.clip(boxes[:, 0], 0, width)
    y0 = np.clip(boxes[:, 1], 0, height)
    x1 = np.clip(boxes[:, 0] + boxes[:, 2], 0, width)
    y1 = np.clip(boxes[:, 1] + boxes[:, 3], 0, height)
    keep = (x1 > x0) & (y1 > y0)
    out = np.stack([x0, y0, x1 - x0, y1 - y0], axis=1)[keep].astype(np.float32)
    return out, labels[keep]


def collate_detection(
    batch: Sequence[tuple[torch.Tensor, dict[str, Any]]], size_divisibility: int = 0
) -> tuple[torch.Tensor, torch.Tensor, list[dict[str, Any]]]:
    """Zero-pad images bottom/right to the largest in the batch (rounded up to a multiple of
    ``size_divisibility`` when > 0).

    Returns ``(images (B,3,H,W), mask (B,H,W) bool True on padding, targets)``.
    """
    images, mask = pad_images([b[0] for b in batch], size_divisibility)
    return images, mask, [b[1] for b in batch]


class CocoDataModule(L.LightningDataModule):
    """COCO-layout detection data (``root/train2017``, ``root/annotations/instances_*.json``, ...).

    With the ``*_images`` / ``*_ann`` paths left at their defaults, ``root`` may also hold a
    Roboflow/CVAT COCO export or a YOLO dataset (``data.yaml``); see :mod:`visiontf.data.layouts`.

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
    read from the annotated image sizes. With DETR's per-image scales, a batch of 8 is about 30 %
    padding on the shapes sets; with both (2 groups) about 12 %.
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
    ):
        check_config(type(self).__name__, "data", batch_size=(batch_size, positive_int),
                     val_batch_size=(val_batch_size, optional(positive_int)),
                     num_workers=(num_workers, optional(non_negative_int)), scales=(scales, each(positive_int)),
                     max_size=(max_size, positive_int), crop_scales=(crop_scales, each(positive_int)),
                     crop_size=(crop_size, each(positive_int, 2)), val_size=(val_size, positive_int),
                     size_divisibility=(size_divisibility, non_negative_int),
                     aspect_ratio_groups=(aspect_ratio_groups, non_negative_int))
        super().__init__()
        self.save_hyperparameters()
        self.root = Path(root)
        # the standard COCO paths, or a Roboflow/CVAT export or a YOLO set found under root (visiontf.data.layouts)
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

        # Categories only (the full train file can be large): the smaller val file normally has them.
        cat_file = self.val_ann_file if self.val_ann_file.is_file() else self.train_ann_file
        self._category_ids, self.class_names = parse_categories(load_coco_json(cat_file), cat_file)
        self.num_classes = len(self._category_ids)
        self.label_to_cat_id = dict(enumerate(self._category_ids))
        self.cat_id_to_label = {c: i for i, c in enumerate(self._category_ids)}
        shown = ", ".join(f"{n} (id {c})" for c, n in list(zip(self._category_ids, self.class_names))[:10])
        log.info("%d classes from %s: %s%s", self.num_classes, cat_file, shown, ", ..." if self.num_classes > 10 else "")
        self.train_dataset: CocoDetection | None = None
        self.val_dataset: CocoDetection | None = None
        self.test_dataset: CocoDetection | None = None

    def eval_cfg(self) -> dict[str, Any]:
        """The eval transform's settings in ``pretrained_cfg`` keys; tasks save them with checkpoints so
        that a Predictor preprocesses as validation did."""
        return {"min_size": int(self.val_size), "max_size": int(self.max_size), "mean": tuple(DT.IMAGENET_MEAN),
                "std": tuple(DT.IMAGENET_STD)}

    def _dataset(self, img_dir: Path, ann_file: Path, train: bool) -> CocoDetection:
        if train:
            tf = DT.build_train_transforms(self.scales, self.max_size, self.crop_scales, self.crop_size, seed=self.seed,
                                           scale_per_batch=self.scale_per_batch)
        else:
            tf = DT.build_val_transforms(self.val_size, self.max_size)
        ds = CocoDetection(img_dir, ann_file, tf, seed=self.seed)
        if ds.index.category_ids != self._category_ids:
            raise AnnotationError(
                f"{ann_file}: category ids {ds.index.category_ids} differ from {self._category_ids} in the file "
                "num_classes was read from; every split must list the same categories"
            )
        return ds

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
        if shuffle:
            sampler = train_sampler(ds, self.trainer, self.seed, **self._batch_layout(ds, batch_size))
        else:
            sampler = eval_sampler(ds, self.trainer)
        loader = TrainLoader if shuffle else DataLoader
        return loader(ds, batch_size=batch_size, sampler=sampler,
                      collate_fn=partial(collate_detection, size_divisibility=self.size_divisibility),
                      **loader_kwargs(self.num_workers, self.seed, self.pin_memory, self.persistent_workers))

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
