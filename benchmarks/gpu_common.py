"""Helpers of the GPU benchmark (:mod:`benchmarks.gpu`): a global time budget, event timing, peak memory, the table.

Ours and the references are timed alternately in one process (as :mod:`benchmarks.common`), on
CUDA with device events around ``inner`` back-to-back calls after a warm-up (allocator, cuDNN and
Triton autotuning, compilation), the median of ``repeats`` reported.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from benchmarks.common import sync


@dataclass
class Budget:
    """Seconds left of the whole run; a row that would not fit is skipped with a note instead of run."""

    seconds: float
    start: float = field(default_factory=time.monotonic)
    notes: list[str] = field(default_factory=list)

    def left(self) -> float:
        return self.seconds - (time.monotonic() - self.start)

    def allows(self, what: str, needs_s: float) -> bool:
        """Whether ``needs_s`` more seconds fit; if not, note ``what`` as skipped."""
        if self.left() >= needs_s:
            return True
        self.notes.append(f"skipped (time budget: {self.left():.0f} s left, about {needs_s:.0f} s needed): {what}")
        return False


def time_alternating(fns: dict[str, Callable[[], object]], device: torch.device, warmup: int = 2, repeats: int = 5,
                     inner: int = 1) -> dict[str, float]:
    """Median seconds per call of each function, alternating the functions at every repeat."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    sync(device)
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            if device.type == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(inner):
                    fn()
                end.record()
                end.synchronize()
                times[name].append(start.elapsed_time(end) / 1000.0 / inner)
            else:
                t0 = time.perf_counter()
                for _ in range(inner):
                    fn()
                times[name].append((time.perf_counter() - t0) / inner)
    return {name: statistics.median(t) for name, t in times.items()}


def peak_memory_mib(fn: Callable[[], object], device: torch.device) -> float | None:
    """Peak GPU memory allocated while ``fn`` runs (after it ran once: a train step's steady state), MiB; None on CPU."""
    if device.type != "cuda":
        return None
    fn()
    sync(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    sync(device)
    return torch.cuda.max_memory_allocated(device) / 2**20


def free_cuda() -> None:
    """Give cached blocks back between sections, so each section's peak memory is its own."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def markdown_table(rows: list[dict]) -> str:
    """One line per row: section | benchmark | ours | reference | ours | ref | ratio (ref / ours) | same | notes."""
    header = "| section | benchmark | reference | ours | ref | ratio | same result | notes |\n|---|---|---|---|---|---|---|---|"
    lines = [header]
    def fmt(v: float, unit: str) -> str:
        if v != v:  # NaN: not measured
            return "-"
        return f"{1000 * v:.3f} ms" if unit == "s" else f"{v:.4g} {unit}"

    for r in rows:
        ours, ref = fmt(r["ours_s"], r.get("unit", "s")), fmt(r["ref_s"], r.get("unit", "s"))
        ratio = f"{r['ratio']:.2f}x" if r["ratio"] == r["ratio"] else "-"
        same = {True: "yes", False: "NO"}.get(r["same_result"], str(r["same_result"]))
        lines.append(f"| {r.get('section', '')} | {r['benchmark']} | {r.get('reference', '')} | {ours} | {ref} | {ratio} | {same} "
                     f"| {r.get('notes', '')} |")
    return "\n".join(lines)


def gpu_row(section: str, benchmark: str, reference: str, ours: float, ref: float, same: bool | None, unit: str = "s",
            notes: str = "", **extra) -> dict:
    """A table row; ``ratio`` = ref / ours (times and memory: > 1 means ours is better); ``same`` None: not checked."""
    nan = float("nan")
    ours, ref = (nan if ours is None else float(ours)), (nan if ref is None else float(ref))
    return {"section": section, "benchmark": benchmark, "reference": reference, "ours_s": ours, "ref_s": ref,
            "ratio": ref / ours if ours == ours and ref == ref and ours > 0 else nan,
            "same_result": "not checked" if same is None else bool(same), "unit": unit, "notes": notes, **extra}
