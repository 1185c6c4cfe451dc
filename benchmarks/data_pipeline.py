"""Benchmark: DETR train augmentation throughput, ours (albumentations) vs torchvision.transforms.v2.

Both pipelines do the same ops with DETR's sizes: horizontal flip p 0.5; then p 0.5 either a
resize of the shorter side to 480..800 (longer side <= 1333) or resize to 400/500/600 -> random
crop of 384..600 -> the multi-scale resize; ImageNet normalisation to a float CHW tensor; boxes
carried and filtered. Input: the synthetic COCO-layout shapes set at COCO-like image sizes
(about 480x640), decoded once up front so that only the augmentation is timed (one process,
one thread, as one DataLoader worker runs it).

    .venv/bin/python benchmarks/data_pipeline.py [--quick]
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from visiontf.data.transforms import detection as DT  # noqa: E402
from visiontf.tasks.detection.coco_dataset import CocoDetection  # noqa: E402
from visiontf.tasks.detection.detection_synthetic import make_detection_dataset  # noqa: E402


def torchvision_pipeline():
    """The same augmentation with torchvision.transforms.v2 (its RandomShortestSize, v2 crop)."""
    from torchvision import tv_tensors
    from torchvision.transforms import v2
    from torchvision.transforms.v2 import functional as F

    class RandomSizeCrop(v2.Transform):
        """DETR's RandomSizeCrop: random h, w in [min, max] clipped to the image, random position."""

        def __init__(self, min_size: int, max_size: int):
            super().__init__()
            self.min_size, self.max_size = min_size, max_size

        def make_params(self, flat_inputs):
            h, w = v2.query_size(flat_inputs)
            cw = int(torch.randint(min(self.min_size, w), min(w, self.max_size) + 1, ()))
            ch = int(torch.randint(min(self.min_size, h), min(h, self.max_size) + 1, ()))
            return {"top": int(torch.randint(0, h - ch + 1, ())), "left": int(torch.randint(0, w - cw + 1, ())),
                    "height": ch, "width": cw}

        def transform(self, inpt, params):
            return self._call_kernel(F.crop, inpt, **params)

    scales = list(DT.DETR_SCALES)
    pipe = v2.Compose([
        v2.RandomHorizontalFlip(0.5),
        v2.RandomChoice([
            v2.RandomShortestSize(scales, max_size=DT.DETR_MAX_SIZE),
            v2.Compose([
                v2.RandomShortestSize(list(DT.DETR_CROP_SCALES), max_size=DT.DETR_MAX_SIZE),
                RandomSizeCrop(*DT.DETR_CROP_SIZE),
                v2.RandomShortestSize(scales, max_size=DT.DETR_MAX_SIZE),
            ]),
        ]),
        v2.ClampBoundingBoxes(),
        v2.SanitizeBoundingBoxes(labels_getter=lambda inputs: inputs[1]["labels"]),
        v2.ToDtype(torch.float32, scale=True),
        v2.Normalize(DT.IMAGENET_MEAN, DT.IMAGENET_STD),
    ])

    def prepare(image: np.ndarray, boxes: np.ndarray, labels: np.ndarray):
        h, w = image.shape[:2]
        img = tv_tensors.Image(torch.from_numpy(image).permute(2, 0, 1).contiguous())
        bb = tv_tensors.BoundingBoxes(torch.from_numpy(boxes), format="XYWH", canvas_size=(h, w))
        return img, {"boxes": bb, "labels": torch.from_numpy(labels)}

    def call(img, target):
        return pipe(img, target)

    return prepare, call


def _throughput(fn, samples, min_seconds: float) -> tuple[float, int]:
    for s in samples[:4]:  # warm-up
        fn(*s)
    done, t0 = 0, time.perf_counter()
    while True:
        for s in samples:
            fn(*s)
        done += len(samples)
        elapsed = time.perf_counter() - t0
        if elapsed >= min_seconds:
            return done / elapsed, done


def run(quick: bool = False) -> list[dict]:
    import cv2

    # One thread each, as inside a DataLoader worker; OpenCV would otherwise use every core.
    torch.set_num_threads(1)
    cv2.setNumThreads(1)
    torch.manual_seed(0)
    n_images, min_seconds = (16, 2.0) if quick else (64, 8.0)
    with tempfile.TemporaryDirectory() as tmp:
        paths = make_detection_dataset(tmp, num_train=n_images, num_val=1, seed=0, image_size=(480, 640))
        ds = CocoDetection(paths["train_images"], paths["train_ann"], DT.build_train_transforms(seed=0))
        from visiontf.data.io import read_image

        decoded = [(read_image(paths["train_images"] / info["file_name"]), ds.index.boxes[i], ds.index.labels[i])
                   for i, info in enumerate(ds.index.images)]
    ours_tf = ds.transforms

    def ours(image, boxes, labels):
        return ours_tf(image=image, bboxes=boxes, labels=labels, ann_index=np.arange(len(boxes)))

    prepare, tv_call = torchvision_pipeline()
    tv_samples = [prepare(*s) for s in decoded]  # tensor conversion is the reference's input format
    ours_ips, ours_n = _throughput(ours, decoded, min_seconds)
    ref_ips, ref_n = _throughput(tv_call, tv_samples, min_seconds)
    return [{
        "benchmark": "detr_train_augmentation",
        "images": n_images,
        "image_size": "480x640 (+-20%)",
        "ours_img_per_s": round(ours_ips, 1),
        "ref_img_per_s": round(ref_ips, 1),
        "ours_s": round(1.0 / ours_ips, 5),
        "ref_s": round(1.0 / ref_ips, 5),
        "ratio": round(ours_ips / ref_ips, 2),
        "same_result": None,  # random pipelines: same ops, not the same draws
        "samples_timed": {"ours": ours_n, "ref": ref_n},
    }]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    args = p.parse_args(argv)
    for r in run(args.quick):
        print(json.dumps(r))
        print(f"ours {r['ours_img_per_s']} img/s vs torchvision.transforms.v2 {r['ref_img_per_s']} img/s "
              f"({r['ratio']}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
