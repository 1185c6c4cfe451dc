"""Data of the readout tests (per-class AP, TIDE) and of ``scripts/experiments/tide_vs_tidecv.py``.

``ANN_100``: the annotations of the 100 real val2017 images of CompVis/taming-transformers
(``tests/fixtures/coco_real``, see its README), boxes only.
"""
from __future__ import annotations

import contextlib
import copy
import io
import math
from pathlib import Path

import numpy as np
import pytest
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

ANN_100 = Path(__file__).resolve().parent / "fixtures" / "coco_real" / "boxes" / "instances_val2017_100.json"


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


def pycocotools_eval(ann_file: Path, dets: list[dict], img_ids=None) -> COCOeval:
    with contextlib.redirect_stdout(io.StringIO()):
        gt = COCO(str(ann_file))
        ev = COCOeval(gt, gt.loadRes(copy.deepcopy(dets)), "bbox")
        if img_ids is not None:
            ev.params.imgIds = sorted(img_ids)
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    return ev


def reference_rows(ev: COCOeval) -> dict[int, dict]:
    """The slices written out as the issue states them, straight from pycocotools' own object."""
    p, e = ev.params, ev.eval

    def mean(x):
        x = x[x > -1]
        return float(np.mean(x)) if x.size else float("nan")

    out = {}
    for k, cat in enumerate(p.catIds):
        out[cat] = {"AP": mean(e["precision"][:, :, k, 0, 2]), "AP50": mean(e["precision"][0, :, k, 0, 2]),
                    "AP75": mean(e["precision"][5, :, k, 0, 2]), "AR100": mean(e["recall"][:, k, 0, 2]),
                    "num_gt": len(ev.cocoGt.getAnnIds(imgIds=p.imgIds, catIds=[cat], iscrowd=False))}
    return out


def assert_rows_equal(rows: list[dict], ref: dict[int, dict], tol: float = 1e-12) -> None:
    assert [r["category_id"] for r in rows] == list(ref)
    for r in rows:
        want = ref[r["category_id"]]
        assert r["num_gt"] == want["num_gt"], r
        for key in ("AP", "AP50", "AP75", "AR100"):
            if math.isnan(want[key]):
                assert math.isnan(r[key]), (r, key)
            else:
                assert r[key] == pytest.approx(want[key], abs=tol, rel=0), (r, key)
