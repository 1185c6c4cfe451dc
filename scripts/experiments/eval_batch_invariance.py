"""How much an image's evaluation depends on its batch neighbours, per family (random weights, CPU).

Eight images of three sizes (an ordinary mixed-size evaluation set). Each family is run with every
image alone (batch 1, the reference) and in batches of 2 and 8, two ways:

* ``padded``: consecutive images zero-padded to the batch's largest size (visiontf before size
  buckets, and the originals' evaluation loaders);
* ``bucketed``: only images of one size per batch (:func:`visiontf.data.batching.size_buckets`,
  what evaluation and prediction do now).

Detection (detr_tiny, dino_tiny): the largest change of any kept detection's score, and COCO mAP of
the batched detections against the batch-1 detections as truth (1.0 = identical detections).
Segmentation (SETR naive, tiny, slide inference as the synthetic recipe): the share of pixels whose
predicted class differs from batch 1, each image scored on its own (unpadded) extent.

    python scripts/experiments/eval_batch_invariance.py [--seed 0]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.common import setup_torch  # noqa: E402, F401
from visiontf.data.batching import pad_images, size_buckets  # noqa: E402
from visiontf.models import create_model  # noqa: E402

SIZES = [(64, 80), (80, 64), (64, 80), (72, 72), (64, 80), (80, 64), (64, 80), (72, 72)]
BATCHES = (2, 8)
DETECTORS = {
    "detr_tiny": {"hidden_dim": 32, "nheads": 2, "enc_layers": 1, "dec_layers": 2, "dim_feedforward": 64, "num_queries": 20},
    "dino_tiny": {"hidden_dim": 32, "nheads": 2, "enc_layers": 1, "dec_layers": 2, "dim_feedforward": 64, "num_queries": 20},
}


def _batches(n: int, batch_size: int, how: str) -> list[list[int]]:
    if how == "padded":
        return [list(range(i, min(n, i + batch_size))) for i in range(0, n, batch_size)]
    return size_buckets(SIZES[:n], batch_size)


@torch.no_grad()
def _detections(model, images: list[torch.Tensor], batch_size: int, how: str) -> list[dict]:
    from visiontf.set_prediction import build_postprocess

    out: list[dict] = [{} for _ in images]
    post = build_postprocess(model)
    for group in _batches(len(images), batch_size, how):
        batch = pad_images([images[i] for i in group])
        outputs = model(batch.images, batch.mask)
        sizes = torch.tensor([tuple(images[i].shape[-2:]) for i in group])
        for i, p in zip(group, post(outputs, sizes)):
            out[i] = p
    return out


def _coco_map(truth: list[dict], found: list[dict]) -> float:
    """mAP of ``found`` against every detection of ``truth`` (1.0 when they are the same)."""
    from visiontf.evaluation.coco import evaluate_coco

    images, anns, dets = [], [], []
    for i, (t, f) in enumerate(zip(truth, found)):
        h, w = SIZES[i]
        images.append({"id": i + 1, "width": w, "height": h})
        for b, lab in zip(t["boxes"].tolist(), t["labels"].tolist()):
            anns.append({"id": len(anns) + 1, "image_id": i + 1, "category_id": int(lab) + 1, "iscrowd": 0,
                         "bbox": [b[0], b[1], b[2] - b[0], b[3] - b[1]], "area": (b[2] - b[0]) * (b[3] - b[1])})
        for b, lab, s in zip(f["boxes"].tolist(), f["labels"].tolist(), f["scores"].tolist()):
            dets.append({"image_id": i + 1, "category_id": int(lab) + 1, "score": s, "bbox": [b[0], b[1], b[2] - b[0], b[3] - b[1]]})
    cats = [{"id": c, "name": str(c)} for c in range(1, 4)]
    stats = evaluate_coco({"images": images, "annotations": anns, "categories": cats}, dets, backend="pycocotools")
    return float(stats["AP"])


def detection_rows(seed: int) -> list[str]:
    rows = []
    for name, kwargs in DETECTORS.items():
        torch.manual_seed(seed)
        model = create_model(name, num_classes=3, **kwargs).eval()
        g = torch.Generator().manual_seed(seed)
        images = [(torch.rand(3, h, w, generator=g) - 0.5) / 0.25 for h, w in SIZES]
        alone = _detections(model, images, 1, "bucketed")
        for how in ("padded", "bucketed"):
            for b in BATCHES:
                got = _detections(model, images, b, how)
                diff = max(float((x["scores"] - y["scores"]).abs().max()) for x, y in zip(alone, got))
                rows.append(f"| {name} | {how} | {b} | {diff:.2e} | {_coco_map(alone, got):.4f} |")
    return rows


@torch.no_grad()
def segmentation_rows(seed: int) -> list[str]:
    from visiontf.tasks.segmentation.segmentation_task import SegmentationTask

    torch.manual_seed(seed)
    task = SegmentationTask("setr_naive_vit_tiny_patch16", num_classes=4, inference_mode="slide", crop_size=64, stride=32,
                            model_kwargs={"img_size": 64, "drop_path_rate": 0.0,
                                          "encoder_kwargs": {"patch_size": 8, "depth": 4}}).eval()
    g = torch.Generator().manual_seed(seed)
    images = [torch.randn(3, h, w, generator=g) for h, w in SIZES]

    def labels(batch_size: int, how: str) -> list[torch.Tensor]:
        out: list[torch.Tensor] = [torch.empty(0)] * len(images)
        for group in _batches(len(images), batch_size, how):
            pred = task.predict_logits(pad_images([images[i] for i in group]).images).argmax(1)
            for j, i in enumerate(group):
                h, w = SIZES[i]
                out[i] = pred[j, :h, :w]
        return out

    alone = labels(1, "bucketed")
    rows = []
    for how in ("padded", "bucketed"):
        for b in BATCHES:
            got = labels(b, how)
            changed = sum(int((x != y).sum()) for x, y in zip(alone, got)) / sum(x.numel() for x in alone)
            rows.append(f"| setr_naive (slide) | {how} | {b} | {changed:.2%} of pixels | - |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    setup_torch()
    print("| model | batches | batch size | largest change vs batch 1 | mAP vs batch-1 detections |")
    print("|---|---|---|---|---|")
    for row in detection_rows(args.seed) + segmentation_rows(args.seed):
        print(row, flush=True)


if __name__ == "__main__":
    main()
