"""The COCO detection Dataset (validated boxes through an albumentations transform) and its padding collate.

An image whose real size differs from the annotation's ``width``/``height`` (EXIF rotation, a
re-encoded copy) is used at its real size: its boxes are clipped to the real image, not the
annotated one. The first such image is named in a warning; the data module's ``teardown`` logs one
line counting them all (counted across DataLoader workers).
"""
from __future__ import annotations

import ctypes
import logging
import multiprocessing as mp
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torchvision.ops import box_convert

from visiontf.data.batching import pad_images
from visiontf.data.io import ImageReadError, read_image
from visiontf.data.loading import AugmentedDataset, EpochIndex
from visiontf.data.transforms import detection as DT
from visiontf.tasks.detection.coco_annotations import SHOW, AnnotationError, load_coco_json, parse_coco
from visiontf.tasks.detection.coco_masks import check_segmentation, decode_segmentation

# the logger of the COCO data modules, as before they were split (users' logging configs name it)
log = logging.getLogger("visiontf.tasks.detection.coco_data")
#: the images a mosaic adds to each one (a 2x2 grid)
MOSAIC_PARTNERS = 3

__all__ = ["CocoDetection", "clip_boxes", "collate_detection"]


class CocoDetection(AugmentedDataset):
    """Images and boxes of a COCO detection file.

    Args:
        img_dir: folder holding the images named by ``file_name``.
        ann_file: COCO ``instances_*.json``.
        transforms: an albumentations ``Compose`` called as ``t(image=, bboxes=, labels=, ann_index=)``
            with COCO ``xywh`` boxes and ending in a CHW tensor (see
            :mod:`visiontf.data.transforms.detection`); ``None`` only normalises.
        seed: with the data module's train sampler, each sample's augmentation is drawn from
            (seed, epoch, index); with other loaders it is mixed into a per-worker reseeding so that
            workers draw different augmentations (see :class:`~visiontf.data.loading.AugmentedDataset`).
        label_space: ``contiguous`` or ``category_id``
            (:data:`~visiontf.tasks.detection.coco_annotations.LABEL_SPACES`).
        mosaic: ``transforms`` begins with a mosaic (:func:`~visiontf.data.transforms.detection.build_train_transforms`):
            every item also reads three other images, drawn with the pipeline's seeded generator, as its
            ``mosaic_metadata`` (the pipeline decides whether to use them). ``image_id`` stays the first image's.
        masks: also each box's instance mask, decoded from its ``segmentation`` (polygons or RLE) with
            pycocotools (:mod:`visiontf.tasks.detection.coco_masks`), transformed with the image (flips, resizes,
            crops) and dropped with its box. Every trainable annotation needs one (checked here).

    Item: ``(image, target)`` with ``image`` a normalised float CHW tensor and ``target`` holding
    ``boxes`` (N, 4) normalised ``cxcywh`` relative to the transformed unpadded image, ``labels``
    int64 class indices (contiguous, or the category ids themselves: ``label_space``), ``image_id``
    int, ``orig_size`` and ``size`` tensors ``(h, w)``; with ``masks`` also ``masks`` (N, h, w) uint8 {0, 1}
    at the transformed (unpadded) size.
    """

    def __init__(
        self,
        img_dir: str | Path,
        ann_file: str | Path,
        transforms: Callable[..., dict] | None = None,
        seed: int = 0,
        label_space: str = "contiguous",
        mosaic: bool = False,
        masks: bool = False,
    ):
        self.img_dir = Path(img_dir)
        self.ann_file = Path(ann_file)
        self.mosaic = mosaic
        self.masks = masks
        if mosaic and masks:
            raise ValueError(f"{self.ann_file}: mosaic does not carry instance masks (albumentations' Mosaic takes one mask "
                             "per image); set data.init_args.mosaic: 0 to train masks")
        if not self.img_dir.is_dir():
            raise FileNotFoundError(f"{self.img_dir}: image folder not found (check the dataset root and *_images)")
        data = load_coco_json(self.ann_file)
        self.index = parse_coco(data, self.ann_file, label_space)
        if masks:
            known = {im["id"] for im in self.index.images}
            for i, ann in enumerate(data["annotations"]):
                if ann["image_id"] in known and not ann.get("iscrowd", 0):
                    check_segmentation(ann.get("segmentation"), self.ann_file, ann.get("id", f"#{i}"))
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
            names = [self.index.images[i]["file_name"] for i in found[:SHOW]]
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
        return self.index.label_names

    @property
    def cat_id_to_label(self) -> dict[int, int]:
        return self.index.cat_id_to_label

    @property
    def label_to_cat_id(self) -> dict[int, int]:
        return self.index.label_to_cat_id

    @property
    def num_classes(self) -> int:
        return len(self.index.label_names)

    def __len__(self) -> int:
        return len(self.index.images)

    def __getitem__(self, key: int | EpochIndex) -> tuple[torch.Tensor, dict[str, Any]]:
        idx = self.sample_index(key)
        image, boxes, labels, segmentations = self._load(idx)
        h, w = image.shape[:2]
        shared = self.batch_draw(key)
        extra: dict[str, Any] = {} if shared is None else {"batch_draw": shared}
        all_labels = labels  # of every image in the item: kept boxes are looked up in it by ann_index
        if self.mosaic:
            # the partners come from the pipeline's generator, seeded for this sample: the same on resume
            others, offset = [], len(boxes)
            for j in self.transform.random_generator.integers(len(self), size=MOSAIC_PARTNERS).tolist():
                o_image, o_boxes, o_labels, _ = self._load(j)
                others.append({"image": o_image, "bboxes": o_boxes, "labels": o_labels,
                               "ann_index": offset + np.arange(len(o_boxes))})
                offset += len(o_boxes)
            all_labels = np.concatenate([labels, *(o["labels"] for o in others)])
            extra["mosaic_metadata"] = others
        if self.masks:
            extra["masks"] = self._decode_masks(idx, segmentations, h, w)
        out = self.transform(image=image, bboxes=boxes, labels=labels, ann_index=np.arange(len(boxes)), **extra)
        img_t = out["image"]
        th, tw = int(img_t.shape[-2]), int(img_t.shape[-1])
        kept = np.asarray(out["ann_index"], dtype=np.int64)
        tboxes = torch.as_tensor(np.asarray(out["bboxes"], dtype=np.float32).reshape(-1, 4))
        tboxes = box_convert(tboxes, "xywh", "cxcywh") / torch.tensor([tw, th, tw, th], dtype=torch.float32)
        target = {
            "boxes": tboxes,
            # Labels are looked up by the surviving index: albumentations returns label fields as floats.
            "labels": torch.as_tensor(all_labels[kept], dtype=torch.int64),
            "image_id": int(self.index.images[idx]["id"]),
            "orig_size": torch.tensor([h, w]),
            "size": torch.tensor([th, tw]),
        }
        if self.masks:
            kept_masks = [torch.as_tensor(out["masks"][i]) for i in kept.tolist()]
            target["masks"] = (torch.stack(kept_masks).to(torch.uint8) if kept_masks
                               else torch.zeros((0, th, tw), dtype=torch.uint8))
        return img_t, target

    def _decode_masks(self, idx: int, segmentations: list, h: int, w: int) -> list[np.ndarray]:
        try:
            return [decode_segmentation(seg, h, w) for seg in segmentations]
        except ValueError as e:  # an RLE of another size than the image
            info = self.index.images[idx]
            raise AnnotationError(f"{self.ann_file}: image id {info['id']} ({info['file_name']}, {w}x{h} px): {e}; an "
                                  "RLE mask must have its image's size (fix the file's width/height or the masks)") from e

    def _load(self, idx: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, list]:
        """Image ``idx`` (HWC uint8) with its COCO ``xywh`` boxes, labels and segmentations, clipped to its real size."""
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
            segmentations = self.index.segmentations[idx] if self.masks else []
        else:  # no size in the file, or another one: the real image decides
            if annotated != (None, None):
                self._note_size_mismatch(idx, path, (w, h), annotated)
            raw = self.index.raw_boxes[idx]
            boxes, kept = clip_boxes(raw, np.arange(len(raw)), w, h)
            labels = self.index.raw_labels[idx][kept]
            segmentations = [self.index.raw_segmentations[idx][i] for i in kept.tolist()] if self.masks else []
        return image, boxes, labels, segmentations


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

