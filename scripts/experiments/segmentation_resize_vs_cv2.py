"""How far torch's bilinear resizes are from mmseg's (mmcv ``imresize``: cv2 ``INTER_LINEAR`` on the uint8 image).

    python scripts/experiments/segmentation_resize_vs_cv2.py

For ADE20K- and Cityscapes-like sizes, keep-ratio resized to mmseg's test scales with mmcv's
``rescale_size`` rule, on uniform noise (the worst case) and on a smooth image: the max |difference| in
0-255 levels of torchvision ``antialias=True`` (its default), ``antialias=False`` and
``F.interpolate(bilinear, align_corners=False)``, unrounded, and the share of pixels that differ by a
level once rounded to uint8. Why visiontf resizes with cv2 (docs/segmentation.md).
"""
from __future__ import annotations

import sys
from pathlib import Path

import cv2
import numpy as np
import torch
import torch.nn.functional as F
from torchvision.transforms.v2 import functional as TF

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from visiontf.data.transforms.segmentation import keep_ratio_size  # noqa: E402

CASES = [((1024, 1366), (2048, 512), "ADE20K x0.5"), ((800, 1200), (2048, 512), "ADE20K x0.64"),
         ((683, 1024), (2048, 512), "ADE20K x0.75"), ((384, 512), (2048, 512), "ADE20K x1.33"),
         ((256, 256), (2048, 512), "ADE20K x2"), ((1024, 2048), (2049, 1025), "Cityscapes x1.0005")]


def _smooth(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    x = cv2.resize(rng.normal(size=(h // 8 + 2, w // 8 + 2, 3)).astype(np.float32), (w, h), interpolation=cv2.INTER_CUBIC)
    return np.clip(128 + 60 * x, 0, 255).astype(np.uint8)


def main() -> None:
    rng = np.random.default_rng(0)
    print(f"{'image':7s} {'size':>10s} -> {'resized':>10s} {'case':20s} | {'tv antialias=True':>22s} | "
          f"{'tv antialias=False':>22s} | {'F.interpolate':>22s}")
    for kind in ("noise", "smooth"):
        for (h, w), scale, label in CASES:
            img = rng.integers(0, 256, (h, w, 3), dtype=np.uint8) if kind == "noise" else _smooth(rng, h, w)
            oh, ow = keep_ratio_size(h, w, scale)
            ref = cv2.resize(img, (ow, oh), interpolation=cv2.INTER_LINEAR).astype(np.float64)
            t = torch.from_numpy(img).permute(2, 0, 1).float()[None]
            cells = []
            for out in (TF.resize(t, [oh, ow], antialias=True), TF.resize(t, [oh, ow], antialias=False),
                        F.interpolate(t, size=(oh, ow), mode="bilinear", align_corners=False)):
                o = out[0].permute(1, 2, 0).double().numpy()
                rounded = np.clip(np.round(o), 0, 255)
                cells.append(f"{np.abs(o - ref).max():6.2f} ({100 * (rounded != ref).mean():5.1f}% px)")
            print(f"{kind:7s} {f'{w}x{h}':>10s} -> {f'{ow}x{oh}':>10s} {label:20s} | " + " | ".join(f"{c:>22s}" for c in cells))


if __name__ == "__main__":
    main()
