"""A tiny COCO-format detection dataset of coloured shapes on textured backgrounds.

Real JPEG files plus ``instances_{train,val}2017.json``, laid out like COCO so the real loading
code runs on it. Category ids are deliberately non-contiguous (1, 2, 3, 5) to exercise the
category-id <-> label mapping. Deterministic for a seed.

Each annotation's ``segmentation`` is the shape's exact mask: the pixels it was painted on (PIL's
rasterisation of its polygon and outline) less those a later shape covers, as COCO's compressed RLE.
``bbox`` and ``area`` are the whole shape's (its polygon's extent and area), as sets written before masks
were exact had them, so those sets' detection numbers stand; earlier sets carry the polygon itself as
``segmentation`` (occlusion ignored) and still load, with masks too.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

#: (id, name); id 4 is skipped on purpose, like the gaps in COCO's 1..90.
CATEGORIES = ((1, "circle"), (2, "square"), (3, "triangle"), (5, "star"))

__all__ = ["CATEGORIES", "make_detection_dataset"]


_CLASS_COLOURS = ((220, 40, 40), (40, 200, 60), (50, 80, 230), (240, 210, 40))


def _background(rng: np.random.Generator, height: int, width: int) -> Image.Image:
    # A smooth colour field (upsampled coarse noise) plus pixel noise looks textured but is cheap.
    coarse = rng.integers(40, 216, size=(4, 5, 3), dtype=np.uint8)
    field = np.asarray(Image.fromarray(coarse).resize((width, height), Image.BILINEAR), dtype=np.int16)
    noise = rng.integers(-25, 26, size=(height, width, 3), dtype=np.int16)
    return Image.fromarray(np.clip(field + noise, 0, 255).astype(np.uint8))


def _polygon(kind: str, cx: float, cy: float, r: float, angle: float) -> list[tuple[float, float]]:
    if kind == "circle":
        n, radii = 24, [r]
    elif kind == "square":
        # Axis-aligned so that the shape fills its box, as most real boxes are not rotated squares.
        return [(cx - r, cy - r), (cx + r, cy - r), (cx + r, cy + r), (cx - r, cy + r)]
    elif kind == "triangle":
        n, radii = 3, [r]
    else:  # star
        n, radii = 10, [r, 0.45 * r]
    return [
        (cx + radii[i % len(radii)] * math.cos(angle + 2 * math.pi * i / n),
         cy + radii[i % len(radii)] * math.sin(angle + 2 * math.pi * i / n))
        for i in range(n)
    ]


def _shoelace(points: list[tuple[float, float]]) -> float:
    xs = np.array([p[0] for p in points])
    ys = np.array([p[1] for p in points])
    return float(0.5 * abs(np.dot(xs, np.roll(ys, -1)) - np.dot(ys, np.roll(xs, -1))))


def _painted_pixels(poly: list[tuple[float, float]], h: int, w: int) -> np.ndarray:
    """(h, w) bool: the pixels ``ImageDraw.polygon(poly, fill, outline)`` paints."""
    canvas = Image.new("L", (w, h), 0)
    ImageDraw.Draw(canvas).polygon(poly, fill=1, outline=1)
    return np.asarray(canvas, dtype=bool)


def _exact_masks(annotations: list[dict], painted: list[np.ndarray]) -> None:
    """Each annotation's ``segmentation``: its shape's visible pixels (later shapes paint over earlier ones), as RLE."""
    from pycocotools import mask as mask_utils

    covered = np.zeros_like(painted[0]) if painted else None
    for ann, pixels in zip(reversed(annotations), reversed(painted)):
        visible = pixels & ~covered
        covered |= pixels
        rle = mask_utils.encode(np.asfortranarray(visible.astype(np.uint8)))
        ann["segmentation"] = {"size": [int(v) for v in rle["size"]], "counts": rle["counts"].decode("ascii")}


def _make_split(
    rng: np.random.Generator,
    img_dir: Path,
    num_images: int,
    image_size: tuple[int, int],
    categories: tuple[tuple[int, str], ...],
    first_image_id: int,
    ann_id: int,
    object_size: tuple[float, float] | None = None,
    max_objects: int = 5,
    colour_by_class: bool = False,
) -> tuple[dict, int]:
    img_dir.mkdir(parents=True, exist_ok=True)
    images, annotations = [], []
    painted: list[np.ndarray] = []  # each annotated shape's pixels, in painting order
    base_h, base_w = image_size
    for i in range(num_images):
        image_id = first_image_id + i
        # Sizes vary per image so batches need padding, as with real data.
        h = int(base_h * rng.uniform(0.8, 1.2))
        w = int(base_w * rng.uniform(0.8, 1.2))
        img = _background(rng, h, w)
        draw = ImageDraw.Draw(img)
        # Every 8th image (offset 5) has no objects: empty targets must train and evaluate.
        num_objects = 0 if i % 8 == 5 else int(rng.integers(1, max_objects + 1))
        for _ in range(num_objects):
            cat_id, kind = categories[int(rng.integers(len(categories)))]
            # Log-uniform radius: many small objects (COCO "small" < 32x32) and a few large ones,
            # unless object_size gives the radius range as fractions of the shorter side.
            lo, hi = (3.0, 0.3 * min(h, w)) if object_size is None else (object_size[0] * min(h, w), object_size[1] * min(h, w))
            r = float(np.exp(rng.uniform(np.log(lo), np.log(hi))))
            cx = float(rng.uniform(r + 1, w - r - 1))
            cy = float(rng.uniform(r + 1, h - r - 1))
            poly = _polygon(kind, cx, cy, r, float(rng.uniform(0, 2 * math.pi)))
            if colour_by_class:
                # a class colour with jitter: an easier set that small CPU models learn in minutes
                base = _CLASS_COLOURS[[c for c, _ in categories].index(cat_id) % len(_CLASS_COLOURS)]
                colour = tuple(int(np.clip(c + rng.integers(-30, 31), 0, 255)) for c in base)
            else:
                colour = tuple(int(c) for c in rng.integers(0, 256, size=3))
            draw.polygon(poly, fill=colour, outline=(0, 0, 0))
            painted.append(_painted_pixels(poly, h, w))
            xs, ys = [p[0] for p in poly], [p[1] for p in poly]
            x0, y0, x1, y1 = max(min(xs), 0.0), max(min(ys), 0.0), min(max(xs), w), min(max(ys), h)
            annotations.append(
                {
                    "id": ann_id,
                    "image_id": image_id,
                    "category_id": cat_id,
                    "bbox": [round(x0, 2), round(y0, 2), round(x1 - x0, 2), round(y1 - y0, 2)],
                    "area": round(_shoelace(poly), 2),
                    "iscrowd": 0,
                    "segmentation": [[round(c, 2) for p in poly for c in p]],
                }
            )
            ann_id += 1
        _exact_masks(annotations[len(annotations) - num_objects:], painted[len(painted) - num_objects:])
        file_name = f"{image_id:012d}.jpg"
        img.save(img_dir / file_name, quality=92)
        images.append({"id": image_id, "file_name": file_name, "width": w, "height": h})
    dataset = {
        "info": {"description": "visiontf synthetic shapes", "version": "1.0"},
        "images": images,
        "annotations": annotations,
        "categories": [{"id": cid, "name": name, "supercategory": "shape"} for cid, name in categories],
    }
    return dataset, ann_id


def make_detection_dataset(
    out: str | Path,
    num_train: int = 64,
    num_val: int = 16,
    seed: int = 0,
    image_size: tuple[int, int] = (160, 224),
    num_classes: int = 4,
    object_size: tuple[float, float] | None = None,
    max_objects: int = 5,
    colour_by_class: bool = False,
) -> dict[str, Path]:
    """Write a COCO-layout shapes dataset under ``out`` and return its paths.

    Layout: ``out/train2017/*.jpg``, ``out/val2017/*.jpg``,
    ``out/annotations/instances_{train,val}2017.json``. ``image_size`` is the (height, width)
    around which each image's size varies by +-20 %. ``num_classes`` (1..4) takes the first
    categories of :data:`CATEGORIES`. ``object_size`` is the (min, max) shape radius as fractions
    of the image's shorter side (default: 3 px to 0.3, many COCO-small objects); ``max_objects``
    caps the objects per image. ``colour_by_class`` paints each class in its own (jittered) colour
    instead of a random one: an easier set for a CPU demo.

    Returns a dict with ``root``, ``train_images``, ``val_images``, ``train_ann``, ``val_ann``.
    """
    if not 1 <= num_classes <= len(CATEGORIES):
        raise ValueError(f"num_classes must be in 1..{len(CATEGORIES)}, got {num_classes}")
    root = Path(out)
    rng = np.random.default_rng(seed)
    categories = CATEGORIES[:num_classes]
    paths = {
        "root": root,
        "train_images": root / "train2017",
        "val_images": root / "val2017",
        "train_ann": root / "annotations" / "instances_train2017.json",
        "val_ann": root / "annotations" / "instances_val2017.json",
    }
    paths["train_ann"].parent.mkdir(parents=True, exist_ok=True)
    ann_id = 1
    # Image ids continue across splits, as in COCO, so a mix-up between splits is detectable.
    shapes = {"object_size": object_size, "max_objects": max_objects, "colour_by_class": colour_by_class}
    train, ann_id = _make_split(rng, paths["train_images"], num_train, image_size, categories, 1, ann_id, **shapes)
    val, _ = _make_split(rng, paths["val_images"], num_val, image_size, categories, num_train + 1, ann_id, **shapes)
    paths["train_ann"].write_text(json.dumps(train))
    paths["val_ann"].write_text(json.dumps(val))
    return paths
