"""Benchmark: evaluating a COCO results file, ``tools/eval.py --annotations A --predictions P`` vs plain pycocotools.

Both run as whole processes (start-up, JSON loading, evaluation, summary), timed by wall clock,
on generated COCO-sized data of two shapes, 5,000 images (``--quick``: 1,000) with 100 detections each:

* ``light``: COCO val2017's make-up. About 7.3 ground-truth boxes per image (Poisson, at most 50; 1 %
  crowd; about 30 % of them in category 1, as COCO's persons, the rest a long tail over 80 categories;
  COCO-style polygon segmentations in the annotation file), and a detector's top 100 as a results file holds it: about
  one good box per object (sometimes a duplicate or another class), the rest low-scoring boxes of any
  class anywhere, every number a float32 written out in full (``352.8977966308594``).
* ``crowded``: the data this benchmark generated before (reliability round 4): 1-20 ground-truth boxes (about 7)
  in 80 uniform categories, 5 % crowd, and 60 of each image's 100 detections jittered copies of its
  ground-truth boxes, so that matching is busy; numbers rounded to 2 and 4 decimals.

Both sides must give the same 12 stats (equal, not close). On a shared machine give ``--repeats N``:
the two alternate N times, and each round's ratio is reported in wall-clock and in CPU time (user +
system of each process, which other processes disturb far less than the wall clock), with the load
average.

    .venv/bin/python benchmarks/coco_eval.py [--quick] [--images N] [--repeats N] [--shape light|crowded|both]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
STAT_NAMES = ("AP", "AP50", "AP75", "AP_small", "AP_medium", "AP_large",
              "AR_1", "AR_10", "AR_100", "AR_small", "AR_medium", "AR_large")

# The reference: what a user would write with pycocotools alone.
REFERENCE_SCRIPT = """
import json, sys
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval
gt = COCO(sys.argv[1])
dt = gt.loadRes(sys.argv[2])
ev = COCOeval(gt, dt, "bbox")
ev.evaluate()
ev.accumulate()
ev.summarize()
json.dump([float(s) for s in ev.stats], open(sys.argv[3], "w"))
"""


SHAPES = ("light", "crowded")


def make_light(out: Path, num_images: int, dets_per_image: int = 100, num_classes: int = 80, seed: int = 0):
    """COCO val2017's make-up (see the module's docstring): write ``ann.json`` and ``results.json`` under ``out``;
    returns their paths and counts."""
    rng = np.random.default_rng(seed)
    cat_ids = np.arange(1, 91)[:num_classes]
    weights = 1.0 / np.arange(1, num_classes + 1) ** 0.8  # a long tail, and category 1 about 30 % (COCO's persons)
    weights[0] *= 2.8
    weights /= weights.sum()
    images, anns, dets = [], [], []
    aid = 1

    def f32(a):  # what a detector's float32 outputs become in a JSON file
        return np.asarray(a, dtype=np.float32).astype(np.float64)

    for i in range(num_images):
        img_id = i + 1
        w, h = int(rng.integers(400, 641)), int(rng.integers(300, 481))
        images.append({"id": img_id, "file_name": f"{img_id:012d}.jpg", "width": w, "height": h})
        n = int(min(50, rng.poisson(7.3)))
        side = np.exp(rng.uniform(np.log(6), np.log(0.8 * min(w, h)), size=n))
        bw = np.minimum(side * rng.uniform(0.5, 1.5, n), w - 1)
        bh = np.minimum(side * rng.uniform(0.5, 1.5, n), h - 1)
        x, y = rng.uniform(0, w - bw), rng.uniform(0, h - bh)
        cats = rng.choice(cat_ids, size=n, p=weights)
        crowd = rng.random(n) < 0.01
        for k in range(n):
            x0, y0, x1, y1 = (round(float(v), 2) for v in (x[k], y[k], x[k] + bw[k], y[k] + bh[k]))
            anns.append({"id": aid, "image_id": img_id, "category_id": int(cats[k]),
                         "bbox": [x0, y0, round(float(bw[k]), 2), round(float(bh[k]), 2)],
                         "area": round(float(bw[k] * bh[k] * rng.uniform(0.5, 0.9)), 2), "iscrowd": int(crowd[k]),
                         "segmentation": [[x0, y0, x1, y0, x1, y1, x0, y1]]})
            aid += 1
        # about one good box per object, sometimes a second one (a duplicate, or the wrong class)
        src = np.flatnonzero(rng.random(n) < 0.9)
        extra = rng.choice(n, size=min(n, int(rng.poisson(0.3 * n)))) if n else np.zeros(0, dtype=int)
        src = np.concatenate([src, extra]).astype(int)[:dets_per_image]
        near = len(src)
        jit = rng.normal(0, 0.06, size=(near, 4))
        dx, dy = x[src] + jit[:, 0] * bw[src], y[src] + jit[:, 1] * bh[src]
        dw, dh = bw[src] * np.exp(jit[:, 2]), bh[src] * np.exp(jit[:, 3])
        dcat = np.where(rng.random(near) < 0.85, cats[src], rng.choice(cat_ids, size=near, p=weights))
        far = dets_per_image - near
        fw, fh = np.exp(rng.uniform(np.log(6), np.log(400), far)), np.exp(rng.uniform(np.log(6), np.log(400), far))
        bx = f32(np.concatenate([dx, rng.uniform(0, w - 6, far)]))
        by = f32(np.concatenate([dy, rng.uniform(0, h - 6, far)]))
        bws, bhs = f32(np.concatenate([dw, fw])), f32(np.concatenate([dh, fh]))
        bcat = np.concatenate([dcat, rng.choice(cat_ids, size=far, p=weights)])
        score = f32(np.concatenate([rng.beta(5, 2, near), rng.beta(1, 12, far)]))
        for k in range(dets_per_image):
            dets.append({"image_id": img_id, "category_id": int(bcat[k]),
                         "bbox": [float(bx[k]), float(by[k]), float(bws[k]), float(bhs[k])], "score": float(score[k])})
    gt = {"images": images, "annotations": anns, "categories": [{"id": int(c), "name": f"class{c}"} for c in cat_ids]}
    ann_file, res_file = out / "ann.json", out / "results.json"
    ann_file.write_text(json.dumps(gt))
    res_file.write_text(json.dumps(dets))
    return ann_file, res_file, len(anns), len(dets)


def make_data(out: Path, num_images: int, dets_per_image: int = 100, num_classes: int = 80, seed: int = 0):
    """The ``crowded`` shape (see the module's docstring): write ``ann.json`` and ``results.json`` under ``out``;
    returns their paths and counts."""
    rng = np.random.default_rng(seed)
    cat_ids = [c for c in range(1, 91)][:num_classes]
    images, anns, dets = [], [], []
    aid = 1
    for i in range(num_images):
        img_id = i + 1
        w, h = int(rng.integers(400, 641)), int(rng.integers(300, 481))
        images.append({"id": img_id, "file_name": f"{img_id:012d}.jpg", "width": w, "height": h})
        n = int(min(20, max(1, rng.poisson(7))))
        side = np.exp(rng.uniform(np.log(8), np.log(0.8 * min(w, h)), size=n))
        bw = np.minimum(side * rng.uniform(0.5, 1.5, n), w - 1)
        bh = np.minimum(side * rng.uniform(0.5, 1.5, n), h - 1)
        x = rng.uniform(0, w - bw)
        y = rng.uniform(0, h - bh)
        cats = rng.choice(cat_ids, size=n)
        crowd = rng.random(n) < 0.05
        for k in range(n):
            anns.append({"id": aid, "image_id": img_id, "category_id": int(cats[k]),
                         "bbox": [round(float(v), 2) for v in (x[k], y[k], bw[k], bh[k])],
                         "area": round(float(bw[k] * bh[k] * rng.uniform(0.5, 0.9)), 2), "iscrowd": int(crowd[k])})
            aid += 1
        # 100 detections: jittered copies of GT boxes (mostly the right class) and background boxes.
        near = int(dets_per_image * 0.6)
        src = rng.integers(0, n, size=near)
        jit = rng.normal(0, 0.1, size=(near, 4))
        dx = x[src] + jit[:, 0] * bw[src]
        dy = y[src] + jit[:, 1] * bh[src]
        dw = bw[src] * np.exp(jit[:, 2])
        dh = bh[src] * np.exp(jit[:, 3])
        dcat = np.where(rng.random(near) < 0.8, cats[src], rng.choice(cat_ids, size=near))
        far = dets_per_image - near
        fw = np.exp(rng.uniform(np.log(8), np.log(300), far))
        fh = np.exp(rng.uniform(np.log(8), np.log(300), far))
        bx = np.concatenate([dx, rng.uniform(0, w - 8, far)])
        by = np.concatenate([dy, rng.uniform(0, h - 8, far)])
        bws = np.concatenate([dw, fw])
        bhs = np.concatenate([dh, fh])
        bcat = np.concatenate([dcat, rng.choice(cat_ids, size=far)])
        score = np.concatenate([rng.beta(4, 2, near), rng.beta(2, 4, far)])
        for k in range(dets_per_image):
            dets.append({"image_id": img_id, "category_id": int(bcat[k]),
                         "bbox": [round(float(bx[k]), 2), round(float(by[k]), 2),
                                  round(float(bws[k]), 2), round(float(bhs[k]), 2)],
                         "score": round(float(score[k]), 4)})
    gt = {"images": images, "annotations": anns,
          "categories": [{"id": c, "name": f"class{c}"} for c in cat_ids]}
    ann_file, res_file = out / "ann.json", out / "results.json"
    ann_file.write_text(json.dumps(gt))
    res_file.write_text(json.dumps(dets))
    return ann_file, res_file, len(anns), len(dets)


def _timed(cmd: list[str]) -> tuple[float, float, subprocess.CompletedProcess]:
    """Wall-clock seconds and the process's own CPU seconds (user + system: what other processes on a shared
    machine disturb least), and the finished process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    elapsed = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[:2]} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return elapsed, cpu, proc


def run(quick: bool = False, num_images: int | None = None, repeats: int = 1, shapes: tuple[str, ...] = SHAPES,
        backend: str = "auto") -> list[dict]:
    """One row per data shape: both whole processes timed, alternating ``repeats`` times (the machine is shared):
    the best of each, and every round's ratio in wall-clock and in CPU time, with the load average before each
    round."""
    n = num_images or (1000 if quick else 5000)
    return [_run_shape(shape, n, repeats, backend) for shape in shapes]


def _run_shape(shape: str, n: int, repeats: int, backend: str = "auto") -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        ann_file, res_file, n_gt, n_dets = (make_light if shape == "light" else make_data)(tmp, n)
        sizes_mb = [round(f.stat().st_size / 2 ** 20, 1) for f in (ann_file, res_file)]
        ref_script = tmp / "reference_pycocotools.py"
        ref_script.write_text(REFERENCE_SCRIPT)
        ours_s, ref_s, ours_cpu, ref_cpu, loads = [], [], [], [], []
        for _ in range(repeats):
            loads.append(round(os.getloadavg()[0], 1))
            t, cpu, proc = _timed([sys.executable, str(REPO / "tools" / "eval.py"), "--annotations",
                                   str(ann_file), "--predictions", str(res_file), "--output", str(tmp / "ours.json"),
                                   "--backend", backend])
            ours_s.append(t)
            ours_cpu.append(cpu)
            table = proc.stdout
            t, cpu, _ = _timed([sys.executable, str(ref_script), str(ann_file), str(res_file), str(tmp / "ref.json")])
            ref_s.append(t)
            ref_cpu.append(cpu)
        ours = json.loads((tmp / "ours.json").read_text())
        ref = json.loads((tmp / "ref.json").read_text())
        same = [ours[k] for k in STAT_NAMES] == ref  # equal, not close
    print(f"{shape}:\n{table.rstrip()}")
    return {
        "benchmark": f"coco_eval_results_file_{shape}",
        "shape": shape,
        "images": n,
        "gt_boxes": n_gt,
        "detections": n_dets,
        "file_mb": sizes_mb,
        "backend": ours["backend"],
        "ours_s": min(ours_s),
        "ref_s": min(ref_s),
        "ratio": min(ref_s) / min(ours_s),
        "ratios_wall": [round(r / o, 2) for o, r in zip(ours_s, ref_s)],
        "ratios_cpu": [round(r / o, 2) for o, r in zip(ours_cpu, ref_cpu)],
        "ours_cpu_s": min(ours_cpu),
        "ref_cpu_s": min(ref_cpu),
        "rounds_s": {"ours_wall": [round(v, 2) for v in ours_s], "ref_wall": [round(v, 2) for v in ref_s],
                     "ours_cpu": [round(v, 2) for v in ours_cpu], "ref_cpu": [round(v, 2) for v in ref_cpu]},
        "load_before_rounds": loads,
        "same_result": same,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="1,000 images instead of 5,000")
    p.add_argument("--images", type=int, default=None, help="number of images (overrides --quick)")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--shape", choices=(*SHAPES, "both"), default="both")
    p.add_argument("--backend", default="auto", help="tools/eval.py's --backend")
    args = p.parse_args(argv)
    rows = run(args.quick, args.images, args.repeats, SHAPES if args.shape == "both" else (args.shape,), args.backend)
    for r in rows:
        print(json.dumps(r))
        print(f"{r['shape']}: ours {r['ours_s']:.2f} s vs pycocotools {r['ref_s']:.2f} s: {r['ratio']:.2f}x faster, "
              f"identical stats: {r['same_result']}; per round, wall {r['ratios_wall']}, CPU time {r['ratios_cpu']} "
              f"(load average {r['load_before_rounds']})")
    return 0 if all(r["same_result"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
