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

SHAPES = ("circle", "square", "triangle", "cross", "ring", "diamond", "star", "bar")


def _class_style(index: int, num_classes: int) -> tuple[str, np.ndarray]:
    """Shape and base RGB colour of a class; hues are spread so neighbours differ."""
    shape = SHAPES[index % len(SHAPES)]
    hue = (index * 0.618034) % 1.0  # golden-ratio steps keep hues apart for any class count
    h6 = hue * 6.0
    i = int(h6) % 6
    f = h6 - int(h6)
    v, s = 0.9, 0.75
    p, q, t = v * (1 - s), v * (1 - s * f), v * (1 - s * (1 - f))
    rgb = [(v, t, p), (q, v, p), (p, v, t), (p, q, v), (t, p, v), (v, p, q)][i]
    return shape, np.array(rgb) * 255.0


def _polygon(shape: str, cx: float, cy: float, r: float, angle: float) -> list[tuple[float, float]]:
    if shape == "triangle":
        pts = [(math.cos(angle + k * 2 * math.pi / 3), math.sin(angle + k * 2 * math.pi / 3)) for k in range(3)]
    elif shape == "square":
        pts = [(math.cos(angle + math.pi / 4 + k * math.pi / 2), math.sin(angle + math.pi / 4 + k * math.pi / 2)) for k in range(4)]
    elif shape == "diamond":
        pts = [(0.6 * math.cos(angle + k * math.pi / 2) if k % 2 else math.cos(angle + k * math.pi / 2),
                0.6 * math.sin(angle + k * math.pi / 2) if k % 2 else math.sin(angle + k * math.pi / 2)) for k in range(4)]
    elif shape == "star":
        pts = [((1.0 if k % 2 == 0 else 0.45) * math.cos(angle + k * math.pi / 5),
                (1.0 if k % 2 == 0 else 0.45) * math.sin(angle + k * math.pi / 5)) for k in range(10)]
    elif shape == "bar":
        c, s = math.cos(angle), math.sin(angle)
        pts = [(x * c - y * s, x * s + y * c) for x, y in [(-1, -0.3), (1, -0.3), (1, 0.3), (-1, 0.3)]]
    else:
        raise ValueError(shape)
    return [(cx + r * x, cy + r * y) for x, y in pts]


def draw_shape(draw: ImageDraw.ImageDraw, shape: str, cx: float, cy: float, r: float, angle: float, fill) -> None:
    """Draw one filled shape (used for both images and masks, so they align exactly)."""
    if shape == "circle":
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=fill)
    elif shape == "ring":
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], outline=fill, width=max(2, int(r * 0.35)))
    elif shape == "cross":
        c, s = math.cos(angle), math.sin(angle)
        for x0, y0 in [(1, 0.28), (0.28, 1)]:
            pts = [(x * x0, y * y0) for x, y in [(-1, -1), (1, -1), (1, 1), (-1, 1)]]
            draw.polygon([(cx + r * (x * c - y * s), cy + r * (x * s + y * c)) for x, y in pts], fill=fill)
    else:
        draw.polygon(_polygon(shape, cx, cy, r, angle), fill=fill)


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
    shape, colour = _class_style(label, num_classes)
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
