"""Shapes drawn for the synthetic sets: one shape and base colour per class, polygons at any angle.

Shared by the classification and segmentation synthetic sets (a class looks the same in both).
"""
from __future__ import annotations

import math

import numpy as np
from PIL import ImageDraw

SHAPES = ("circle", "square", "triangle", "cross", "ring", "diamond", "star", "bar")


def class_style(index: int, num_classes: int) -> tuple[str, np.ndarray]:
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


__all__ = ["SHAPES", "class_style", "draw_shape"]
