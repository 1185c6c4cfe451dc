"""A small synthetic monocular-depth set: a textured floor receding to a back wall, with upright boxes
standing on it, rendered through a pinhole camera, so depth follows from cues a network can learn: the
row where a surface meets the floor, the shrinking floor checks, and fog that fades far surfaces.

Layout (what :class:`~visiontf.tasks.depth.depth_data.DepthDataModule` reads): ``images/{train,val}/<i>.png`` (RGB) and
``depth/{train,val}/<i>.png`` (16-bit, millimetres, KITTI's and NYU's convention of integer depth
PNGs; 0 marks pixels without a measurement: a few sensor dropouts per image).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

#: metres: the camera's height over the floor, the back wall's distance, the fog's attenuation length
CAMERA_HEIGHT, FAR, FOG = 1.5, 10.0, 8.0
#: the stored depth's units per metre
DEPTH_SCALE = 1000.0


def render_scene(rng: np.random.Generator, size: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """One (image uint8 (H, W, 3), depth float32 (H, W) in metres, 0 where unmeasured) pair."""
    h, w = size
    focal = 0.9 * w
    horizon = h * rng.uniform(0.3, 0.45)
    rows, cols = np.mgrid[0:h, 0:w].astype(np.float32)
    # the floor at distance z is seen at row horizon + focal * height / z; above it, the back wall
    below = np.maximum(rows + 0.5 - horizon, 1e-3)
    depth = np.where(rows + 0.5 > horizon, np.minimum(focal * CAMERA_HEIGHT / below, FAR), FAR).astype(np.float32)
    x_floor = (cols + 0.5 - w / 2) * depth / focal  # metres across, on the floor
    checks = (np.floor(x_floor * 2) + np.floor(depth * 2)) % 2
    floor_colour, wall_colour = rng.uniform(60, 200, size=3), rng.uniform(60, 200, size=3)
    colour = np.where((depth < FAR)[..., None], floor_colour * (0.75 + 0.25 * checks[..., None]), wall_colour)
    for _ in range(int(rng.integers(1, 4))):  # upright boxes on the floor, far ones drawn first
        z = float(rng.uniform(2.0, 8.0))
        bottom = horizon + focal * CAMERA_HEIGHT / z
        height, width = focal * rng.uniform(0.5, 1.8) / z, focal * rng.uniform(0.4, 1.2) / z
        left = rng.uniform(-width / 2, w - width / 2)
        box = (rows >= bottom - height) & (rows < bottom) & (cols >= left) & (cols < left + width) & (depth > z)
        depth[box] = z
        colour[box] = rng.uniform(40, 255, size=3)
    fog = np.exp(-depth / FOG)[..., None]
    image = colour * fog + 180.0 * (1 - fog) + rng.normal(0, 4, size=(h, w, 3))
    measured = rng.random((h, w)) > 0.02
    return np.clip(image, 0, 255).astype(np.uint8), np.where(measured, depth, 0.0).astype(np.float32)


def make_depth_dataset(out: str | Path, num_train: int = 256, num_val: int = 32, image_size: tuple[int, int] = (64, 80),
                       seed: int = 0) -> Path:
    """Write the set under ``out`` and return ``out``; the same arguments give the same files."""
    out = Path(out)
    for split_index, (split, count) in enumerate((("train", num_train), ("val", num_val))):
        rng = np.random.default_rng([seed, split_index])  # num_val never changes the training scenes
        (out / "images" / split).mkdir(parents=True, exist_ok=True)
        (out / "depth" / split).mkdir(parents=True, exist_ok=True)
        for i in range(count):
            image, depth = render_scene(rng, tuple(image_size))
            Image.fromarray(image).save(out / "images" / split / f"{i:05d}.png")
            Image.fromarray(np.round(depth * DEPTH_SCALE).astype(np.uint16)).save(out / "depth" / split / f"{i:05d}.png")
    return out


__all__ = ["DEPTH_SCALE", "make_depth_dataset", "render_scene"]
