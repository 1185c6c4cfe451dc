"""The GPU benchmark: one command, one table, within a global time budget.

Sections, the most important first (each row is skipped with a note when the budget runs out):

* (a) the multi-scale deformable attention core, forward + backward: ours (Triton) vs the
  original CUDA op, the original PyTorch core and our gather core (:mod:`benchmarks.gpu_kernels`);
* (b) detector train steps under bf16 autocast, batch 2 and 8 at 800x1216: Deformable DETR R50
  (plain, +refine, two-stage) and DINO-4scale vs the originals on their CUDA op, DETR R50 vs the
  original and HF (:mod:`benchmarks.gpu_train`);
* (f) ``tools/train.py fit`` of the DINO-4scale config on a synthetic COCO-sized JPEG set: images/s
  and the share of time the GPU waits on the loader, per worker count (:mod:`benchmarks.gpu_e2e`);
* (d) ViT-B/16 and DeiT-S training and inference vs timm, bf16, eager and compiled (:mod:`benchmarks.gpu_vit`);
* (c) DETR's train-step parity with the original: TF32 on and off (:mod:`benchmarks.gpu_detr_parity`);
* (e) the peak GPU memory of each train step of (b);
* (s) switches against the defaults: the gather core, channels-last, a compiled transformer (:mod:`benchmarks.gpu_switches`).

The table (Markdown) goes to stdout and ``--out``/gpu_table.md, every row as JSON to gpu_rows.json.

    python benchmarks/gpu.py --device cuda [--ref-op FOLDER] --out $OUT               # one H100, about 6 minutes
    python benchmarks/gpu.py --device cpu --tiny                                       # the CPU smoke run (minutes)
"""
from __future__ import annotations

import os
import sys

# Triton's kernels run on CPU tensors only in its interpreter, chosen before Triton is imported
if "--device" in sys.argv and sys.argv[sys.argv.index("--device") + 1 : sys.argv.index("--device") + 2] == ["cpu"]:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import argparse  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.gpu_common import Budget, free_cuda, markdown_table  # noqa: E402
from benchmarks.reference_cuda_op import describe, load_reference_core, routed_to  # noqa: E402

SECTIONS = ("a", "b", "f", "d", "c", "e", "s")


def _e2e_plan(text: str) -> list[tuple[int, int]]:
    """``"8:200,4:100"`` -> [(8, 200), (4, 100)]: loader workers and steps of each end-to-end run."""
    try:
        return [(int(w), int(s)) for w, s in (item.split(":") for item in text.split(","))]
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"--e2e: give WORKERS:STEPS pairs separated by commas, e.g. 8:200,4:100; got {text!r}") from e


def _device_line(device: torch.device) -> str:
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "CPU"
    triton = __import__("triton").__version__
    return (f"{gpu}; torch {torch.__version__}, triton {triton}, Python {platform.python_version()}; "
            f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda", choices=("cpu", "cuda"))
    p.add_argument("--tiny", action="store_true", help="toy sizes and one repeat: the CPU smoke run")
    p.add_argument("--ref-op", default=None, help="folder of the original's built CUDA op (benchmarks/reference_cuda_op.py)")
    p.add_argument("--dino-repo", type=Path, default=None,
                   help="(b) a checkout of IDEA-Research/DINO: its own code is the DINO rows' reference (none: rows skipped)")
    p.add_argument("--out", default=os.environ.get("OUT"), help="folder for gpu_table.md and gpu_rows.json (default: $OUT)")
    p.add_argument("--budget", type=float, default=None,
                   help="seconds for the whole run, rows that would not fit are skipped (default 330; tiny 1800)")
    p.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated subset of {','.join(SECTIONS)}, run in this order")
    p.add_argument("--compile", default="auto", choices=("auto", "on", "off"), help="(d) compiled rows: auto = on for cuda")
    p.add_argument("--e2e", type=_e2e_plan, default=None, help="(f) WORKERS:STEPS runs (default 8:200,4:100,2:100; tiny 2:4)")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda, but torch.cuda.is_available() is False")
    sections = [s for s in args.sections.split(",") if s]
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        p.error(f"--sections: unknown {sorted(unknown)}; choose from {','.join(SECTIONS)}")
    budget = Budget(args.budget if args.budget is not None else (1800.0 if args.tiny else 330.0))
    torch.manual_seed(0)
    if device.type == "cpu":
        torch.set_num_threads(min(2, os.cpu_count() or 1))
    ref_core = load_reference_core(args.ref_op) if device.type == "cuda" else None
    ref_note = describe(args.ref_op) if device.type == "cuda" else "the CUDA op needs a GPU"
    header = [f"device: {_device_line(device)}", f"original CUDA op: {ref_note if ref_core is None else 'loaded from ' + ref_note}"]
    print("\n".join(header), flush=True)

    rows: list[dict] = []
    memory: list[dict] = []
    for section in sections:
        before = len(rows)
        if section == "a":
            from benchmarks import gpu_kernels

            rows += gpu_kernels.run(device, args.tiny, budget, ref_core, ref_note)
        elif section == "b":
            from benchmarks import gpu_train

            with routed_to(ref_core):
                steps, memory = gpu_train.run(device, args.tiny, budget, ref_core, args.dino_repo)
            rows += steps
        elif section == "f":
            from benchmarks import gpu_e2e

            plan = args.e2e or ([(2, 4)] if args.tiny else [(8, 200), (4, 100), (2, 100)])
            rows += gpu_e2e.run(device, args.tiny, budget, plan)
        elif section == "d":
            from benchmarks import gpu_vit

            compile_models = args.compile == "on" or (args.compile == "auto" and device.type == "cuda")
            rows += gpu_vit.run(device, args.tiny, budget, compile_models)
        elif section == "c":
            from benchmarks import gpu_detr_parity

            rows += gpu_detr_parity.run(device, args.tiny, budget)
        elif section == "e":
            rows += memory if device.type == "cuda" else []
            if device.type != "cuda":
                budget.notes.append("(e) peak GPU memory: no GPU in this run")
            elif "b" not in sections:
                budget.notes.append("(e) peak GPU memory comes with the train steps of (b), which did not run")
        elif section == "s":
            from benchmarks import gpu_switches

            rows += gpu_switches.run(device, args.tiny, budget)
        free_cuda()
        print(f"section {section}: {len(rows) - before} rows, {budget.left():.0f} s of the budget left", flush=True)

    table = "\n".join(header) + "\n\n" + markdown_table(rows) + ("\n\n" if budget.notes else "") + "\n".join(f"- {n}" for n in budget.notes)
    print("\n" + table)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "gpu_table.md").write_text(table + "\n")
        (out / "gpu_rows.json").write_text(json.dumps({"header": header, "rows": rows, "notes": budget.notes}, indent=1, default=str))
    return 0 if all(r["same_result"] is not False for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
