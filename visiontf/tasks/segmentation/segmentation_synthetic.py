"""A small synthetic semantic-segmentation set in the generic, ADE20K or Cityscapes layout.

Images are textured backgrounds (class 0) with overlapping shapes (classes 1..K-1, one shape type and
base colour per class, jittered) and one grey "other" band per image that is not a class (ignored:
label 0 in ADE20K annotations, which reduce-zero-label maps to 255; 255 in the other layouts). Masks
are drawn with the same geometry as the image, so labels align pixel-exactly.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from visiontf.data.synthetic.shapes import SHAPES, class_style, draw_shape

LAYOUTS = ("generic", "ade20k", "cityscapes")
IGNORE = 255


def class_names(num_classes: int) -> list[str]:
    """``background`` then one ``<shape>_<k>`` name per shape class."""
    return ["background"] + [f"{SHAPES[(k - 1) % len(SHAPES)]}_{k}" for k in range(1, num_classes)]


def _texture(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    base = rng.uniform(30, 200, size=3).astype(np.float32)
    out = np.broadcast_to(base, (h, w, 3)).copy()
    for _ in range(2):
        fx, fy = rng.uniform(0.01, 0.12, size=2)
        phase = rng.uniform(0, 2 * math.pi)
        amp = rng.uniform(10, 35, size=3).astype(np.float32)
        out += np.sin(fx * xx + fy * yy + phase)[..., None] * amp
    out += rng.normal(0, 10, size=(h, w, 3)).astype(np.float32)
    return out


def render_sample(rng: np.random.Generator, num_classes: int, size: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """One (image uint8 HxWx3, label uint8 HxW) pair; labels 0..K-1 plus 255 on the ignored band."""
    h, w = size
    image = Image.fromarray(np.clip(_texture(rng, h, w), 0, 255).astype(np.uint8))
    mask = Image.new("L", (w, h), 0)
    draw_img, draw_mask = ImageDraw.Draw(image), ImageDraw.Draw(mask)
    # Ignored region: a grey band along one border, like unlabeled stuff at image edges.
    side = int(rng.integers(4))
    depth = int(rng.uniform(0.05, 0.12) * (h if side < 2 else w))
    box = [(0, 0, w, depth), (0, h - depth, w, h), (0, 0, depth, h), (w - depth, 0, w, h)][side]
    grey = int(rng.integers(90, 160))
    draw_img.rectangle([box[0], box[1], box[2] - 1, box[3] - 1], fill=(grey, grey, grey))
    draw_mask.rectangle([box[0], box[1], box[2] - 1, box[3] - 1], fill=IGNORE)
    short = min(h, w)
    for _ in range(int(rng.integers(1, 5)) if num_classes > 1 else 0):
        label = int(rng.integers(1, num_classes))
        shape, colour = class_style(label - 1, num_classes)
        colour = tuple(int(v) for v in np.clip(colour + rng.normal(0, 20, size=3), 0, 255))
        r = rng.uniform(0.1, 0.3) * short
        cx, cy = rng.uniform(0, w), rng.uniform(0, h)
        angle = rng.uniform(0, 2 * math.pi)
        draw_shape(draw_img, shape, cx, cy, r, angle, colour)
        draw_shape(draw_mask, shape, cx, cy, r, angle, label)
    arr = np.asarray(image, dtype=np.float32) + rng.normal(0, 5, size=(h, w, 3))
    return np.clip(arr, 0, 255).astype(np.uint8), np.asarray(mask, dtype=np.uint8).copy()


def _paths(out: Path, layout: str, split: str, i: int) -> tuple[Path, Path, np.ndarray | None]:
    """Image path, mask path and the label lookup table for a sample of a layout."""
    if layout == "generic":
        return out / "images" / split / f"{i:05d}.jpg", out / "masks" / split / f"{i:05d}.png", None
    if layout == "ade20k":
        folder = {"train": "training", "val": "validation"}[split]
        stem = f"ADE_{split}_{i + 1:08d}"
        # ADE20K annotations: 0 = "other" (ignored after reduce-zero-label), class k stored as k + 1.
        lut = np.arange(256, dtype=np.uint16) + 1
        lut[IGNORE] = 0
        return out / "images" / folder / f"{stem}.jpg", out / "annotations" / folder / f"{stem}.png", lut.astype(np.uint8)
    city = ["aachen", "bremen"][i % 2] if split == "train" else "frankfurt"
    stem = f"{city}_000000_{i:06d}"
    return (out / "leftImg8bit" / split / city / f"{stem}_leftImg8bit.png",
            out / "gtFine" / split / city / f"{stem}_gtFine_labelTrainIds.png", None)


def make_segmentation_dataset(
    out: str | Path,
    num_train: int = 48,
    num_val: int = 13,
    num_classes: int = 4,
    image_size: tuple[int, int] = (128, 128),
    seed: int = 0,
    layout: str = "generic",
) -> Path:
    """Write a synthetic segmentation set under ``out``; returns ``out``. Same arguments, same bytes.

    ``num_classes`` counts background, i.e. the classes a model predicts (for ``ade20k`` that is after
    reduce-zero-label). ``image_size`` is (height, width). Layouts:

    * ``generic``: ``images/{train,val}/*.jpg``, ``masks/{train,val}/*.png`` (uint8 labels, 255 ignore),
      ``classes.txt`` (one name a line).
    * ``ade20k``: ``images/{training,validation}/ADE_*.jpg``, ``annotations/{training,validation}/ADE_*.png``
      with label 0 = other and class k stored as k + 1; ``classes.txt`` lists the reduced classes.
    * ``cityscapes``: ``leftImg8bit/{split}/<city>/*_leftImg8bit.png`` and
      ``gtFine/{split}/<city>/*_gtFine_labelTrainIds.png`` (255 ignore); needs ``num_classes <= 19``.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r}; expected one of {LAYOUTS}")
    if not 1 <= num_classes <= (19 if layout == "cityscapes" else 254):
        raise ValueError(f"num_classes={num_classes} out of range for layout {layout!r}")
    out = Path(out)
    h, w = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
    for split_index, (split, count) in enumerate((("train", num_train), ("val", num_val))):
        rng = np.random.default_rng([seed, split_index])
        for i in range(count):
            image, mask = render_sample(rng, num_classes, (h, w))
            img_path, mask_path, lut = _paths(out, layout, split, i)
            img_path.parent.mkdir(parents=True, exist_ok=True)
            mask_path.parent.mkdir(parents=True, exist_ok=True)
            if img_path.suffix == ".jpg":
                Image.fromarray(image).save(img_path, quality=92)
            else:
                Image.fromarray(image).save(img_path)
            Image.fromarray(mask if lut is None else lut[mask]).save(mask_path)
    if layout != "cityscapes":
        (out / "classes.txt").write_text("\n".join(class_names(num_classes)) + "\n")
    return out
