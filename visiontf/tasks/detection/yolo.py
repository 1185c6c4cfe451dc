"""YOLO txt labels with a ``data.yaml`` (Ultralytics, Roboflow "YOLOv5/v8" exports) -> COCO JSON.

A small converter of our own rather than a library: ``supervision`` (MIT, well kept) converts YOLO to
COCO too, but installs PyAV (a 36 MB FFmpeg wheel), ``requests``, ``pydeprecate`` and its whole
annotation/video stack for a format that is five numbers per line. This file reads:

* ``data.yaml``: ``names`` (a list, or a ``{index: name}`` mapping), ``train`` / ``val`` / ``test``
  (a folder of images, or a list of folders) relative to ``path`` when given (itself relative to the
  YAML's folder), else to the YAML's folder. Roboflow writes ``../train/images``; when that does not
  exist, ``train/images`` beside the YAML is used, as Ultralytics' own fallback does.
* labels: for ``.../images/<name>.jpg`` the file ``.../labels/<name>.txt`` (the last ``images``
  folder of the path becomes ``labels``), one object per line: ``class cx cy w h``, normalised to
  the image's width and height (after EXIF rotation). A polygon line (``class x1 y1 x2 y2 ...``,
  segmentation exports) becomes the polygon's bounding box; with ``kpt_shape`` (pose) the first five
  values are the box. An image without a label file has no objects.

Category ids are the YOLO class indices (0..K-1), so predictions carry the same numbers as the
dataset's labels. A bad line is an :class:`~visiontf.tasks.detection.coco_annotations.AnnotationError` naming the file and line.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

from visiontf.core.saved_arguments import expands_beyond, short_repr
from visiontf.data.io import image_size
from visiontf.data.loading import IMAGE_EXTENSIONS, DatasetLayoutError
from visiontf.io.text_files import read_utf8_text
from visiontf.tasks.detection.coco_annotations import AnnotationError

log = logging.getLogger(__name__)

SPLITS = ("train", "val", "test")

__all__ = ["SPLITS", "convert_yolo", "label_file", "read_data_yaml", "yolo_split_to_coco", "yolo_cache_dir"]


def _class_name(name: Any, path: Path) -> str:
    if isinstance(name, bool) or not isinstance(name, (str, int, float)):
        raise DatasetLayoutError(f"{path}: the class name {short_repr(name)} is not a name; 'names' lists strings")
    return str(name)


def read_data_yaml(path: str | Path) -> tuple[list[str], dict[str, list[Path]], dict[str, Any]]:
    """Class names, image folders per split (``train``/``val``/``test``, those present) and the raw YAML."""
    import yaml

    path = Path(path)
    try:
        cfg = yaml.safe_load(read_utf8_text(path, DatasetLayoutError)) or {}
    except yaml.YAMLError as e:
        raise DatasetLayoutError(f"{path}: not valid YAML ({' '.join(str(e).split())})") from e
    if expands_beyond(cfg):
        # a few hundred bytes of anchors and aliases stand for billions of values once the names are copied out
        raise DatasetLayoutError(f"{path}: its anchors and aliases expand into more values than a dataset file holds; "
                                 "write the class names out")
    if not isinstance(cfg, dict) or "names" not in cfg:
        raise DatasetLayoutError(f"{path}: a YOLO data.yaml needs 'names' (the class names) and 'train'/'val' image folders")
    names = cfg["names"]
    if isinstance(names, dict):
        # an index is an integer or its digits (a JSON-style key); 1.5, ' 1' or True would name another class's row
        by_index = {int(k): v for k, v in names.items()
                    if (isinstance(k, int) and not isinstance(k, bool)) or (isinstance(k, str) and k.isdigit())}
        if len(by_index) != len(names):
            odd = [k for k in names if isinstance(k, bool) or not (isinstance(k, int) or (isinstance(k, str) and k.isdigit()))]
            raise DatasetLayoutError(f"{path}: 'names' keys must be class indices 0..K-1, got "
                                     f"{short_repr(odd[0]) if odd else 'the same index twice'} among {list(names)[:5]}")
        order = sorted(by_index)
        if order != list(range(len(order))):
            raise DatasetLayoutError(f"{path}: 'names' indices must be 0..{len(order) - 1} without gaps, got {order[:10]}")
        names = [_class_name(by_index[k], path) for k in order]
    elif isinstance(names, list):
        names = [_class_name(n, path) for n in names]
    else:
        raise DatasetLayoutError(f"{path}: 'names' must be a list or an {{index: name}} mapping")
    if not names:
        raise DatasetLayoutError(f"{path}: 'names' is empty; list the class names, one per class index 0..K-1")
    nc = cfg.get("nc")
    if nc is not None and (not isinstance(nc, int) or isinstance(nc, bool)):
        raise DatasetLayoutError(f"{path}: nc is {short_repr(nc)}, not a number of classes; write it as an integer "
                                 "(or leave it out: 'names' gives the count)")
    if nc is not None and nc != len(names):
        raise DatasetLayoutError(f"{path}: nc is {cfg['nc']} but 'names' lists {len(names)} classes")
    base = path.parent
    if cfg.get("path"):
        base = (path.parent / str(cfg["path"])).resolve() if not Path(str(cfg["path"])).is_absolute() else Path(str(cfg["path"]))
    splits: dict[str, list[Path]] = {}
    for split in SPLITS:
        value = cfg.get(split)
        if not value:
            continue
        dirs = []
        for item in value if isinstance(value, list) else [value]:
            found = _resolve_folder(str(item), base, path.parent)
            if found is None:
                raise DatasetLayoutError(f"{path}: {split} folder {item!r} not found (looked under {base})")
            if found.suffix == ".txt":
                raise DatasetLayoutError(f"{path}: {split}: image-list .txt files are not supported; point {split} at an image folder")
            dirs.append(found)
        splits[split] = dirs
    return names, splits, cfg


def _resolve_folder(item: str, base: Path, yaml_dir: Path) -> Path | None:
    p = Path(item)
    candidates = [p] if p.is_absolute() else [base / p, yaml_dir / p]
    # Roboflow's "../train/images" is relative to a folder above the YAML; Ultralytics falls back to beside it
    stripped = Path(*[part for part in p.parts if part not in ("..", ".")]) if not p.is_absolute() else None
    if stripped is not None:
        candidates += [base / stripped, yaml_dir / stripped]
    return next((c.resolve() for c in candidates if c.exists()), None)


def label_file(image: Path) -> Path:
    """The label file of an image: the last ``images`` folder in its path becomes ``labels``, suffix ``.txt``."""
    parts = list(image.parts)
    for i in range(len(parts) - 2, -1, -1):
        if parts[i] == "images":
            parts[i] = "labels"
            break
    return Path(*parts).with_suffix(".txt")


def _box(values: list[float], width: int, height: int, pose: bool, where: str) -> list[float]:
    if pose and len(values) < 4:
        raise AnnotationError(f"{where}: a pose line starts 'class cx cy w h' (then the keypoints), got {len(values) + 1} "
                              "values")
    if len(values) == 4 or pose:
        cx, cy, w, h = values[:4]
        x0, y0, x1, y1 = cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2
    elif len(values) >= 6 and len(values) % 2 == 0:  # polygon x1 y1 x2 y2 ...
        xs, ys = values[0::2], values[1::2]
        x0, y0, x1, y1 = min(xs), min(ys), max(xs), max(ys)
    else:
        raise AnnotationError(f"{where}: expected 'class cx cy w h' (or a polygon 'class x1 y1 x2 y2 ...'), "
                                f"got {len(values) + 1} values")
    if not all(-0.01 <= v <= 1.01 for v in (x0, y0, x1, y1)):
        raise AnnotationError(f"{where}: coordinates must be normalised to 0..1 (YOLO format), got {values[:4]}")
    return [x0 * width, y0 * height, (x1 - x0) * width, (y1 - y0) * height]


def yolo_split_to_coco(image_dirs: list[Path], names: list[str], pose: bool = False,
                       labelled: bool = True) -> tuple[dict[str, Any], Path]:
    """A COCO dict of the images under ``image_dirs`` (recursively) and their labels, and the folder
    its ``file_name`` entries are relative to. ``labelled``: a split none of whose images has a label file is
    refused (a misnamed ``labels`` folder would train on no object); a test split may have none."""
    images = sorted(p for d in image_dirs for p in d.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS)
    if not images:
        raise DatasetLayoutError(f"{', '.join(map(str, image_dirs))}: no images ({', '.join(IMAGE_EXTENSIONS)})")
    root = Path(os.path.commonpath([str(d) for d in image_dirs]))
    coco: dict[str, Any] = {"images": [], "annotations": [],
                            "categories": [{"id": i, "name": n} for i, n in enumerate(names)]}
    unlabelled, empty_boxes, used_labels = 0, [], set()
    for image_id, path in enumerate(images, start=1):
        width, height = image_size(path)
        coco["images"].append({"id": image_id, "file_name": path.relative_to(root).as_posix(), "width": width, "height": height})
        labels = label_file(path)
        if not labels.is_file():
            unlabelled += 1
            continue
        used_labels.add(labels.resolve())
        for n, line in enumerate(read_utf8_text(labels, AnnotationError).splitlines(), start=1):
            fields = line.split()
            if not fields:
                continue
            where = f"{labels}:{n}"
            try:
                number, values = float(fields[0]), [float(v) for v in fields[1:]]
            except ValueError as e:
                raise AnnotationError(f"{where}: not numbers: {line.strip()!r}") from e
            if not number.is_integer():
                # int() would read 1.5 as class 1 and -0.5 as class 0
                raise AnnotationError(f"{where}: class {fields[0]} is not a class index; YOLO classes are integers "
                                      f"0..{len(names) - 1}, data.yaml's names")
            cls = int(number)
            if not 0 <= cls < len(names):
                raise AnnotationError(f"{where}: class {cls} is not in data.yaml's names (0..{len(names) - 1})")
            x, y, w, h = _box(values, width, height, pose, where)
            if not (w > 0 and h > 0):
                empty_boxes.append(where)
                continue
            coco["annotations"].append({"id": len(coco["annotations"]) + 1, "image_id": image_id, "category_id": cls,
                                        "bbox": [round(v, 3) for v in (x, y, w, h)], "area": round(w * h, 3), "iscrowd": 0})
    if unlabelled == len(images) and labelled:
        raise DatasetLayoutError(
            f"{root}: none of its {len(images)} images has a label file (the first one's would be "
            f"{label_file(images[0])}); YOLO labels lie in a 'labels' folder beside 'images', one <image name>.txt per "
            "image (an empty one for an image without objects)")
    if unlabelled:
        log.info("%s: %d of %d images have no label file (no objects)", root, unlabelled, len(images))
    if empty_boxes:
        log.warning("%s: dropped %d box(es) of zero or negative width or height, e.g. %s", root, len(empty_boxes),
                    ", ".join(empty_boxes[:3]))
    _warn_of_labels_without_images(image_dirs, used_labels)
    return coco, root


def _warn_of_labels_without_images(image_dirs: list[Path], used: set[Path]) -> None:
    """Label files no image was read for (an image of another extension, a renamed or missing image): their objects
    are not trained on, so say so with a count and examples."""
    unread: list[Path] = []
    for folder in image_dirs:
        labels = label_file(folder / "x").parent
        if labels != folder and labels.is_dir():
            unread += [p for p in labels.rglob("*.txt") if p.is_file() and p.resolve() not in used and p.name != "classes.txt"]
    if unread:
        log.warning("%d label file(s) have no image and are not read, e.g. %s; images are read with the extensions %s",
                    len(unread), ", ".join(str(p) for p in sorted(unread)[:3]), " ".join(IMAGE_EXTENSIONS))


def yolo_cache_dir(data_yaml: str | Path) -> Path:
    """Where the converted COCO files of a YOLO dataset go: ``$VISIONTF_CACHE`` (default
    ``~/.cache/visiontf``) ``/yolo/<hash of the data.yaml path>``; the dataset folder is never written."""
    base = Path(os.environ.get("VISIONTF_CACHE") or Path.home() / ".cache" / "visiontf")
    key = hashlib.sha1(str(Path(data_yaml).resolve()).encode()).hexdigest()[:12]
    return base / "yolo" / key


def _write_if_changed(path: Path, text: str) -> None:
    if path.is_file() and path.read_text() == text:
        return  # unchanged: keep the file (and its time stamp) that a running job may be reading
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)  # atomic: DDP ranks converting at once never see a half-written file


def convert_yolo(data_yaml: str | Path, out_dir: str | Path | None = None) -> dict[str, tuple[Path, Path]]:
    """Convert every split of a YOLO dataset to COCO JSON in ``out_dir`` (default :func:`yolo_cache_dir`).

    Returns ``{split: (images folder, instances_<split>.json)}``, the folder being what the JSON's
    ``file_name`` entries are relative to (``CocoDataModule``'s ``*_images``).
    """
    names, splits, cfg = read_data_yaml(data_yaml)
    out = Path(out_dir) if out_dir is not None else yolo_cache_dir(data_yaml)
    result = {}
    for split, dirs in splits.items():
        coco, images_root = yolo_split_to_coco(dirs, names, pose="kpt_shape" in cfg, labelled=split != "test")
        ann = out / f"instances_{split}.json"
        _write_if_changed(ann, json.dumps(coco))
        log.info("%s: YOLO %s split (%d images, %d boxes) as COCO in %s", data_yaml, split, len(coco["images"]),
                 len(coco["annotations"]), ann)
        result[split] = (images_root, ann)
    return result
