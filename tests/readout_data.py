"""Data of the readout tests (per-class AP, TIDE) and of ``benchmarks/tide_vs_tidecv.py``.

``ANN_100``: the annotations of the 100 real val2017 images of CompVis/taming-transformers
(``tests/data/coco_real``, see its README), boxes only.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

ANN_100 = Path(__file__).resolve().parent / "data" / "coco_real" / "boxes" / "instances_val2017_100.json"


def make_detections(gt: dict, seed: int = 0) -> list[dict]:
    """Detections of ``gt`` with every kind of error, deterministic for a seed."""
    rng = np.random.default_rng(seed)
    cats = sorted(c["id"] for c in gt["categories"])
    absent = sorted(set(cats) - {a["category_id"] for a in gt["annotations"]})
    sizes = {im["id"]: (im["width"], im["height"]) for im in gt["images"]}
    dets = []
    for a in gt["annotations"]:
        x, y, w, h = a["bbox"]
        for _ in range(int(rng.choice([0, 1, 1, 1, 2]))):  # a miss, one detection, or a duplicate
            j = rng.normal(0, 0.12, size=4) * [w, h, w, h]
            cat = a["category_id"] if rng.random() < 0.85 else int(rng.choice(cats))
            dets.append({"image_id": a["image_id"], "category_id": cat,
                         "bbox": [float(x + j[0]), float(y + j[1]), float(max(w + j[2], 1)), float(max(h + j[3], 1))],
                         "score": float(rng.random())})
    for image_id, (W, H) in sizes.items():
        for _ in range(int(rng.integers(0, 4))):  # background, some of categories without any object
            cat = int(rng.choice(absent)) if absent and rng.random() < 0.3 else int(rng.choice(cats))
            bw, bh = float(rng.uniform(5, W / 3)), float(rng.uniform(5, H / 3))
            dets.append({"image_id": image_id, "category_id": cat, "bbox": [float(rng.uniform(0, W - bw)),
                         float(rng.uniform(0, H - bh)), bw, bh], "score": float(rng.random())})
    return dets
