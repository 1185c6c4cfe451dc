"""Benchmark: peak memory of one DETR-R50 train step, visiontf vs the original design vs HuggingFace.

Each model runs in a fresh subprocess (build, one warm-up-free train step: forward + matching +
loss + backward, sizes of ``benchmarks/detr.py``). On CPU the number is the process's peak
resident set size (``VmHWM``, the per-image form of ``getrusage(RUSAGE_SELF).ru_maxrss``: weights,
activations, allocator caches and the Python/torch runtime alike); on CUDA it is ``torch.cuda.max_memory_allocated`` of the
step. Only the measured model is ever built in its process. Ratio = reference peak / ours (> 1: ours uses less).

    .venv/bin/python benchmarks/memory.py [--quick] [--device cuda]
"""
from __future__ import annotations

import argparse
import json
import math
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the own-words baselines: tests/reference/
from benchmarks.common import NUM_THREADS, row  # noqa: E402

KINDS = ("ours", "original", "hf")
REFERENCES = {"original": "original DETR design", "hf": "HF transformers DETR"}


def _peak_rss_mib() -> float:
    """This process image's peak RSS: ``VmHWM`` where /proc has it, else ``ru_maxrss``.

    ``ru_maxrss`` survives fork + exec on Linux, so a child started from a large parent (as under
    ``run_all.py``) would report the parent's peak; ``VmHWM`` starts afresh with the exec'd image.
    """
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _child(kind: str, size: str, device: str, weights: str) -> dict:
    """Runs in the subprocess: one train step of ``kind`` only; returns its peak memory in MiB and the loss.

    Ours and the original load the same original-layout state dict from ``weights`` (the same
    transient copy in both); HF randomises its own weights in place.
    """
    import torch
    from reference.detr import OriginalDETR

    from benchmarks import detr
    from visiontf.models.detr.convert import convert_state_dict

    torch.set_num_threads(NUM_THREADS)
    dev = torch.device(device)
    tiny = size == "tiny"
    B, H, W = detr.SIZES[size]
    images, mask, targets = detr.make_batch(B, H, W, dev)
    if kind == "hf":
        _, model = detr.build_hf(tiny, dev, with_ours=False)
    else:
        state = torch.load(weights, weights_only=True)
        if kind == "ours":
            model = detr._ours(tiny, None)
            state = convert_state_dict(state, model)
        else:
            model = OriginalDETR(num_classes=detr.NUM_CLASSES, **(detr.TINY_MODEL if tiny else {}))
        model.load_state_dict(state)
        del state
        model.to(dev).train()
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
    if kind == "ours":
        loss = detr._ours_step(model, detr.SetCriterion(detr.NUM_CLASSES, detr.HungarianMatcher()).to(dev), images, mask, targets)
    elif kind == "original":
        loss = detr._ref_step(model, detr.SetCriterion(detr.NUM_CLASSES, detr.BatchWideMatcher()).to(dev), images, mask, targets)
    else:
        loss = detr._hf_step(model, images, mask, targets)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        peak = torch.cuda.max_memory_allocated(dev) / 2**20
    else:
        peak = _peak_rss_mib()
    return {"kind": kind, "peak_mib": round(peak, 1), "loss": float(loss)}


def measure(kind: str, size: str, device: str, weights: Path) -> dict:
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--child", kind, "--size", size, "--device", device,
         "--weights", str(weights)],
        capture_output=True, text=True,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"memory child {kind!r} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run(quick: bool = False, device: str = "cpu", tiny: bool = False, hf: bool = True) -> list[dict]:
    """Rows ours vs original (and vs HF): ``ours_s``/``ref_s`` hold peak MiB here (see ``unit``)."""
    import torch
    from reference.detr import OriginalDETR

    from benchmarks import detr

    size = "tiny" if tiny else "quick" if quick else "full"
    with tempfile.TemporaryDirectory() as tmp:
        weights = Path(tmp) / "original.pth"
        torch.manual_seed(0)
        ref = OriginalDETR(num_classes=detr.NUM_CLASSES, **(detr.TINY_MODEL if tiny else {}))
        detr._randomize(ref)
        torch.save(ref.state_dict(), weights)
        del ref
        results = {k: measure(k, size, device, weights) for k in KINDS if hf or k != "hf"}
    ours = results["ours"]
    rows = []
    for kind in ("original", "hf"):
        if kind not in results:
            continue
        ref = results[kind]
        if kind == "original":
            same = abs(ours["loss"] - ref["loss"]) <= 1e-3 * max(1.0, abs(ref["loss"]))
        else:
            # HF's aux-loss decoder differs from the original (benchmarks/detr.py checks parity); finite is all we ask
            same = math.isfinite(ref["loss"])
        rows.append(row(f"detr_r50 train step peak memory ({size}, {device})", ours["peak_mib"], ref["peak_mib"], same,
                        REFERENCES[kind], unit="MiB", measure="peak RSS (VmHWM)" if device == "cpu" else "cuda max_memory_allocated"))
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--no-hf", action="store_true")
    p.add_argument("--child", choices=KINDS, help=argparse.SUPPRESS)
    p.add_argument("--size", default="full", help=argparse.SUPPRESS)
    p.add_argument("--weights", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(_child(args.child, args.size, args.device, args.weights)))
        return 0
    rows = run(args.quick, args.device, hf=not args.no_hf)
    for r in rows:
        print(f"{r['benchmark']}: ours {r['ours_s']:.0f} MiB, {r['reference']} {r['ref_s']:.0f} MiB, "
              f"{r['ratio']:.2f}x, same loss: {r['same_result']}")
    return 0 if all(r["same_result"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
