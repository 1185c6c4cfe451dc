"""COCO annotation files: reading, validation and a per-image index of the trainable boxes.

The bottom of the COCO data modules (numpy only; nothing here imports another visiontf data module).
The annotation file is checked once on load. Problems that make the file unusable (malformed
JSON, missing top-level keys, duplicate ids, an annotation naming an unknown category, a field of the
wrong kind or value: :mod:`visiontf.io.coco_fields`, which the evaluator shares) raise
:class:`AnnotationError` naming the file, the entry and the fix.
Problems confined to single annotations are repaired or dropped, counted, and logged in one line
per kind: annotations for unknown images (dropped), degenerate or non-finite boxes (dropped),
boxes reaching outside the image (clipped; dropped when nothing is left), crowd regions (kept in
the file for evaluation, not trained on); images left without a box to train on are kept (their
queries learn "no object") and counted. Image ids and annotations' ``image_id`` must be integers
(a string id is an error naming the entry).
"""
from __future__ import annotations

import json
import logging
import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from visiontf.core.errors import UserError
from visiontf.core.saved_arguments import short_repr
from visiontf.io.coco_fields import annotation_name, annotation_problem, category_problem, image_problem
from visiontf.io.image_files import outside_its_folder

# the logger of the COCO data modules, as before they were split (users' logging configs name it)
log = logging.getLogger("visiontf.tasks.detection.coco_data")

__all__ = ["LABEL_SPACES", "AnnotationError", "CocoIndex", "label_maps", "load_coco_json", "parse_categories", "parse_coco"]


#: How many offending ids a log line or error message lists.
SHOW = 5
#: how an annotation file's file name outside its folder is fixed
FILE_NAME_FIX = ("a dataset names its files relative to its folder, and a file elsewhere on the disk is never read: write it as a path below that folder")

#: How a class index relates to the file's category ids. ``contiguous`` numbers the sorted ids 0..K-1.
#: ``category_id`` uses the id itself (K = largest id + 1, the gaps being classes that never occur), as
#: the original DETR, Deformable DETR and DINO train on COCO: 91 outputs for ids 1..90, which is what
#: their published class heads predict.
LABEL_SPACES = ("contiguous", "category_id")
#: ``category_id`` labels above this would make a class head of mostly empty rows: refused.
MAX_CATEGORY_ID_LABEL = 4096


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
    ``xywh`` pixels, ``labels[i]`` their class indices (in ``label_space``) and ``ann_ids[i]`` their annotation ids.
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
    label_space: str = "contiguous"
    #: each trainable box's annotation ``segmentation`` as in the file (None where it has none), and those
    #: of ``raw_boxes``: decoded only by a dataset that trains masks (:mod:`visiontf.tasks.detection.coco_masks`)
    segmentations: list[list[Any]] = field(default_factory=list)
    raw_segmentations: list[list[Any]] = field(default_factory=list)

    @cached_property
    def _label_maps(self) -> tuple[dict[int, int], list[str]]:
        return label_maps(self.category_ids, self.class_names, self.label_space, self.ann_file)

    @property
    def cat_id_to_label(self) -> dict[int, int]:
        return dict(self._label_maps[0])

    @property
    def label_to_cat_id(self) -> dict[int, int]:
        return {label: c for c, label in self._label_maps[0].items()}

    @property
    def label_names(self) -> list[str]:
        """One name per class index (``N/A`` for the category-id gaps, as DETR's class list has them)."""
        return list(self._label_maps[1])


def parse_categories(data: dict, ann_file: Path) -> tuple[list[int], list[str]]:
    """Category ids sorted ascending (label i <-> ``ids[i]``) and their names."""
    cats: dict[int, str] = {}
    for i, cat in enumerate(data["categories"]):
        if not isinstance(cat, dict) or "id" not in cat:
            raise AnnotationError(f"{ann_file}: categories[{i}] has no 'id'; each category needs an integer id and a name")
        cid = cat["id"]
        if (problem := category_problem(cat)) is not None:
            raise AnnotationError(f"{ann_file}: categories[{i}] has {problem}")
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


def label_maps(category_ids: list[int], class_names: list[str], label_space: str,
               ann_file: str | Path) -> tuple[dict[int, int], list[str]]:
    """``category id -> class index`` and the name of every class index, in ``label_space`` (see
    :data:`LABEL_SPACES`)."""
    if label_space == "contiguous":
        return {c: i for i, c in enumerate(category_ids)}, list(class_names)
    if label_space != "category_id":
        raise AnnotationError(f"label_space {label_space!r}: use one of {LABEL_SPACES}")
    bad = [c for c in category_ids if not 0 <= c <= MAX_CATEGORY_ID_LABEL]
    if bad:
        raise AnnotationError(
            f"{ann_file}: category id(s) {bad[:SHOW]} cannot be class indices (label_space category_id takes ids "
            f"0..{MAX_CATEGORY_ID_LABEL}); use label_space contiguous, which numbers the categories 0..K-1"
        )
    names = ["N/A"] * (max(category_ids) + 1)
    for c, name in zip(category_ids, class_names):
        names[c] = name
    return {c: c for c in category_ids}, names


def _grouping_categories(data: dict) -> list[int]:
    """Ids of categories that only group the others: named as another category's ``supercategory`` and
    without annotations. Roboflow exports list the project itself this way, as category 0."""
    parents = {c.get("supercategory") for c in data["categories"] if isinstance(c, dict)}
    used = {a.get("category_id") for a in data["annotations"] if isinstance(a, dict) and not _unhashable(a.get("category_id"))}
    return [c["id"] for c in data["categories"]
            if isinstance(c, dict) and c.get("name") in parents and c.get("id") not in used
            and any(o.get("supercategory") == c.get("name") and o is not c for o in data["categories"] if isinstance(o, dict))]


def _unhashable(value: Any) -> bool:
    return isinstance(value, (list, dict, set))


def _log_dropped(ann_file: Path, kind: str, ids: list[Any], action: str, level: int = logging.WARNING,
                 note: str = "") -> None:
    if ids:
        log.log(level, "%s: %s %d annotation(s) with %s (e.g. annotation ids %s)%s",
                ann_file, action, len(ids), kind, ids[:SHOW], note)


def _refuse_bad_annotation_ids(annotations: list, ann_file: Path) -> None:
    """COCOeval matches by annotation id: with duplicates (merged files often have them) a ground truth
    scored against itself gives AP 0.02 instead of 1.0, silently, on pycocotools and faster-coco-eval."""
    seen: Counter = Counter()
    for i, ann in enumerate(annotations):
        if isinstance(ann, dict):
            if "id" not in ann:
                raise AnnotationError(f"{ann_file}: annotations[{i}] has no 'id'; COCO annotations need unique integer ids "
                                      "(number them 1..N)")
            seen[ann["id"]] += 1
    repeated = [(aid, n) for aid, n in seen.items() if n > 1]
    if repeated:
        shown = ", ".join(f"{aid} ({n} times)" for aid, n in repeated[:SHOW])
        raise AnnotationError(f"{ann_file}: {len(repeated)} annotation id(s) appear more than once, e.g. {shown}; COCO "
                              "evaluation matches annotations by id, so renumber them 1..N (e.g. after merging files)")


def parse_coco(data: dict, ann_file: str | Path, label_space: str = "contiguous") -> CocoIndex:
    """Validate a loaded COCO dict (see the module docstring) and index it per image, with class
    indices in ``label_space`` (see :data:`LABEL_SPACES`)."""
    ann_file = Path(ann_file)
    category_ids, class_names = parse_categories(data, ann_file)
    cat_to_label = label_maps(category_ids, class_names, label_space, ann_file)[0]

    images: list[dict] = []
    image_pos: dict[int, int] = {}
    for i, img in enumerate(data["images"]):
        if not isinstance(img, dict) or "id" not in img or "file_name" not in img:
            raise AnnotationError(f"{ann_file}: images[{i}] needs 'id' and 'file_name' (got {str(img)[:80]})")
        if (problem := image_problem(img)) is not None:
            raise AnnotationError(f"{ann_file}: images[{i}] ({short_repr(img['file_name'])}) has {problem}")
        if (why := outside_its_folder(img["file_name"])) is not None:
            raise AnnotationError(f"{ann_file}: images[{i}].file_name is {short_repr(img['file_name'])}, {why}; "
                                  f"{FILE_NAME_FIX}")
        if img["id"] in image_pos:
            raise AnnotationError(f"{ann_file}: image id {img['id']} appears twice in 'images'; ids must be unique")
        image_pos[img["id"]] = i
        images.append(img)

    _refuse_bad_annotation_ids(data["annotations"], ann_file)
    per_image: dict[int, list[tuple[list[float], int, int]]] = defaultdict(list)
    raw: dict[int, list[tuple[list[float], int]]] = defaultdict(list)
    segs: dict[int, list[Any]] = defaultdict(list)
    raw_segs: dict[int, list[Any]] = defaultdict(list)
    unknown_image, degenerate, outside, clipped, crowd = [], [], [], [], []
    for i, ann in enumerate(data["annotations"]):
        if not isinstance(ann, dict):
            raise AnnotationError(f"{ann_file}: annotations[{i}] is not an object")
        aid = ann.get("id", f"#{i}")
        for key in ("image_id", "category_id", "bbox"):
            if key not in ann:
                raise AnnotationError(f"{ann_file}: annotation id {aid} (annotations[{i}]) has no '{key}'")
        if (problem := annotation_problem(ann)) is not None:
            raise AnnotationError(f"{ann_file}: {annotation_name(ann, i)} has {problem}")
        if ann["category_id"] not in cat_to_label:
            raise AnnotationError(
                f"{ann_file}: annotation id {aid} has category_id {ann['category_id']!r}, which is not in "
                f"'categories' (ids {category_ids}); add the category or remove the annotation"
            )
        bbox = ann["bbox"]
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
        raw_segs[pos].append(ann.get("segmentation"))
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
        segs[pos].append(ann.get("segmentation"))

    _log_dropped(ann_file, "an image_id not in 'images'", unknown_image, "dropped")
    _log_dropped(ann_file, "a degenerate bbox (width or height <= 0, or not finite)", degenerate, "dropped")
    real = "; judged by the annotated width/height: an image file of another size is clipped to its real size instead"
    _log_dropped(ann_file, "a bbox entirely outside its image", outside, "dropped", note=real)
    _log_dropped(ann_file, "a bbox reaching outside its image", clipped, "clipped", logging.INFO, note=real)
    _log_dropped(ann_file, "iscrowd=1 (kept for evaluation)", crowd, "not training on", logging.INFO)
    empty = [img["id"] for pos, img in enumerate(images) if not per_image.get(pos)]
    if empty:
        # kept: every query of such an image learns "no object", as the originals train on them
        log.info("%s: %d of %d image(s) have no box to train on (no annotation, or only crowd, degenerate or outside "
                 "ones), e.g. image ids %s; kept as images without objects", ann_file, len(empty), len(images), empty[:SHOW])

    index = CocoIndex(ann_file, images, category_ids, class_names, label_space=label_space)
    for pos in range(len(images)):
        entries = per_image.get(pos, [])
        index.boxes.append(np.array([e[0] for e in entries], dtype=np.float32).reshape(-1, 4))
        index.labels.append(np.array([e[1] for e in entries], dtype=np.int64))
        index.ann_ids.append(np.array([e[2] for e in entries], dtype=np.int64))
        index.raw_boxes.append(np.array([e[0] for e in raw.get(pos, [])], dtype=np.float32).reshape(-1, 4))
        index.raw_labels.append(np.array([e[1] for e in raw.get(pos, [])], dtype=np.int64))
        index.segmentations.append(segs.get(pos, []))
        index.raw_segmentations.append(raw_segs.get(pos, []))
    index.counts = {
        "unknown_image": len(unknown_image),
        "degenerate": len(degenerate),
        "outside": len(outside),
        "clipped": len(clipped),
        "crowd": len(crowd),
        "without_boxes": len(empty),
    }
    return index

