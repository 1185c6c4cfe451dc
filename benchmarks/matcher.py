"""Benchmark: per-image-block Hungarian matcher vs the original DETR's batch-wide cost matrix.

Batch 64, 100 queries, 1-50 random targets per image. Both matchers must return identical
matches; the script prints the median time of each and the speed-up.

    .venv/bin/python benchmarks/matcher.py [--quick] [--device cuda]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from scipy.optimize import linear_sum_assignment
from torchvision.ops import box_convert, generalized_box_iou

# Run as a script from a checkout that is not pip-installed: make the repository importable.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from visiontf.set_prediction import HungarianMatcher  # noqa: E402


@torch.no_grad()
def reference_batchwide_match(outputs, targets, cost_class=1.0, cost_bbox=5.0, cost_giou=2.0):
    """REFERENCE DESIGN (facebookresearch/detr ``HungarianMatcher``): one (B*Q) x sum(N) cost.

    Every query is costed against every target of the batch, the whole matrix is copied to the
    CPU, and only the diagonal blocks are solved. Kept here (float32 maths) as the baseline.
    """
    bs, nq = outputs["pred_logits"].shape[:2]
    prob = outputs["pred_logits"].float().flatten(0, 1).softmax(-1)
    out_bbox = outputs["pred_boxes"].float().flatten(0, 1)
    tgt_ids = torch.cat([t["labels"] for t in targets])
    tgt_bbox = torch.cat([t["boxes"] for t in targets]).float()
    c_class = -prob[:, tgt_ids]
    c_bbox = torch.cdist(out_bbox, tgt_bbox, p=1)
    c_giou = -generalized_box_iou(
        box_convert(out_bbox, "cxcywh", "xyxy"), box_convert(tgt_bbox, "cxcywh", "xyxy")
    )
    cost = (cost_bbox * c_bbox + cost_class * c_class + cost_giou * c_giou).view(bs, nq, -1).cpu()
    sizes = [len(t["boxes"]) for t in targets]
    out = []
    for i, c in enumerate(cost.split(sizes, -1)):
        r, k = linear_sum_assignment(c[i])
        out.append((torch.as_tensor(r, dtype=torch.int64), torch.as_tensor(k, dtype=torch.int64)))
    return out


def make_batch(batch: int, queries: int, num_classes: int, max_targets: int, device, seed: int = 0):
    """Random DETR-like outputs and targets (1..max_targets boxes per image)."""
    g = torch.Generator().manual_seed(seed)
    outputs = {
        "pred_logits": torch.randn(batch, queries, num_classes + 1, generator=g).to(device),
        "pred_boxes": torch.cat(
            [torch.rand(batch, queries, 2, generator=g), 0.05 + 0.4 * torch.rand(batch, queries, 2, generator=g)],
            -1,
        ).to(device),
    }
    targets = []
    for _ in range(batch):
        n = int(torch.randint(1, max_targets + 1, (1,), generator=g))
        boxes = torch.cat([torch.rand(n, 2, generator=g), 0.05 + 0.4 * torch.rand(n, 2, generator=g)], -1)
        labels = torch.randint(0, num_classes, (n,), generator=g)
        targets.append({"labels": labels.to(device), "boxes": boxes.to(device)})
    return outputs, targets


def _median_time(fn: Callable[[], object], device: torch.device, warmup: int, repeats: int) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        fn()  # both matchers end with a host copy, so the GPU work is inside the timing
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _same(a, b) -> bool:
    return len(a) == len(b) and all(
        torch.equal(qa, qb) and torch.equal(ta, tb) for (qa, ta), (qb, tb) in zip(a, b)
    )


def run(quick: bool = False, device: str | None = None) -> list[dict[str, object]]:
    """Time both matchers on batch 64 x 100 queries; rows for ``benchmarks/run_all.py``."""
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    outputs, targets = make_batch(64, 100, 91, 50, dev)
    matcher = HungarianMatcher(cost_class=1.0, cost_bbox=5.0, cost_giou=2.0)

    ours = matcher(outputs, targets)
    ref = reference_batchwide_match(outputs, targets)
    same = _same(ours, ref)
    assert same, "per-image matcher and batch-wide reference disagree"

    warmup, repeats = (2, 5) if quick else (3, 15)
    ours_s = _median_time(lambda: matcher(outputs, targets), dev, warmup, repeats)
    ref_s = _median_time(lambda: reference_batchwide_match(outputs, targets), dev, warmup, repeats)
    return [
        {
            "benchmark": "matcher b64 q100",
            "device": str(dev),
            "targets": sum(len(t["labels"]) for t in targets),
            "ours_s": ours_s,
            "ref_s": ref_s,
            "ratio": ref_s / ours_s,
            "same_result": same,
        }
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    args = parser.parse_args()
    for row in run(args.quick, args.device):
        print(
            f"{row['benchmark']} on {row['device']} ({row['targets']} targets): "
            f"ours {row['ours_s'] * 1e3:.2f} ms, batch-wide reference {row['ref_s'] * 1e3:.2f} ms, "
            f"speed-up {row['ratio']:.1f}x, identical matches: {row['same_result']}"
        )


if __name__ == "__main__":
    main()
