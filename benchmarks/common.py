"""Shared helpers of the benchmarks: device choice, interleaved timing, row printing.

Ours and the reference are always timed in the same process, alternating one repeat of each, so
that load from other processes on a shared machine hits both alike; the median is reported.
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
# scripts run from a checkout that is not pip-installed: make ``visiontf`` and ``benchmarks`` importable
for _p in (str(REPO),):
    if _p not in sys.path:
        sys.path.insert(0, _p)

#: benchmarks share a 2-core machine; more threads only add contention and noise
NUM_THREADS = 2
ROW_KEYS = ("benchmark", "ours_s", "ref_s", "ratio", "same_result")


def setup_torch(threads: int = NUM_THREADS) -> None:
    """Fix the intra-op thread count (the timings in docs/record/speed.md use 2)."""
    torch.set_num_threads(threads)


def pick_device(device: str | None) -> torch.device:
    """``"cpu"``, ``"cuda"`` or None (cuda when available); a clear error if cuda is asked for but absent."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda asked for, but torch.cuda.is_available() is False on this machine")
    return dev


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextlib.contextmanager
def tf32_off() -> Iterator[None]:
    """Float32 convolutions and matrix products on CUDA within the block, for parity checks.

    cuDNN's convolutions run in TF32 by default (``torch.backends.cudnn.allow_tf32``): two
    implementations that round at different places then differ by 1e-5..1e-3, which is not a
    difference of the models (``benchmarks/gpu_detr_parity.py``). Timings keep the defaults.
    """
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def time_interleaved(
    fns: dict[str, Callable[[], object]],
    device: torch.device | str = "cpu",
    warmup: int = 1,
    repeats: int = 5,
) -> dict[str, float]:
    """Median seconds per call of each function, alternating the functions at every repeat.

    ``warmup`` untimed rounds first (allocator, oneDNN primitive caches, cuDNN autotuning).
    """
    device = torch.device(device)
    times: dict[str, list[float]] = {name: [] for name in fns}
    for r in range(warmup + repeats):
        for name, fn in fns.items():
            sync(device)
            t0 = time.perf_counter()
            fn()
            sync(device)
            if r >= warmup:
                times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(t) for name, t in times.items()}


def median_of_rounds(measures: dict[str, Callable[[], float]], rounds: int) -> dict[str, float]:
    """The median of what each callable returns (a time it measured itself, such as a fit's median step), the
    callables alternating over ``rounds`` rounds so that other load on the machine hits each alike."""
    values: dict[str, list[float]] = {name: [] for name in measures}
    for _ in range(rounds):
        for name, measure in measures.items():
            values[name].append(measure())
    return {name: statistics.median(v) for name, v in values.items()}


def print_against_first(step_seconds: dict[str, float]) -> None:
    """One line a variant: its step in ms and its ratio to the first variant's."""
    first = next(iter(step_seconds.values()))
    print(f"{'variant':60s} {'ms/step':>8s} {'vs first row':>12s}")
    for name, t in step_seconds.items():
        print(f"{name:60s} {1000 * t:8.1f} {t / first:11.2f}x")


def row(benchmark: str, ours_s: float, ref_s: float, same_result: bool, reference: str, **extra) -> dict:
    """One result row; ``ratio`` = reference time / our time (> 1: ours is faster)."""
    return {
        "benchmark": benchmark,
        "reference": reference,
        # full precision: rounding here made ratio and times disagree at millisecond scales
        "ours_s": float(ours_s),
        "ref_s": float(ref_s),
        "ratio": float(ref_s) / float(ours_s) if ours_s > 0 else float("nan"),
        "same_result": bool(same_result),
        **extra,
    }


def format_table(rows: Iterable[dict]) -> str:
    """A fixed-width text table: benchmark | ours | reference | ratio | same result."""
    rows = list(rows)
    header = ("benchmark", "reference", "ours (s)", "ref (s)", "ratio", "same result")
    lines = [[str(r["benchmark"]), str(r.get("reference", "")), f"{r['ours_s']:.4f}", f"{r['ref_s']:.4f}",
              f"{r['ratio']:.2f}x", str(r["same_result"])] for r in rows]
    widths = [max(len(h), *(len(line[i]) for line in lines)) if lines else len(h) for i, h in enumerate(header)]
    fmt = " | ".join(f"{{:<{w}}}" for w in widths)
    out = [fmt.format(*header), "-+-".join("-" * w for w in widths)]
    out += [fmt.format(*line) for line in lines]
    return "\n".join(out)


def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.detach().float().cpu() - b.detach().float().cpu()).abs().max().item()


def cli(run: Callable[..., list[dict]], doc: str, argv: Sequence[str] | None = None, extra: Callable | None = None) -> int:
    """``--quick`` / ``--device`` command line around a ``run(quick, device, ...)`` function."""
    p = argparse.ArgumentParser(description=doc.strip().splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smaller sizes and fewer repeats")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    if extra is not None:
        extra(p)
    args = vars(p.parse_args(argv))
    setup_torch()
    rows = run(**args)
    print(format_table(rows))
    return 0 if all(r["same_result"] for r in rows) else 1
