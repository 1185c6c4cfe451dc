"""Finding and reading restoration images: the SR benchmark layouts, paired folders, clean folders.

Layouts (``layout="auto"`` picks the first that fits the split's folder):

* ``benchmark``: ``HR/`` + ``LR_bicubic/X{s}/`` (EDSR's ``benchmark.tar``: Set5, Set14, B100,
  Urban100; ``babyx2.png`` beside ``baby.png``), or ``original/`` + ``LRbicx{s}/`` (the other
  common distribution of Set5/Set14: same names in both folders);
* ``div2k``: ``DIV2K_{split}_HR/`` + ``DIV2K_{split}_LR_bicubic/X{s}/`` (``0801x2.png``), split
  ``train`` or ``valid``;
* ``srf``: ``image_SRF_{s}/`` with ``*_HR.png`` and ``*_LR.png`` (the SelfExSR distribution);
* ``paired``: ``lq_dir`` + ``gt_dir`` with matching names (deraining sets such as Rain100L:
  ``rain/rain-001.png`` with ``norain/norain-001.png``);
* ``clean``: any folder of clean images; every degradation is made on the fly.

Reading (:func:`read_rgb8`): 8-bit RGB is used as it is; grayscale and palette images are
converted to RGB, an alpha channel is dropped, 16-bit images are rounded to 8 bits (``x / 257``),
and each conversion is counted and logged once per kind by the dataset. A file that cannot be
decoded is an :class:`ImageReadError` naming it (``strict=False`` skips it at the scan, counted).
"""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from visiontf.core.errors import UserError
from visiontf.data.loading import IMAGE_EXTENSIONS, DatasetLayoutError

log = logging.getLogger(__name__)

LAYOUTS = ("auto", "benchmark", "div2k", "srf", "paired", "clean")


class ImageReadError(UserError, ValueError):
    """An image file that cannot be decoded (corrupt, truncated, not an image)."""


@dataclass
class ImageRecord:
    """One clean image and, per scale, its low-resolution file when the dataset ships one."""

    hr: Path
    lq: dict[str, Path] = field(default_factory=dict)  # task name -> file
    size: tuple[int, int] = (0, 0)  # (H, W) of hr
    mode: str = "RGB"


def list_images(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS)


def conversion_of(mode: str, rawmode: str = "") -> str | None:
    """What :func:`read_rgb8` will do to an image of this PIL ``mode`` (None: nothing)."""
    if ";16" in rawmode or mode.startswith("I"):
        return "16-bit rounded to 8 bits"
    if mode in ("L", "1", "P", "LA", "PA"):
        return "grayscale/palette converted to RGB"
    if mode == "RGBA":
        return "alpha channel dropped"
    if mode == "CMYK":
        return "CMYK converted to RGB"
    return None


def probe(path: Path) -> tuple[tuple[int, int], str, str | None]:
    """(H, W), PIL mode and conversion of an image from its header; ImageReadError when unreadable."""
    from PIL import UnidentifiedImageError

    from visiontf.io.image_files import open_image

    try:
        with open_image(path) as im:
            rawmode = str(im.tile[0][3]) if im.tile else ""
            im.verify() if path.suffix.lower() == ".png" else None  # PNG: CRCs of every chunk
            return (im.height, im.width), im.mode, conversion_of(im.mode, rawmode)
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as e:
        raise ImageReadError(f"{path}: not a readable image ({type(e).__name__}: {e})") from e


def read_rgb8(path: Path) -> np.ndarray:
    """(H, W, 3) uint8 RGB of any image file (see the module docstring for the conversions)."""
    import cv2

    data = np.fromfile(str(path), dtype=np.uint8)
    if data[:2].tobytes() == b"\xff\xd8":  # a JPEG: CMYK ones get Pillow's conversion, as every other reader's

        from visiontf.io.image_files import open_image

        try:
            with open_image(path) as im:
                if im.mode == "CMYK":
                    return np.asarray(im.convert("RGB")).copy()
        except Exception as e:  # noqa: BLE001 - every decoder failure is the same user-facing problem
            raise ImageReadError(f"{path}: cannot decode the image ({type(e).__name__}: {e})") from e
    img = cv2.imdecode(data, cv2.IMREAD_UNCHANGED) if data.size else None
    if img is None:  # GIF, or a file OpenCV cannot decode: PIL
        from visiontf.io.image_files import open_image

        try:
            with open_image(path) as im:
                return np.asarray(im.convert("RGB"))
        except Exception as e:  # noqa: BLE001 - every decoder failure is the same user-facing problem
            raise ImageReadError(f"{path}: cannot decode the image ({type(e).__name__}: {e})") from e
    if img.dtype == np.uint16:
        img = np.clip(np.floor(img.astype(np.float64) / 257 + 0.5), 0, 255).astype(np.uint8)
    elif img.dtype != np.uint8:
        raise ImageReadError(f"{path}: {img.dtype} pixels; visiontf reads 8- and 16-bit images")
    if img.ndim == 2:
        img = np.repeat(img[:, :, None], 3, axis=2)
    elif img.shape[2] == 4:
        img = cv2.cvtColor(img, cv2.COLOR_BGRA2RGB)
    elif img.shape[2] == 3:
        img = cv2.cvtColor(img, cv2.COLOR_BGR2RGB)
    else:
        img = np.repeat(img[:, :, :1], 3, axis=2)
    return np.ascontiguousarray(img)


def _stem_key(path: Path) -> str:
    """A name both files of a pair share: ``babyx2`` -> ``baby``, ``img_001_SRF_2_LR`` -> ``img_001_SRF_2``,
    ``norain-001`` / ``rain-001`` -> ``001``."""
    stem = path.stem
    stem = re.sub(r"x\d$", "", stem)
    stem = re.sub(r"_(HR|LR)$", "", stem)
    return re.sub(r"^(no)?rain[-_]?", "", stem)


def _pair(hr_dir: Path, lq_dir: Path, task: str) -> list[ImageRecord]:
    if not lq_dir.is_dir():
        raise DatasetLayoutError(f"{lq_dir}: folder not found (the low-quality images of {hr_dir} for {task})")
    lq = {_stem_key(p): p for p in list_images(lq_dir)}
    records, missing = [], []
    for p in list_images(hr_dir):
        key = _stem_key(p)
        if key in lq:
            records.append(ImageRecord(p, {task: lq[key]}))
        else:
            missing.append(p.name)
    if missing:
        raise DatasetLayoutError(f"{lq_dir}: no low-quality image for {len(missing)} of the images in {hr_dir} "
                                 f"(e.g. {missing[0]}); the names must match (babyx2.png for baby.png)")
    return records


def detect_layout(folder: Path, split: str) -> str:
    if (folder / "HR").is_dir() or (folder / "original").is_dir():
        return "benchmark"
    if any(folder.glob(f"DIV2K_{split}_HR")):
        return "div2k"
    if any(folder.glob("image_SRF_*")):
        return "srf"
    return "clean"


def find_records(folder: Path, split: str, tasks: list[str], layout: str = "auto",
                 lq_dir: str | None = None, gt_dir: str | None = None) -> tuple[list[ImageRecord], str]:
    """The images of ``folder`` with the low-quality file of every task whose files exist, and the layout."""
    if not folder.is_dir():
        raise DatasetLayoutError(f"{folder}: folder not found")
    if layout == "auto":
        layout = "paired" if lq_dir else detect_layout(folder, split)
    if layout == "clean":
        records = [ImageRecord(p) for p in list_images(folder)]
    elif layout == "paired":
        if not (lq_dir and gt_dir):
            raise DatasetLayoutError("layout 'paired' needs lq_dir and gt_dir (e.g. lq_dir: rain, gt_dir: norain)")
        records = _pair(folder / gt_dir, folder / lq_dir, tasks[0])
    else:
        sr = [t for t in tasks if re.fullmatch(r"sr_x\d", t)]
        if len(sr) != len(tasks) or len(sr) != 1:
            raise DatasetLayoutError(f"layout {layout!r} holds bicubic SR pairs: give one task sr_xN, not {tasks}")
        s = int(sr[0][-1])
        if layout == "benchmark":
            hr = folder / "HR" if (folder / "HR").is_dir() else folder / "original"
            lq = folder / "LR_bicubic" / f"X{s}" if hr.name == "HR" else folder / f"LRbicx{s}"
            records = _pair(hr, lq, sr[0])
        elif layout == "div2k":
            records = _pair(folder / f"DIV2K_{split}_HR", folder / f"DIV2K_{split}_LR_bicubic" / f"X{s}", sr[0])
        else:  # srf
            d = folder / f"image_SRF_{s}"
            files = list_images(d) if d.is_dir() else []
            records = [ImageRecord(p, {sr[0]: p.with_name(p.name.replace("_HR.", "_LR."))})
                       for p in files if p.stem.endswith("_HR")]
            if not records:
                raise DatasetLayoutError(f"{d}: no *_HR.png / *_LR.png pairs")
    if not records:
        raise DatasetLayoutError(f"{folder}: no images ({', '.join(IMAGE_EXTENSIONS)})")
    return records, layout


__all__ = ["ImageReadError", "ImageRecord", "LAYOUTS", "conversion_of", "detect_layout", "find_records", "list_images",
           "probe", "read_rgb8"]
