"""Run every benchmark, print one table (benchmark | reference | ours | ref | ratio | same result), write JSON.

    .venv/bin/python benchmarks/run_all.py [--quick] [--device cpu|cuda] [--output results.json] [--only detr,vit]

``ratio`` is always "how many times better ours is": reference time / ours for timings, reference
peak / ours for memory (``unit`` MiB), our images/s / reference images/s for the augmentation.
``--quick`` (smaller inputs, fewer repeats) takes about 7-9 minutes on a quiet 2-core CPU, plus a
few minutes for ``deformable_detr`` (the original design's train step is the slow part).
"""
from __future__ import annotations

import argparse
import json
import logging
import platform
import sys
import time
import traceback
from collections.abc import Callable
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import format_table, setup_torch  # noqa: E402

log = logging.getLogger(__name__)


def _benchmarks(device: str) -> dict[str, Callable[[bool], list[dict]]]:
    from benchmarks import (
        coco_eval,
        cpu_attention,
        data_pipeline,
        deformable_detr,
        detr,
        matcher,
        memory,
        predict_memory,
        vit_vs_timm,
    )

    return {
        "vit": lambda quick: vit_vs_timm.run(quick, device),
        "detr": lambda quick: detr.run(quick, device),
        "deformable_detr": lambda quick: deformable_detr.run(quick, device),
        "matcher": lambda quick: matcher.run(quick, device),
        "memory": lambda quick: memory.run(quick, device),
        # whole-process / data-loader benchmarks: CPU only by design
        "coco_eval": lambda quick: coco_eval.run(quick),
        "cpu_attention": lambda quick: cpu_attention.run(quick, "cpu"),
        "data_pipeline": lambda quick: data_pipeline.run(quick),
        "predict_memory": lambda quick: predict_memory.run(quick),
    }


def machine_info() -> dict:
    import torch

    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info = {"date": date.today().isoformat(), "torch": torch.__version__, "python": platform.python_version(),
            "cpu": cpu, "threads": torch.get_num_threads()}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def run_all(quick: bool, device: str, only: list[str] | None = None) -> tuple[list[dict], list[str]]:
    """All rows, and the names of benchmarks that failed (their tracebacks are logged)."""
    rows, failed = [], []
    for name, fn in _benchmarks(device).items():
        if only and name not in only:
            continue
        setup_torch()  # data_pipeline drops to one thread, as a DataLoader worker
        t0 = time.perf_counter()
        try:
            got = fn(quick)
        except Exception:
            log.error("benchmark %s failed:\n%s", name, traceback.format_exc())
            failed.append(name)
            continue
        for r in got:
            r.setdefault("group", name)
        rows += got
        print(f"[{name}: {time.perf_counter() - t0:.0f} s]", flush=True)
    return rows, failed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smaller inputs and fewer repeats (< 10 min on 2 cores)")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--output", type=Path, default=None, help="write the rows and machine info as JSON")
    p.add_argument("--only", default=None, help="comma-separated subset: " + ",".join(_benchmarks("cpu")))
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    only = args.only.split(",") if args.only else None
    setup_torch()
    t0 = time.perf_counter()
    rows, failed = run_all(args.quick, args.device, only)
    setup_torch()
    info = machine_info()
    info["total_s"] = round(time.perf_counter() - t0, 1)
    print(f"\n{info}\n")
    print(format_table(rows))
    if args.output:
        args.output.write_text(json.dumps({"machine": info, "quick": args.quick, "device": args.device,
                                           "rows": rows, "failed": failed}, indent=2))
        print(f"wrote {args.output}")
    if failed:
        print(f"FAILED: {failed}")
    return 1 if failed or any(r["same_result"] is False for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
