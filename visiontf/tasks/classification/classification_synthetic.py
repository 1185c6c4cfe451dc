"""A small synthetic image-classification set in ImageFolder layout.

Each class is a shape with a base colour; position, size, rotation and colour are jittered and the
background is noisy, so a model has to look at both shape and colour to reach high accuracy, and a
few epochs of a tiny ViT separate the classes well above chance.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from visiontf.data.synthetic.shapes import SHAPES, class_style, draw_shape


def _render(rng: np.random.Generator, label: int, num_classes: int, size: int) -> Image.Image:
    # Noisy, smoothly tinted background so the object is not a flat-colour blob on black.
    base = rng.uniform(40, 160, size=3)
    ramp = np.linspace(-1, 1, size)
    gx, gy = rng.uniform(-25, 25, size=2)
    bg = base[None, None, :] + gx * ramp[None, :, None] + gy * ramp[:, None, None]
    bg = bg + rng.normal(0, 18, size=(size, size, 3))
    img = Image.fromarray(np.clip(bg, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(img)
    # A distractor of a random other shape in a dull colour makes shape alone slightly ambiguous.
    if rng.random() < 0.5:
        other = SHAPES[int(rng.integers(len(SHAPES)))]
        r = rng.uniform(0.06, 0.12) * size
        draw_shape(draw, other, *rng.uniform(r, size - r, size=2), r, rng.uniform(0, 2 * math.pi),
                   tuple(int(v) for v in rng.uniform(60, 200, size=3)))
    shape, colour = class_style(label, num_classes)
    colour = np.clip(colour + rng.normal(0, 28, size=3), 0, 255)
    r = rng.uniform(0.18, 0.38) * size
    cx, cy = rng.uniform(r * 0.8, size - r * 0.8, size=2)
    draw_shape(draw, shape, cx, cy, r, rng.uniform(0, 2 * math.pi), tuple(int(v) for v in colour))
    arr = np.asarray(img, dtype=np.float32) + rng.normal(0, 6, size=(size, size, 3))
    return Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8))


def make_classification_dataset(
    out: str | Path,
    num_train: int = 200,
    num_val: int = 60,
    num_classes: int = 4,
    image_size: int = 64,
    seed: int = 0,
) -> Path:
    """Write ``out/{train,val}/<class>/*.png`` with classes balanced round-robin; returns ``out``.

    The same arguments always give byte-identical files. Class folder names are
    ``<index>_<shape>`` so sorted folder order equals the class index order.
    """
    if not 1 <= num_classes <= 99:
        raise ValueError(f"num_classes must be in 1..99, got {num_classes}")
    out = Path(out)
    names = [f"{k:02d}_{SHAPES[k % len(SHAPES)]}" for k in range(num_classes)]
    for split_index, (split, count) in enumerate((("train", num_train), ("val", num_val))):
        # One generator per split: changing num_val never changes the training images.
        rng = np.random.default_rng([seed, split_index])
        for name in names:
            (out / split / name).mkdir(parents=True, exist_ok=True)
        for i in range(count):
            label = i % num_classes
            _render(rng, label, num_classes, image_size).save(out / split / names[label] / f"{split}_{i:05d}.png")
    return out
