"""A tiny COCO-panoptic dataset: coloured shapes (things) in front of sky and ground (stuff).

Every pixel belongs to one segment: a shape's visible pixels (its category, ``isthing`` 1), or the
sky or the ground around them (stuff, ``isthing`` 0; the horizon between them is a random wave). Laid
out as COCO panoptic: ``{train,val}2017/*.jpg``, ``annotations/panoptic_{train,val}2017.json`` and the
PNGs in ``annotations/panoptic_{train,val}2017/`` (segment ids as colours, :mod:`visiontf.io.panoptic_ids`);
plus ``annotations/instances_{train,val}2017.json``, the shapes as a COCO instances file with their
exact RLE masks, so the same set also trains and scores instance masks with ``CocoDataModule(masks=True)``.
Deterministic for a seed.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw
from pycocotools import mask as mask_utils

from visiontf.io.panoptic_ids import id2rgb
from visiontf.tasks.detection.detection_synthetic import _CLASS_COLOURS, CATEGORIES, _painted_pixels, _polygon

#: the stuff categories (ids after the shapes' 1, 2, 3, 5) and the base colour of each
STUFF = ((10, "sky", (120, 170, 230)), (11, "ground", (140, 110, 70)))

__all__ = ["STUFF", "make_panoptic_dataset"]


def _texture(rng: np.random.Generator, h: int, w: int, base: tuple[int, int, int]) -> np.ndarray:
    """A base colour with a smooth variation and pixel noise (int16, (h, w, 3))."""
    coarse = np.clip(np.array(base)[None, None] + rng.integers(-35, 36, size=(3, 4, 3)), 0, 255).astype(np.uint8)
    field = np.asarray(Image.fromarray(coarse).resize((w, h), Image.BILINEAR), dtype=np.int16)
    return field + rng.integers(-20, 21, size=(h, w, 3), dtype=np.int16)


def _scene(rng: np.random.Generator, h: int, w: int, categories, object_size, max_objects: int, empty: bool):
    """One image, its (h, w) segment ids and ``segments_info`` (ids 1..n: shapes, then sky, ground)."""
    horizon = h * rng.uniform(0.3, 0.7) + h * 0.08 * np.sin(np.arange(w) / w * 2 * math.pi * rng.uniform(0.5, 2.0)
                                                             + rng.uniform(0, 2 * math.pi))
    sky = np.arange(h)[:, None] < horizon[None, :]
    pixels = np.where(sky[..., None], _texture(rng, h, w, STUFF[0][2]), _texture(rng, h, w, STUFF[1][2]))
    img = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(img)
    ids = np.where(sky, -1, -2)  # stuff for now; shapes paint over it
    shapes = []
    for _ in range(0 if empty else int(rng.integers(1, max_objects + 1))):
        cat_id, kind = categories[int(rng.integers(len(categories)))]
        lo, hi = object_size[0] * min(h, w), object_size[1] * min(h, w)
        r = float(np.exp(rng.uniform(np.log(lo), np.log(hi))))
        cx, cy = float(rng.uniform(r + 1, w - r - 1)), float(rng.uniform(r + 1, h - r - 1))
        poly = _polygon(kind, cx, cy, r, float(rng.uniform(0, 2 * math.pi)))
        base = _CLASS_COLOURS[[c for c, _ in categories].index(cat_id) % len(_CLASS_COLOURS)]
        colour = tuple(int(np.clip(c + rng.integers(-30, 31), 0, 255)) for c in base)
        draw.polygon(poly, fill=colour, outline=(0, 0, 0))
        ids[_painted_pixels(poly, h, w)] = len(shapes)
        shapes.append(cat_id)
    segments, out = [], np.zeros((h, w), dtype=np.int64)
    for label, cat_id in [(k, c) for k, c in enumerate(shapes)] + [(-1, STUFF[0][0]), (-2, STUFF[1][0])]:
        mask = ids == label
        if not mask.any():  # a shape painted over by later ones, or a stuff region shapes cover
            continue
        seg_id = len(segments) + 1
        out[mask] = seg_id
        rle = mask_utils.encode(np.asfortranarray(mask.astype(np.uint8)))
        segments.append({"id": seg_id, "category_id": int(cat_id), "iscrowd": 0, "area": int(mask.sum()),
                         "bbox": [float(v) for v in mask_utils.toBbox(rle)], "rle": rle})
    return img, out, segments


def _make_split(rng, root: Path, split: str, num_images: int, first_id: int, ann_id: int, image_size, categories,
                object_size, max_objects) -> tuple[dict, dict, int]:
    img_dir, png_dir = root / f"{split}2017", root / "annotations" / f"panoptic_{split}2017"
    img_dir.mkdir(parents=True, exist_ok=True)
    png_dir.mkdir(parents=True, exist_ok=True)
    images, panoptic, instances = [], [], []
    thing_ids = {c for c, _ in categories}
    for i in range(num_images):
        image_id = first_id + i
        h, w = (int(s * rng.uniform(0.8, 1.2)) for s in image_size)
        img, ids, segments = _scene(rng, h, w, categories, object_size, max_objects, empty=i % 8 == 5)
        stem = f"{image_id:012d}"
        img.save(img_dir / f"{stem}.jpg", quality=92)
        Image.fromarray(id2rgb(ids)).save(png_dir / f"{stem}.png")
        images.append({"id": image_id, "file_name": f"{stem}.jpg", "width": w, "height": h})
        panoptic.append({"image_id": image_id, "file_name": f"{stem}.png",
                         "segments_info": [{k: v for k, v in s.items() if k != "rle"} for s in segments]})
        for s in segments:
            if s["category_id"] in thing_ids:
                rle = {"size": [int(v) for v in s["rle"]["size"]], "counts": s["rle"]["counts"].decode("ascii")}
                instances.append({"id": ann_id, "image_id": image_id, "category_id": s["category_id"], "bbox": s["bbox"],
                                  "area": s["area"], "iscrowd": 0, "segmentation": rle})
                ann_id += 1
    cats = [{"id": c, "name": n, "supercategory": "shape", "isthing": 1} for c, n in categories]
    cats += [{"id": c, "name": n, "supercategory": "background", "isthing": 0} for c, n, _ in STUFF]
    info = {"description": "visiontf synthetic panoptic shapes", "version": "1.0"}
    return ({"info": info, "images": images, "annotations": panoptic, "categories": cats},
            {"info": info, "images": images, "annotations": instances, "categories": [c for c in cats if c["isthing"]]},
            ann_id)


def make_panoptic_dataset(out: str | Path, num_train: int = 256, num_val: int = 32, seed: int = 0,
                          image_size: tuple[int, int] = (128, 160), num_classes: int = 4,
                          object_size: tuple[float, float] = (0.12, 0.35), max_objects: int = 3) -> dict[str, Path]:
    """Write the set under ``out`` (sizes as ``make demo``'s detection set: 1-3 large shapes, one colour per
    class) and return its paths: ``root``, ``{train,val}_images``, ``{train,val}_panoptic`` (JSON),
    ``{train,val}_segments`` (PNG folders), ``{train,val}_ann`` (the instances files).

    ``num_classes`` (1..4) thing categories of :data:`~visiontf.tasks.detection.detection_synthetic.CATEGORIES`,
    plus the two stuff categories of :data:`STUFF`.
    """
    if not 1 <= num_classes <= len(CATEGORIES):
        raise ValueError(f"num_classes must be in 1..{len(CATEGORIES)}, got {num_classes}")
    root = Path(out)
    (root / "annotations").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    shapes = {"image_size": image_size, "categories": CATEGORIES[:num_classes], "object_size": object_size,
              "max_objects": max_objects}
    paths = {"root": root}
    ann_id, first = 1, 1
    for split, n in (("train", num_train), ("val", num_val)):
        panoptic, instances, ann_id = _make_split(rng, root, split, n, first, ann_id, **shapes)
        first += n
        paths[f"{split}_images"] = root / f"{split}2017"
        paths[f"{split}_panoptic"] = root / "annotations" / f"panoptic_{split}2017.json"
        paths[f"{split}_segments"] = root / "annotations" / f"panoptic_{split}2017"
        paths[f"{split}_ann"] = root / "annotations" / f"instances_{split}2017.json"
        paths[f"{split}_panoptic"].write_text(json.dumps(panoptic))
        paths[f"{split}_ann"].write_text(json.dumps(instances))
    return paths
