"""Reading images and masks with clear errors.

Every reader converts what it can (grayscale, RGBA, CMYK, palette, 16-bit, EXIF rotation) and
raises :class:`ImageReadError` naming the file and the fix for what it cannot (missing, empty, a
broken symbolic link, truncated, not an image, no pixels, larger than the decompression-bomb limit,
a mask stored as JPEG).

The decompression-bomb limit: Pillow has two thresholds on one global, ``PIL.Image.MAX_IMAGE_PIXELS``
(default 89,478,485): above it ``Image.open`` only *warns* (``DecompressionBombWarning``), above twice
it it *refuses* (``DecompressionBombError``). So a limit quoted from that global was off by 2x in
one direction or the other. visiontf has one limit, :data:`MAX_IMAGE_PIXELS` (178,956,970 pixels, about
13,400 x 13,400), sets Pillow's global to it, and refuses any image above 1x it (width x height), with
a message quoting it. Raise it for trusted data with :func:`set_max_image_pixels`.
"""
from __future__ import annotations

import logging
import re
import warnings
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from visiontf.core.errors import UserError
from visiontf.io.image_files import open_image

log = logging.getLogger(__name__)

#: The one decompression-bomb limit (pixels, width x height) of visiontf's readers; see the module docstring.
MAX_IMAGE_PIXELS = 178_956_970
Image.MAX_IMAGE_PIXELS = MAX_IMAGE_PIXELS


def set_max_image_pixels(limit: int | None) -> None:
    """Set the decompression-bomb limit (visiontf's and Pillow's global alike); ``None`` disables it.

    Set it in the process that reads the images: DataLoader workers started with ``fork`` (Linux's
    default) inherit it, ``spawn`` workers start from the default again.
    """
    global MAX_IMAGE_PIXELS
    MAX_IMAGE_PIXELS = limit  # type: ignore[assignment]
    Image.MAX_IMAGE_PIXELS = limit


class ImageReadError(UserError, RuntimeError):
    """An image or mask file cannot be used; the message names the file and what to do."""


def _bomb(path: Path, pixels: int | None, size: tuple[int, int] | None, limit: int) -> ImageReadError:
    shape = f"{size[0]}x{size[1]} = {pixels:,} pixels" if size and pixels else (f"{pixels:,} pixels" if pixels else "")
    return ImageReadError(
        f"{path}: image larger than the decompression-bomb limit of {limit:,} pixels{' (' + shape + ')' if shape else ''}"
        " (visiontf.data.io.MAX_IMAGE_PIXELS); downscale it, or if the file is trusted raise the limit with "
        "visiontf.data.io.set_max_image_pixels(N)"
    )


def _missing(path: Path) -> ImageReadError:
    if path.is_symlink() and not path.exists():
        return ImageReadError(f"{path}: broken symbolic link (to {path.readlink()}), to nothing or a loop of links; fix "
                              "the link or remove it")
    if path.exists():  # never opened: reading a FIFO would wait for a writer for ever
        return ImageReadError(f"{path}: not a regular file (a directory, FIFO, socket or device); move it out of the inputs")
    return ImageReadError(f"{path}: file not found")


def _open(path: str | Path) -> Image.Image:
    path = Path(path)
    if not path.is_file():
        # no dataset hint here: predicting reads user files too; datasets add their own (CocoDetection)
        raise _missing(path)
    if path.stat().st_size == 0:
        raise ImageReadError(f"{path}: file is empty (0 bytes); re-copy it or remove it from the annotations")
    limit = Image.MAX_IMAGE_PIXELS
    try:
        with warnings.catch_warnings():
            # Pillow warns between 1x and 2x its limit; visiontf refuses there itself (below)
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            img = open_image(path)
        w, h = img.size
        if limit is not None and w * h > limit:
            raise _bomb(path, w * h, (w, h), limit)
        if w == 0 or h == 0:
            raise ImageReadError(f"{path}: image of {w}x{h} pixels has no pixels; re-export it or remove it")
        img.load()
    except Image.DecompressionBombError as e:  # above 2x: Pillow refused before giving the size
        found = re.search(r"\((\d+) pixels\)", str(e))
        raise _bomb(path, int(found.group(1)) if found else None, None, limit) from e
    except UnidentifiedImageError as e:
        raise ImageReadError(f"{path}: not a readable image (wrong extension or corrupt header)") from e
    except (OSError, SyntaxError, ValueError) as e:
        raise ImageReadError(f"{path}: corrupt or truncated image ({e}); re-copy or remove it") from e
    return img


def _is_16bit_rgb_png(path: str | Path) -> bool:
    """A PNG of 16-bit RGB samples (IHDR bit depth 16, colour type 2), which Pillow reads as 8-bit by keeping
    each sample's high byte (a floor, not a rounding)."""
    with open(path, "rb") as f:
        head = f.read(26)
    return len(head) == 26 and head[:8] == b"\x89PNG\r\n\x1a\n" and head[24] == 16 and head[25] == 2


def _to_8bit(samples: np.ndarray) -> np.ndarray:
    """16-bit samples rounded to 8 bits, ``floor(x / 257 + 0.5)``, in 32-bit integers in place of float64 copies,
    which made a small, highly compressed 16-bit PNG under the pixel limit take gigabytes (docs/robustness.md)."""
    wide = samples.astype(np.uint32)
    wide *= 2
    wide += 257
    wide //= 514
    return wide.astype(np.uint8)


def read_image(path: str | Path) -> np.ndarray:
    """An RGB uint8 array (H, W, 3), upright per EXIF, from any common image file."""
    try:
        return _read_image(path)
    except MemoryError as e:
        raise ImageReadError(f"{path}: not enough memory to decode this image ({e or 'MemoryError'}); downscale it") from e


def _read_image(path: str | Path) -> np.ndarray:
    img = _open(path)
    if _is_16bit_rgb_png(path):
        import cv2

        # rounded to 8 bits (x / 257) as the restoration reader does (visiontf.tasks.restoration.restoration_files.read_rgb8),
        # so a 16-bit photo is predicted from the pixels it was evaluated on; PNG carries no EXIF rotation
        bgr = cv2.imdecode(np.fromfile(str(path), dtype=np.uint8), cv2.IMREAD_UNCHANGED)
        if bgr is not None and bgr.dtype == np.uint16 and bgr.ndim == 3 and bgr.shape[2] == 3:
            return np.ascontiguousarray(_to_8bit(bgr)[..., ::-1])
    img = ImageOps.exif_transpose(img)
    if img.mode in ("I;16", "I;16B", "I;16L", "I"):
        arr = np.asarray(img)
        if img.mode.startswith("I;16") or arr.max() > 255:  # 16-bit samples (a 32-bit "I" clipped to them)
            arr = _to_8bit(np.clip(arr, 0, 65535) if arr.dtype != np.uint16 else arr)
        else:
            arr = np.clip(arr, 0, 255).astype(np.uint8)
        return np.repeat(arr[..., None], 3, axis=2)
    if img.mode == "RGBA" or (img.mode == "P" and "transparency" in img.info) or img.mode == "LA":
        img = img.convert("RGBA")
        background = Image.new("RGBA", img.size, (0, 0, 0, 255))
        img = Image.alpha_composite(background, img)
    return np.asarray(img.convert("RGB"), dtype=np.uint8).copy()


#: folders whose JPEG masks were read on request (allow_jpeg=True), each warned about once
_JPEG_MASK_FOLDERS: set[Path] = set()


def read_mask(path: str | Path, allow_jpeg: bool = False) -> np.ndarray:
    """A label map (H, W) uint8 from a grayscale or palette PNG (palette indices are the labels).

    A mask holding JPEG data, whatever its extension, is refused: lossy compression changes label
    values along every edge, moving pixels to other (valid) classes without a trace. ``allow_jpeg``
    reads it anyway (one warning per folder), for data that has no other copy.
    """
    img = _open(path)
    if img.format in ("JPEG", "MPO"):
        path = Path(path)
        if not allow_jpeg:
            named = "" if path.suffix.lower() in (".jpg", ".jpeg") else f" although it is named {path.suffix}"
            raise ImageReadError(
                f"{path}: the mask is JPEG data{named}; JPEG's lossy compression changes labels along edges, "
                "moving pixels to other classes. Save masks as PNG (lossless), or, to read these anyway, set "
                "allow_jpeg_masks: true (data.init_args.allow_jpeg_masks)"
            )
        if path.parent not in _JPEG_MASK_FOLDERS:
            _JPEG_MASK_FOLDERS.add(path.parent)
            log.warning("%s: reading JPEG masks as asked (allow_jpeg_masks); labels along edges may be wrong", path.parent)
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
    """(width, height) after EXIF rotation, reading only the header; an image above :data:`MAX_IMAGE_PIXELS` is
    refused as :func:`read_image` refuses it."""
    path = Path(path)
    if not path.is_file():
        raise _missing(path)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with open_image(path) as img:
                w, h = img.size
                if w * h > MAX_IMAGE_PIXELS:
                    raise _bomb(path, w * h, (w, h), MAX_IMAGE_PIXELS)
                orientation = _header_orientation(img)
    except Image.DecompressionBombError as e:
        raise _bomb(path, None, None, Image.MAX_IMAGE_PIXELS) from e
    except (OSError, UnidentifiedImageError) as e:
        raise ImageReadError(f"{path}: cannot read image header ({e})") from e
    return (h, w) if orientation in (5, 6, 7, 8) else (w, h)


def _header_orientation(img: Image.Image) -> int:
    """The EXIF orientation of an opened image, from what precedes its pixel data. (A PNG's ``getexif`` decodes
    the whole image to look for an eXIf chunk after the pixels, which a decompression-bomb upload makes slow
    and large: docs/record/speed.md#measurements-behind-comments-in-the-code.)"""
    if img.format == "PNG":
        raw = img.info.get("exif")
        if not raw:
            return 1
        exif = Image.Exif()
        exif.load(raw)
        return exif.get(0x0112, 1)
    return img.getexif().get(0x0112, 1)
