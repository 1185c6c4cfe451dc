"""Where a detection dataset's images and annotation files are, for the layouts users bring.

:class:`~visiontf.tasks.detection.coco_data.CocoDataModule` calls :func:`resolve_detection_layout` when its
``*_images`` / ``*_ann`` paths are left at their defaults, so ``--data.root DIR`` alone works for:

* **COCO** (the defaults): ``train2017/``, ``val2017/``, ``annotations/instances_{train,val}2017.json``;
* **Roboflow / CVAT COCO exports**: ``train/_annotations.coco.json`` beside the images, ``valid/``
  (Roboflow) or ``val/`` likewise, optionally ``test/``;
* **CVAT "COCO 1.0"**: ``annotations/instances_<subset>.json`` with images in ``images/<subset>/``
  (or ``images/``), subsets ``train``/``Train`` and ``val``/``valid``/``validation``/``Validation``;
* **YOLO**: ``data.yaml`` with txt labels, converted to COCO JSON by :mod:`visiontf.tasks.detection.yolo`.

Anything else needs the paths set explicitly; a root that matches nothing is a
:class:`~visiontf.data.loading.DatasetLayoutError` listing what was looked for.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from visiontf.data.loading import DatasetLayoutError
from visiontf.tasks.detection.yolo import convert_yolo

log = logging.getLogger(__name__)

#: CocoDataModule's defaults: the standard COCO layout
COCO_DEFAULTS = {"train_images": "train2017", "val_images": "val2017", "train_ann": "annotations/instances_train2017.json",
                 "val_ann": "annotations/instances_val2017.json", "test_images": None, "test_ann": None}
ROBOFLOW_ANN = "_annotations.coco.json"
_SPLIT_NAMES = {"train": ("train", "Train", "training"), "val": ("valid", "val", "validation", "Validation", "Val"),
                "test": ("test", "Test")}

__all__ = ["COCO_DEFAULTS", "DetectionPaths", "resolve_detection_layout"]


@dataclass(frozen=True)
class DetectionPaths:
    """Image folders and annotation files of each split; ``layout`` names what was found."""

    layout: str
    train_images: Path
    train_ann: Path
    val_images: Path
    val_ann: Path
    test_images: Path
    test_ann: Path


def _coco(root: Path, p: dict[str, str | None]) -> DetectionPaths:
    return DetectionPaths("coco", root / p["train_images"], root / p["train_ann"], root / p["val_images"], root / p["val_ann"],
                          root / (p["test_images"] or p["val_images"]), root / (p["test_ann"] or p["val_ann"]))


def _first(root: Path, split: str, exists) -> str | None:
    return next((name for name in _SPLIT_NAMES[split] if exists(name)), None)


def _roboflow(root: Path) -> DetectionPaths | None:
    has = lambda name: (root / name / ROBOFLOW_ANN).is_file()  # noqa: E731
    train, val = _first(root, "train", has), _first(root, "val", has)
    if train is None:
        return None
    if val is None:
        raise DatasetLayoutError(f"{root}: a COCO export with {train}/{ROBOFLOW_ANN} but no valid/ or val/ split; export "
                                 f"a validation split, or set --data.init_args.val_images and val_ann")
    test = _first(root, "test", has) or val
    return DetectionPaths("roboflow", root / train, root / train / ROBOFLOW_ANN, root / val, root / val / ROBOFLOW_ANN,
                          root / test, root / test / ROBOFLOW_ANN)


def _cvat(root: Path) -> DetectionPaths | None:
    ann = lambda name: root / "annotations" / f"instances_{name}.json"  # noqa: E731
    train, val = _first(root, "train", lambda n: ann(n).is_file()), _first(root, "val", lambda n: ann(n).is_file())
    if train is None or val is None:
        return None
    test = _first(root, "test", lambda n: ann(n).is_file()) or val
    images = lambda name: root / "images" / name if (root / "images" / name).is_dir() else root / "images"  # noqa: E731
    return DetectionPaths("cvat", images(train), ann(train), images(val), ann(val), images(test), ann(test))


def _yolo(root: Path) -> DetectionPaths | None:
    data_yaml = next((root / n for n in ("data.yaml", "data.yml", "dataset.yaml") if (root / n).is_file()), None)
    if data_yaml is None:
        return None
    splits = convert_yolo(data_yaml)
    if "train" not in splits or "val" not in splits:
        raise DatasetLayoutError(f"{data_yaml}: needs both 'train' and 'val' image folders (has {sorted(splits)})")
    test = splits.get("test", splits["val"])
    return DetectionPaths("yolo", *splits["train"], *splits["val"], *test)


def resolve_detection_layout(root: str | Path, **paths: str | None) -> DetectionPaths:
    """The image folders and annotation files under ``root`` (see the module docstring).

    ``paths``: CocoDataModule's ``train_images``, ``val_images``, ``train_ann``, ``val_ann``,
    ``test_images``, ``test_ann``; when any differs from :data:`COCO_DEFAULTS` they are used as given.
    """
    root = Path(root)
    p = {**COCO_DEFAULTS, **paths}
    if not root.is_dir():
        raise DatasetLayoutError(f"{root}: dataset root not found (--data.root)")
    if p != COCO_DEFAULTS or (root / p["train_ann"]).is_file() or (root / p["val_ann"]).is_file():
        return _coco(root, p)
    for detect in (_roboflow, _cvat, _yolo):
        found = detect(root)
        if found is not None:
            log.info("%s: %s layout (train %s, val %s)", root, found.layout, found.train_ann, found.val_ann)
            return found
    raise DatasetLayoutError(
        f"{root}: no detection dataset found: looked for COCO ({p['train_ann']}), a Roboflow/CVAT export "
        f"(train/{ROBOFLOW_ANN}, annotations/instances_train.json) and YOLO (data.yaml); for another layout set "
        "--data.init_args.train_images, train_ann, val_images and val_ann"
    )
