"""Reading images and masks with clear errors.

Every reader converts what it can (grayscale, RGBA, CMYK, palette, 16-bit, EXIF rotation) and
raises :class:`ImageReadError` naming the file and the fix for what it cannot (missing, empty,
truncated, not an image, larger than the decompression-bomb limit).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from visiontf.errors import UserError

#: Pillow's own default (about 89 M pixels) guards against decompression bombs; keep it explicit.
MAX_IMAGE_PIXELS = 178_956_970
Image.MAX_IMAGE_PIXELS = MAX_IMAGE_PIXELS


class ImageReadError(UserError, RuntimeError):
    """An image or mask file cannot be used; the message names the file and what to do."""


def _open(path: str | Path) -> Image.Image:
    path = Path(path)
    if not path.is_file():
        # no dataset hint here: predicting reads user files too; datasets add their own (CocoDetection)
        raise ImageReadError(f"{path}: file not found")
    if path.stat().st_size == 0:
        raise ImageReadError(f"{path}: file is empty (0 bytes); re-copy it or remove it from the annotations")
    try:
        img = Image.open(path)
        img.load()
    except Image.DecompressionBombError as e:
        raise ImageReadError(
            f"{path}: image larger than the decompression-bomb limit of {MAX_IMAGE_PIXELS} pixels ({e}); "
            "downscale it, or raise visiontf.data.io.MAX_IMAGE_PIXELS and PIL.Image.MAX_IMAGE_PIXELS if it is trusted"
        ) from e
    except UnidentifiedImageError as e:
        raise ImageReadError(f"{path}: not a readable image (wrong extension or corrupt header)") from e
    except (OSError, SyntaxError, ValueError) as e:
        raise ImageReadError(f"{path}: corrupt or truncated image ({e}); re-copy or remove it") from e
    return img


def read_image(path: str | Path) -> np.ndarray:
    """An RGB uint8 array (H, W, 3), upright per EXIF, from any common image file."""
    img = _open(path)
    img = ImageOps.exif_transpose(img)
    if img.mode in ("I;16", "I;16B", "I;16L", "I"):
        arr = np.asarray(img, dtype=np.float64)
        peak = 65535.0 if img.mode.startswith("I;16") or arr.max() > 255 else 255.0
        arr = np.clip(arr / peak * 255.0 + 0.5, 0, 255).astype(np.uint8)
        return np.repeat(arr[..., None], 3, axis=2)
    if img.mode == "RGBA" or (img.mode == "P" and "transparency" in img.info) or img.mode == "LA":
        img = img.convert("RGBA")
        background = Image.new("RGBA", img.size, (0, 0, 0, 255))
        img = Image.alpha_composite(background, img)
    return np.asarray(img.convert("RGB"), dtype=np.uint8).copy()


def read_mask(path: str | Path) -> np.ndarray:
    """A label map (H, W) uint8 from a grayscale or palette PNG (palette indices are the labels)."""
    img = _open(path)
    if img.mode == "P" or img.mode == "L":
        return np.asarray(img, dtype=np.uint8).copy()
    if img.mode in ("I;16", "I", "I;16B", "I;16L"):
        arr = np.asarray(img)
        if arr.max() > 255:
            raise ImageReadError(f"{path}: 16-bit mask with label {int(arr.max())} > 255; visiontf masks hold labels 0..255")
        return arr.astype(np.uint8)
    if img.mode in ("RGB", "RGBA"):
        arr = np.asarray(img.convert("RGB"))
        if np.array_equal(arr[..., 0], arr[..., 1]) and np.array_equal(arr[..., 0], arr[..., 2]):
            return arr[..., 0].copy()
        raise ImageReadError(
            f"{path}: colour (RGB) mask; labels must be grayscale or palette indices. "
            "Convert colours to class ids first (e.g. with the dataset's palette)."
        )
    raise ImageReadError(f"{path}: unsupported mask mode {img.mode!r}; save masks as 8-bit grayscale or palette PNG")


def image_size(path: str | Path) -> tuple[int, int]:
    """(width, height) after EXIF rotation, reading only the header."""
    path = Path(path)
    try:
        with Image.open(path) as img:
            w, h = img.size
            orientation = img.getexif().get(0x0112, 1)
    except (OSError, UnidentifiedImageError) as e:
        raise ImageReadError(f"{path}: cannot read image header ({e})") from e
    return (h, w) if orientation in (5, 6, 7, 8) else (w, h)
