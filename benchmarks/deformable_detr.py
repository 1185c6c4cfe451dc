"""Benchmark: Deformable DETR R50 (box refinement) train step, inference and peak memory vs the original design.

Rows (ratio = reference / ours, > 1: ours better):

* ``train step``: forward + matching + focal set loss + backward of
  ``deformable_detr_resnet50_box_refine`` against the ORIGINAL design
  (:mod:`reference.deformable_detr`: the original's module tree, per-level loops,
  elementwise frozen BN, contiguous NCHW and its pure-PyTorch attention core
  ``ms_deform_attn_core_pytorch``; the original's batch-wide focal matcher), identical weights,
  dropout off. The loss is visiontf's ``SetCriterion(class_loss="focal")`` for both (its maths is
  the original's, ``tests/set_prediction/test_deformable_detr_criterion.py``), so the rows compare models and
  matchers. Batch 2 at 512x640 (``--quick``: 384x512), the second image padded as in a real batch.
* ``inference``: eval-mode forward under ``no_grad``.
* ``peak memory``: each model in a fresh subprocess, one train step; peak RSS (``VmHWM``) on CPU,
  ``torch.cuda.max_memory_allocated`` on CUDA. Ratio = reference peak / ours.
* ``attention``: one ``MSDeformAttn`` (d 256, 8 heads, 4 levels, 4 points), forward + backward,
  visiontf's gather core against the original module with its ``ms_deform_attn_core_pytorch``, at
  the encoder's size (every position queries, at the train step's image size) and the decoder's
  (300 queries), same weights.

Ours and the reference are timed in the same process, alternating one repeat each
(:func:`benchmarks.common.time_interleaved`), so load from other processes hits both alike.

    .venv/bin/python benchmarks/deformable_detr.py [--quick] [--device cuda] [--no-memory] [--profile]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import NUM_THREADS, format_table, pick_device, row, setup_torch, time_interleaved  # noqa: E402
from benchmarks.detr import _close, _randomize, make_batch  # noqa: E402
from benchmarks.memory import _peak_rss_mib  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the own-words baselines: tests/reference/
from reference.deformable_detr import OriginalDeformableDETR, original_match  # noqa: E402

from visiontf.models import create_model  # noqa: E402
from visiontf.models.deformable_detr.build import build_deformable_detr  # noqa: E402
from visiontf.models.deformable_detr.convert import convert_state_dict  # noqa: E402
from visiontf.models.deformable_detr.deformable_detr import DeformableDETR  # noqa: E402
from visiontf.set_prediction import HungarianMatcher, SetCriterion  # noqa: E402

NUM_CLASSES = 91
MODEL = "deformable_detr_resnet50_box_refine"
SIZES = {"full": (2, 512, 640), "quick": (2, 384, 512), "tiny": (2, 64, 96)}
#: the smoke test's model: both layouts at toy size (ResNet-18, d 64, 1+1 layers, 10 queries)
TINY_REF = dict(backbone="resnet18", d=64, nheads=4, enc_layers=1, dec_layers=1, dim_feedforward=96, num_queries=10)
TINY_OURS = dict(backbone="resnet18", hidden_dim=64, nheads=4, enc_layers=1, dec_layers=1, dim_feedforward=96, num_queries=10)


class OriginalMatcher(nn.Module):
    """The original's batch-wide focal matcher as a SetCriterion matcher."""

    def forward(self, outputs, targets):
        return original_match(outputs, targets)


def _reference(tiny: bool) -> OriginalDeformableDETR:
    return OriginalDeformableDETR(num_classes=NUM_CLASSES, with_box_refine=True, dropout=0.0, **(TINY_REF if tiny else {}))


def _ours(tiny: bool) -> DeformableDETR:
    """The registered model (channels-last, folded frozen BN, gather attention), dropout off."""
    if tiny:
        return build_deformable_detr(DeformableDETR, num_classes=NUM_CLASSES, with_box_refine=True, dropout=0.0, **TINY_OURS)
    return create_model(MODEL, num_classes=NUM_CLASSES, dropout=0.0)


def _criteria(device: torch.device) -> tuple[SetCriterion, SetCriterion]:
    ours = SetCriterion(NUM_CLASSES, HungarianMatcher(cost_class=2.0, class_cost="focal"), class_loss="focal")
    ref = SetCriterion(NUM_CLASSES, OriginalMatcher(), class_loss="focal")
    return ours.to(device), ref.to(device)


def build_models(tiny: bool, device: torch.device):
    """(ours, original) with identical weights, dropout off, train mode."""
    torch.manual_seed(0)
    ref = _reference(tiny)
    _randomize(ref)
    ours = _ours(tiny)
    ours.load_state_dict(convert_state_dict(ref.state_dict(), ours))
    return ours.to(device).train(), ref.to(device).train()


def _step(model, criterion, images, mask, targets):
    model.zero_grad(set_to_none=True)
    loss = criterion(model(images, mask), targets)["loss"]
    loss.backward()
    return loss.detach()


def _repeats(quick: bool, tiny: bool) -> tuple[int, int]:
    return (0, 1) if tiny else ((1, 3) if quick else (1, 5))


def bench_speed(quick: bool, device: torch.device, tiny: bool = False) -> list[dict]:
    size = "tiny" if tiny else "quick" if quick else "full"
    B, H, W = SIZES[size]
    images, mask, targets = make_batch(B, H, W, device)
    ours, ref = build_models(tiny, device)
    crit, ref_crit = _criteria(device)
    warmup, repeats = _repeats(quick, tiny)
    label = f"deformable_detr_r50_box_refine {{}} b{B} {H}x{W}"

    l_ours = _step(ours, crit, images, mask, targets)
    l_ref = _step(ref, ref_crit, images, mask, targets)
    # the first refinement head's gradient goes through every layer, the attention included
    g_ours = ours.bbox_embed[0].layers[0].weight.grad
    g_ref = ref.bbox_embed[0].layers[0].weight.grad
    same_train = _close(l_ours, l_ref) and torch.allclose(g_ours, g_ref, rtol=1e-3, atol=1e-5)
    t = time_interleaved(
        {"ours": lambda: _step(ours, crit, images, mask, targets), "ref": lambda: _step(ref, ref_crit, images, mask, targets)},
        device, warmup, repeats,
    )
    rows = [row(label.format("train step"), t["ours"], t["ref"], same_train, "original Deformable DETR design",
                loss_ours=round(float(l_ours), 5), loss_ref=round(float(l_ref), 5), device=str(device))]
    ours.eval()
    ref.eval()
    with torch.no_grad():
        out, expected = ours(images, mask), ref(images, mask)
        same = bool((out["pred_boxes"] - expected["pred_boxes"]).abs().max() < 1e-4
                    and (out["pred_logits"] - expected["pred_logits"]).abs().max() < 1e-3)
        t = time_interleaved({"ours": lambda: ours(images, mask), "ref": lambda: ref(images, mask)}, device, warmup, repeats)
    rows.append(row(label.format("inference"), t["ours"], t["ref"], same, "original Deformable DETR design", device=str(device)))
    return rows


# ------------------------------------------------------------------------------ attention alone
def bench_attention(quick: bool, device: torch.device, tiny: bool = False) -> list[dict]:
    """One deformable attention, forward + backward: ours (gather core) vs the original module."""
    from reference.deformable_detr import MSDeformAttn as OriginalMSDeformAttn

    from visiontf.nn import MSDeformAttn

    B, H, W = SIZES["tiny" if tiny else "quick" if quick else "full"]
    shapes = [(-(-H // s), -(-W // s)) for s in (8, 16, 32, 64)]
    S = sum(h * w for h, w in shapes)
    torch.manual_seed(0)
    ours = MSDeformAttn(256, 4, 8, 4).to(device)
    with torch.no_grad():  # trained-like offsets and weights (both start at zero)
        ours.sampling_offsets.weight.normal_(0, 0.01)
        ours.attention_weights.weight.normal_(0, 0.01)
    ref = OriginalMSDeformAttn(256, 4, 8, 4).to(device)
    ref.load_state_dict(ours.state_dict())
    spatial = torch.tensor(shapes, device=device)
    start = torch.cat([spatial.new_zeros(1), spatial.prod(1).cumsum(0)[:-1]])
    centres = [torch.stack(torch.meshgrid((torch.arange(w) + 0.5) / w, (torch.arange(h) + 0.5) / h, indexing="xy"), -1).view(-1, 2)
               for h, w in shapes]
    cases = {"encoder": (S, torch.cat(centres)[None, :, None].expand(B, S, 4, 2)), "decoder": (300, torch.rand(B, 300, 4, 2))}
    warmup, repeats = _repeats(quick, tiny)
    rows = []
    for name, (Q, points) in cases.items():
        points = points.contiguous().to(device)
        query, value = torch.randn(B, Q, 256, device=device), torch.randn(B, S, 256, device=device)

        def run(module, original, query=query, value=value, points=points):
            q, v = query.clone().requires_grad_(), value.clone().requires_grad_()
            out = module(q, points, v, spatial, start) if original else module(q, points, v, shapes)
            out.square().sum().backward()
            return out.detach(), q.grad, v.grad

        got, expected = run(ours, False), run(ref, True)
        same = all(torch.allclose(a, b, rtol=1e-3, atol=1e-4) for a, b in zip(got, expected))
        t = time_interleaved({"ours": lambda: run(ours, False), "ref": lambda: run(ref, True)}, device, warmup, repeats)
        rows.append(row(f"ms_deform_attn {name} fwd+bwd b{B} {Q} queries, {S} values", t["ours"], t["ref"], same,
                        "original ms_deform_attn_core_pytorch", device=str(device)))
    return rows


# ------------------------------------------------------------------------------ peak memory
def _memory_child(kind: str, size: str, device: str, weights: str) -> dict:
    """In a fresh process: build one model from the shared weights, one train step, peak memory."""
    torch.set_num_threads(NUM_THREADS)
    dev = torch.device(device)
    tiny = size == "tiny"
    B, H, W = SIZES[size]
    images, mask, targets = make_batch(B, H, W, dev)
    state = torch.load(weights, weights_only=True)
    model = _ours(tiny) if kind == "ours" else _reference(tiny)
    model.load_state_dict(convert_state_dict(state, model) if kind == "ours" else state)
    del state
    model.to(dev).train()
    crit, ref_crit = _criteria(dev)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
    loss = _step(model, crit if kind == "ours" else ref_crit, images, mask, targets)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        peak = torch.cuda.max_memory_allocated(dev) / 2**20
    else:
        peak = _peak_rss_mib()
    return {"kind": kind, "peak_mib": round(peak, 1), "loss": float(loss)}


def bench_memory(quick: bool, device: torch.device, tiny: bool = False) -> list[dict]:
    size = "tiny" if tiny else "quick" if quick else "full"
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        weights = Path(tmp) / "original.pth"
        torch.manual_seed(0)
        ref = _reference(tiny)
        _randomize(ref)
        torch.save(ref.state_dict(), weights)
        del ref
        for kind in ("ours", "original"):
            proc = subprocess.run(
                [sys.executable, str(Path(__file__).resolve()), "--child", kind, "--size", size, "--device", str(device),
                 "--weights", str(weights)],
                capture_output=True, text=True,
            )
            if proc.returncode != 0:
                raise RuntimeError(f"memory child {kind!r} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
            results[kind] = json.loads(proc.stdout.strip().splitlines()[-1])
    ours, ref = results["ours"], results["original"]
    same = abs(ours["loss"] - ref["loss"]) <= 1e-3 * max(1.0, abs(ref["loss"]))
    B, H, W = SIZES[size]
    return [row(f"deformable_detr_r50_box_refine train step peak memory b{B} {H}x{W} ({device})", ours["peak_mib"], ref["peak_mib"],
                same, "original Deformable DETR design", unit="MiB",
                measure="peak RSS (VmHWM)" if device.type == "cpu" else "cuda max_memory_allocated")]


def profile(quick: bool, device: torch.device, row_limit: int = 12) -> dict[str, str]:
    """torch.profiler top ops (self CPU time) of one train step of ours and of the original."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as tprofile

    B, H, W = SIZES["quick" if quick else "full"]
    images, mask, targets = make_batch(B, H, W, device)
    ours, ref = build_models(False, device)
    crit, ref_crit = _criteria(device)
    tables = {}
    for name, model, c in (("ours", ours, crit), ("original", ref, ref_crit)):
        _step(model, c, images, mask, targets)
        with tprofile(activities=[ProfilerActivity.CPU]) as prof:
            _step(model, c, images, mask, targets)
        tables[name] = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=row_limit)
    return tables


def run(quick: bool = False, device: str = "cpu", tiny: bool = False, memory: bool = True) -> list[dict]:
    """Rows for ``run_all.py``."""
    dev = pick_device(device)
    rows = bench_speed(quick, dev, tiny)
    if memory:
        rows += bench_memory(quick, dev, tiny)
    return rows + bench_attention(quick, dev, tiny)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="384x512 images, 3 repeats")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory subprocesses")
    p.add_argument("--profile", action="store_true", help="only print the profiler tables")
    p.add_argument("--child", choices=("ours", "original"), help=argparse.SUPPRESS)
    p.add_argument("--size", default="full", help=argparse.SUPPRESS)
    p.add_argument("--weights", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(_memory_child(args.child, args.size, args.device, args.weights)))
        return 0
    setup_torch()
    if args.profile:
        for name, table in profile(args.quick, pick_device(args.device)).items():
            print(f"== {name} ==\n{table}")
        return 0
    rows = run(args.quick, args.device, memory=not args.no_memory)
    print(format_table(rows))
    return 0 if all(r["same_result"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
