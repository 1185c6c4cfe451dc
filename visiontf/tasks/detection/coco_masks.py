"""COCO instance masks: polygons, RLE and uncompressed (crowd) RLE, decoded with pycocotools' mask API.

A COCO ``segmentation`` is one of three forms (https://cocodataset.org/#format-data):

* polygons: a list of ``[x1, y1, x2, y2, ...]`` lists in pixels, each at least three points;
* uncompressed RLE: ``{"counts": [int, ...], "size": [h, w]}`` (COCO's crowd regions);
* compressed RLE: ``{"counts": "string", "size": [h, w]}`` (what pycocotools' ``encode`` writes).

:func:`check_segmentation` refuses a malformed one by its annotation id and file;
:func:`decode_segmentation` rasterises with ``pycocotools.mask`` (``frPyObjects``, ``merge``, ``decode``),
as COCOeval does, so training masks and the evaluation's agree pixel for pixel.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from pycocotools import mask as mask_utils

from visiontf.tasks.detection.coco_annotations import AnnotationError

__all__ = ["check_segmentation", "decode_segmentation", "encode_mask"]


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v)


def check_segmentation(seg: Any, ann_file: str | Path, ann_id: Any) -> None:
    """Raise :class:`AnnotationError` when ``seg`` is no COCO segmentation (see the module docstring)."""
    where = f"{ann_file}: annotation id {ann_id}"
    if seg is None:
        raise AnnotationError(f"{where} has no 'segmentation'; mask training needs every annotation's mask (polygons or "
                              "RLE): add it, or train boxes only (data.init_args.masks: false)")
    if isinstance(seg, dict):
        counts, size = seg.get("counts"), seg.get("size")
        if not (isinstance(size, (list, tuple)) and len(size) == 2 and all(isinstance(s, int) and s > 0 for s in size)):
            raise AnnotationError(f"{where}: RLE 'size' is {size!r}; expected [height, width] in pixels")
        if isinstance(counts, list):
            if not all(isinstance(c, int) and c >= 0 for c in counts) or sum(counts) != size[0] * size[1]:
                raise AnnotationError(f"{where}: uncompressed RLE 'counts' must be non-negative integers summing to "
                                      f"height x width = {size[0] * size[1]}")
        elif not isinstance(counts, (str, bytes)):
            raise AnnotationError(f"{where}: RLE 'counts' is a {type(counts).__name__}; expected a list of run lengths or "
                                  "pycocotools' compressed string")
        return
    if not isinstance(seg, list) or not seg:
        raise AnnotationError(f"{where}: 'segmentation' is {str(seg)[:60]!r}; expected polygons [[x1, y1, x2, y2, ...], ...] "
                              "or an RLE {'counts', 'size'}")
    for poly in seg:
        if not isinstance(poly, list) or len(poly) < 6 or len(poly) % 2 or not all(_number(v) for v in poly):
            raise AnnotationError(f"{where}: polygon {str(poly)[:60]} is not a list of at least 3 (x, y) points; "
                                  "fix or remove it")


def decode_segmentation(seg: Any, height: int, width: int) -> np.ndarray:
    """The (height, width) uint8 {0, 1} mask of a checked segmentation.

    Polygons are rasterised at ``height`` x ``width`` (parts outside are cut off); an RLE must have that size.
    """
    if isinstance(seg, dict):
        if list(seg["size"]) != [height, width]:
            raise ValueError(f"RLE of size {list(seg['size'])} for an image of {height} x {width}")
        rle = mask_utils.frPyObjects(seg, height, width) if isinstance(seg["counts"], list) else seg
    else:
        rle = mask_utils.merge(mask_utils.frPyObjects(seg, height, width))
    return mask_utils.decode(rle).astype(np.uint8)


def encode_mask(mask: np.ndarray) -> dict[str, Any]:
    """A (H, W) binary mask as COCO's compressed RLE ``{"size": [H, W], "counts": str}`` (JSON-ready)."""
    rle = mask_utils.encode(np.asfortranarray(np.asarray(mask, dtype=np.uint8)))
    return {"size": [int(s) for s in rle["size"]], "counts": rle["counts"].decode("ascii")}
