"""COCO panoptic PNGs: each pixel's segment id stored as a colour, ``id = R + 256 G + 256^2 B``.

panopticapi's ``id2rgb``/``rgb2id`` (cocodataset/panopticapi ``panopticapi/utils.py``), and reading and
writing such PNGs. numpy and Pillow only, so that data, evaluation and post-processing share them.
"""
from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image

from visiontf.core.errors import UserError
from visiontf.io.image_files import open_image

__all__ = ["VOID", "PanopticPngError", "id2rgb", "png_bytes", "read_panoptic_png", "rgb2id"]

#: the id of unlabelled pixels (COCO panoptic's VOID): never a segment, in the ground truth or a prediction
VOID = 0


def id2rgb(ids: np.ndarray) -> np.ndarray:
    """(H, W) integer ids -> (H, W, 3) uint8 colours."""
    ids = np.asarray(ids).astype(np.int64)
    return np.stack([(ids >> (8 * c)) & 255 for c in range(3)], axis=-1).astype(np.uint8)


def rgb2id(rgb: np.ndarray) -> np.ndarray:
    """(H, W, 3) colours -> (H, W) int64 ids (panopticapi returns int32 for uint8 input: the same values)."""
    rgb = np.asarray(rgb).astype(np.int64)
    return rgb[..., 0] + 256 * rgb[..., 1] + 256 * 256 * rgb[..., 2]


class PanopticPngError(UserError, ValueError):
    """A panoptic PNG whose pixels are not segment ids as colours; the message names the file and the fix."""


def read_panoptic_png(path: str | Path) -> np.ndarray:
    """The (H, W) int64 segment ids of a panoptic PNG: RGB, or what holds the same colours exactly (a palette image,
    which image tools write for few colours, or RGBA whose alpha is opaque everywhere)."""
    with open_image(path) as img:
        if img.mode == "P":
            img = img.convert("RGBA") if "transparency" in img.info else img.convert("RGB")
        if img.mode == "RGBA":
            pixels = np.asarray(img)
            if (pixels[..., 3] != 255).any():
                raise PanopticPngError(f"{path}: a panoptic PNG with transparent pixels; its colours are segment ids "
                                       "(id = R + 256 G + 256^2 B, 0 unlabelled): save it as RGB")
            return rgb2id(pixels[..., :3])
        if img.mode != "RGB":
            raise PanopticPngError(f"{path}: a panoptic PNG is RGB (id = R + 256 G + 256^2 B), this one is {img.mode}; "
                                   "save the segment ids as colours")
        return rgb2id(np.asarray(img))


def png_bytes(ids: np.ndarray) -> bytes:
    """The PNG file of (H, W) segment ids."""
    with io.BytesIO() as buf:
        Image.fromarray(id2rgb(ids)).save(buf, format="PNG")
        return buf.getvalue()
