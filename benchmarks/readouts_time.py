"""Benchmark: what the detection readouts cost on COCO-sized results, beside the COCO evaluation they follow.

On ``benchmarks/coco_eval.py``'s generated data (``--images`` images, 100 detections each, 80 classes), times
in one process: the COCO evaluation with its arrays (faster-coco-eval), the per-class rows read off them,
the confusion matrix, TIDE's breakdown, and the five pictures. ``tools/eval.py`` pays the whole at a
stand-alone validation or a test; a validation during ``fit`` pays the first two only, unless
``readouts.pictures_every_n_epochs`` asks for the rest.

    .venv/bin/python benchmarks/readouts_time.py [--images 1000]
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.coco_eval import make_data
from visiontf.evaluation.coco import evaluate_coco
from visiontf.evaluation.readouts.confusion import detection_confusion_matrix
from visiontf.evaluation.readouts.per_class import per_class_rows
from visiontf.evaluation.readouts.plots import plot_confusion, plot_pr_curves, plot_tide
from visiontf.evaluation.readouts.tide import tide_errors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=1000)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        ann, res, _, _ = make_data(Path(tmp), args.images)
        gt, dets = json.loads(Path(ann).read_text()), json.loads(Path(res).read_text())
        times = {}
        t, c = time.perf_counter(), time.process_time()
        stats = evaluate_coco(ann, res, backend="faster_coco_eval")
        times["COCO evaluation (faster-coco-eval, arrays kept)"] = (time.perf_counter() - t, time.process_time() - c)
        t, c = time.perf_counter(), time.process_time()
        rows = per_class_rows(stats.arrays, gt)
        times["per-class rows"] = (time.perf_counter() - t, time.process_time() - c)
        t, c = time.perf_counter(), time.process_time()
        confusion = detection_confusion_matrix(gt, dets)
        times["confusion matrix"] = (time.perf_counter() - t, time.process_time() - c)
        t, c = time.perf_counter(), time.process_time()
        tide = tide_errors(gt, dets)
        times["TIDE breakdown"] = (time.perf_counter() - t, time.process_time() - c)
        t, c = time.perf_counter(), time.process_time()
        names = {c["id"]: c["name"] for c in gt["categories"]}
        for iou in (0.5, 0.75):
            plot_pr_curves(stats.arrays, names, iou, Path(tmp) / f"pr{iou}.png")
        plot_confusion(confusion, False, Path(tmp) / "cm.png")
        plot_confusion(confusion, True, Path(tmp) / "cmn.png")
        plot_tide(tide, Path(tmp) / "tide.png")
        times["five pictures"] = (time.perf_counter() - t, time.process_time() - c)
    print(f"{args.images} images x 100 detections, {len(rows)} classes (AP {stats['AP']:.3f}, TIDE AP50 {tide.ap:.2f}):")
    print(f"  {'':<50s} {'wall':>7s}   {'CPU':>7s}  (CPU: this process's, which a busy shared machine does not inflate)")
    for what, (wall, cpu) in times.items():
        print(f"  {what:<50s} {wall:7.2f} s {cpu:7.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
