#!/usr/bin/env python
"""Convergence harness: the COCO mAP a config reaches within a time budget, over several dataset seeds.

    python scripts/experiments/convergence.py --config configs/detr/detr_tiny_shapes.yaml --seeds 11 12 13 \\
        [--preset shapes|demo] [--max-time 00:00:08:00] [--work outputs/convergence] [--name detr_tiny] \\
        [--variant NAME='OVERRIDES' ...] [-- OVERRIDES...]

For each variant and seed it

1. generates the synthetic set (cached under ``WORK/data`` by preset, seed and size):
   ``shapes`` = ``tools/make_synthetic.py --task detection --num_train 1500 --num_val 150 --seed S``,
   ``demo`` = the same with ``--preset demo --num_train 1000 --num_val 100``;
2. trains with ``tools/train.py fit --config C`` plus ``--trainer.max_time``, validation every
   epoch and :class:`visiontf.callbacks.ElapsedTime` (mAP against minutes in the CSV log);
3. evaluates the weights at the end of training (``last.ckpt``, saved at every validation) with
   ``tools/eval.py`` (COCO mAP, AP50);
4. collects mAP, AP50, the optimizer steps and epochs of the evaluated checkpoint, the minutes
   trained, and whether the time limit stopped training.

Then it prints a markdown table (per seed, and mean/min per variant) and the JSON, writes both
to ``WORK/<name>.md`` / ``.json``, and draws mAP against minutes to ``WORK/<name>.png``.

Overrides after ``--`` go to training and evaluation of the single variant (named ``--name``).
For an ablation, give one ``--variant NAME='--model.init_args.x=1 --trainer.callbacks+=...'`` per
setting instead; all variants run on the same seeds and share one table. A finished run
(``result.json`` in its folder) is reused unless ``--force``, so a long sweep can be resumed.

The timings depend on the machine; say whether it was shared when you report them.
"""
from __future__ import annotations

import argparse
import json
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

#: the data sets of the CPU recipe's bars: make_synthetic arguments and default sizes
PRESETS = {
    "shapes": {"args": [], "num_train": 1500, "num_val": 150},
    "demo": {"args": ["--preset", "demo"], "num_train": 1000, "num_val": 100},
}
TIME_LIMIT_MESSAGE = "Time limit reached"


@dataclass
class Variant:
    name: str
    overrides: list[str]


def _run(cmd: list[str], log_file: Path, timeout: float | None = None) -> float:
    """Run ``cmd`` from the repository root, output to ``log_file``; seconds taken. Fails with the log's tail."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with log_file.open("w") as log:
        log.write("+ " + shlex.join(cmd) + "\n")
        log.flush()
        proc = subprocess.run(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, timeout=timeout)
    took = time.perf_counter() - start
    if proc.returncode != 0:
        tail = log_file.read_text()[-4000:]
        raise RuntimeError(f"{shlex.join(cmd)} exited {proc.returncode}; log {log_file}:\n{tail}")
    return took


def ensure_data(work: Path, preset: str, seed: int, num_train: int, num_val: int) -> Path:
    """The synthetic set of (preset, seed, sizes), generated once under ``work/data``."""
    root = work / "data" / f"{preset}-seed{seed}-{num_train}x{num_val}"
    if (root / "annotations" / "instances_val2017.json").is_file():
        return root
    partial = root.with_name(root.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    cmd = [sys.executable, "tools/make_synthetic.py", "--task", "detection", *PRESETS[preset]["args"],
           "--num_train", str(num_train), "--num_val", str(num_val), "--seed", str(seed), "--out", str(partial)]
    _run(cmd, work / "data" / f"{root.name}.log")
    partial.rename(root)  # complete sets only: an interrupted generation is redone
    return root


def _last_csv_value(run_dir: Path, column: str) -> float | None:
    import pandas as pd

    values = []
    for csv in sorted(run_dir.rglob("metrics.csv")):
        df = pd.read_csv(csv)
        if column in df:
            values.extend(df[column].dropna().tolist())
    return float(values[-1]) if values else None


def _checkpoint_progress(ckpt: Path) -> dict:
    """Optimizer steps and epochs of a Lightning checkpoint (epochs counted with the partial last one)."""
    import torch

    state = torch.load(ckpt, map_location="cpu", weights_only=True)
    batches = state.get("loops", {}).get("fit_loop", {}).get("epoch_loop.batch_progress", {})
    in_epoch = batches.get("current", {}).get("completed", 0)
    # saved at an epoch's validation: that epoch's batches all done (current counts the epoch's batches)
    return {"steps": int(state["global_step"]), "epoch": int(state["epoch"]), "batches_in_last_epoch": int(in_epoch)}


def train_and_evaluate(args: argparse.Namespace, variant: Variant, seed: int, data: Path) -> dict:
    """Train and evaluate one (variant, seed); the result dict (also ``result.json`` in the run folder)."""
    run_dir = args.work / "runs" / variant.name / f"seed{seed}"
    result_file = run_dir / "result.json"
    if result_file.is_file() and not args.force:
        return json.loads(result_file.read_text())
    shutil.rmtree(run_dir, ignore_errors=True)  # a half-finished run would add CSV versions and last-v1.ckpt
    py = sys.executable
    common = ["--config", args.config, f"--data.init_args.root={data}"]
    # checkpoint.monitor=null: last.ckpt then holds the weights at the end of training. With a monitor,
    # Lightning >= 2.6 refreshes last.ckpt only when the monitored metric improves, so it would hold the
    # best validation epoch: selecting on the set that is also evaluated, an optimistic number.
    train = [py, "tools/train.py", "fit", *common, f"--trainer.default_root_dir={run_dir}",
             "--trainer.enable_progress_bar=false", "--checkpoint.monitor=null",
             "--trainer.callbacks+=visiontf.callbacks.ElapsedTime"]
    if args.val_every > 0:
        train.append(f"--trainer.check_val_every_n_epoch={args.val_every}")
    if args.max_time:
        train.append(f"--trainer.max_time={args.max_time}")
    train += variant.overrides
    train_s = _run(train, run_dir / "train.log")
    ckpt = run_dir / "checkpoints" / "last.ckpt"
    if not ckpt.is_file():
        raise RuntimeError(f"{run_dir}: training wrote no checkpoints/last.ckpt; see {run_dir / 'train.log'}")

    stats_file = run_dir / "eval.json"
    evaluate = [py, "tools/eval.py", *common, "--ckpt_path", str(ckpt), f"--trainer.default_root_dir={run_dir / 'eval'}",
                "--trainer.enable_progress_bar=false", "--trainer.logger=false", *variant.overrides,
                "--output", str(stats_file)]
    _run(evaluate, run_dir / "eval.log")
    stats = json.loads(stats_file.read_text())
    result = {
        "variant": variant.name,
        "seed": seed,
        "map": float(stats.get("map", stats.get("val/map", float("nan")))),
        "map_50": float(stats.get("map_50", stats.get("val/map_50", float("nan")))),
        **_checkpoint_progress(ckpt),
        "elapsed_min": _last_csv_value(run_dir, "time/elapsed_min"),
        "train_process_min": train_s / 60.0,
        "time_limit_hit": TIME_LIMIT_MESSAGE in (run_dir / "train.log").read_text(),
        "run_dir": str(run_dir),
        "train_command": shlex.join(train),
    }
    result_file.write_text(json.dumps(result, indent=2) + "\n")
    return result


def summarise(rows: Sequence[dict]) -> dict:
    """Mean and min of mAP and AP50 over seeds, mean steps."""
    maps, ap50 = [r["map"] for r in rows], [r["map_50"] for r in rows]
    return {"seeds": len(rows), "mean_map": statistics.fmean(maps), "min_map": min(maps),
            "mean_map_50": statistics.fmean(ap50), "min_map_50": min(ap50),
            "mean_steps": statistics.fmean(r["steps"] for r in rows)}


def _fmt(value, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def markdown(report: dict) -> str:
    """The per-seed table and the per-variant summary as markdown."""
    lines = [f"Config `{report['config']}`, preset `{report['preset']}` ({report['num_train']} train / "
             f"{report['num_val']} val images), time budget {report['max_time'] or 'none'}.", "",
             "| variant | seed | mAP | AP50 | steps | epochs | minutes | time limit hit |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    for name, v in report["variants"].items():
        for r in v["runs"]:
            lines.append(f"| {name} | {r['seed']} | {_fmt(r['map'])} | {_fmt(r['map_50'])} | {r['steps']} | "
                         f"{r['epoch'] + 1} | {_fmt(r['elapsed_min'], 1)} | {_fmt(r['time_limit_hit'])} |")
    lines += ["", "| variant | seeds | mean mAP | min mAP | mean AP50 | min AP50 | mean steps |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    for name, v in report["variants"].items():
        s = v["summary"]
        lines.append(f"| {name} | {s['seeds']} | {_fmt(s['mean_map'])} | {_fmt(s['min_map'])} | "
                     f"{_fmt(s['mean_map_50'])} | {_fmt(s['min_map_50'])} | {_fmt(s['mean_steps'], 0)} |")
    return "\n".join(lines)


def parse_variants(name: str, variant_args: Sequence[str], extra: Sequence[str]) -> list[Variant]:
    if variant_args and extra:
        raise SystemExit("give overrides either after -- (one variant) or in --variant NAME='...', not both")
    if not variant_args:
        return [Variant(name, list(extra))]
    variants = []
    for arg in variant_args:
        if "=" not in arg:
            raise SystemExit(f"--variant expects NAME='OVERRIDES', got {arg!r}")
        vname, overrides = arg.split("=", 1)
        variants.append(Variant(vname.strip(), shlex.split(overrides)))
    names = [v.name for v in variants]
    if len(set(names)) != len(names):
        raise SystemExit(f"--variant names must differ, got {names}")
    return variants


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="training YAML (a DetectionTask config)")
    p.add_argument("--seeds", type=int, nargs="+", required=True, help="dataset seeds (make_synthetic --seed)")
    p.add_argument("--preset", choices=sorted(PRESETS), default="shapes")
    p.add_argument("--num-train", type=int, default=None, help="default: the preset's (shapes 1500, demo 1000)")
    p.add_argument("--num-val", type=int, default=None, help="default: the preset's (shapes 150, demo 100)")
    p.add_argument("--max-time", default="00:00:08:00", help="--trainer.max_time (DD:HH:MM:SS); 'none' for no limit")
    p.add_argument("--val-every", type=int, default=1, help="validate every N epochs (the curve's points); 0 keeps the config's")
    p.add_argument("--work", type=Path, default=Path("outputs/convergence"), help="data cache, runs and reports")
    p.add_argument("--name", default=None, help="report and single-variant name (default: the config's stem)")
    p.add_argument("--variant", action="append", default=[], metavar="NAME='OVERRIDES'",
                   help="one configuration of an ablation (repeatable)")
    p.add_argument("--force", action="store_true", help="retrain runs that already have a result.json")
    p.add_argument("--no-plot", action="store_true", help="skip the mAP-against-minutes PNG")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = shlex.join([sys.executable, "scripts/experiments/convergence.py", *argv])
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    args = build_parser().parse_args(argv)
    args.max_time = None if str(args.max_time).lower() in ("none", "", "0") else args.max_time
    preset = PRESETS[args.preset]
    num_train = args.num_train or preset["num_train"]
    num_val = args.num_val or preset["num_val"]
    name = args.name or Path(args.config).stem
    variants = parse_variants(name, args.variant, extra)
    args.work.mkdir(parents=True, exist_ok=True)

    from benchmarks.run_all import machine_info

    report = {"config": args.config, "preset": args.preset, "num_train": num_train, "num_val": num_val,
              "max_time": args.max_time, "seeds": args.seeds, "machine": machine_info(),
              "command": command,
              "variants": {}}
    for variant in variants:
        rows = []
        for seed in args.seeds:
            data = ensure_data(args.work, args.preset, seed, num_train, num_val)
            print(f"[{variant.name} seed {seed}] training ...", flush=True)
            row = train_and_evaluate(args, variant, seed, data)
            print(f"[{variant.name} seed {seed}] mAP {row['map']:.3f} AP50 {row['map_50']:.3f} after "
                  f"{row['steps']} steps", flush=True)
            rows.append(row)
        report["variants"][variant.name] = {"overrides": variant.overrides, "runs": rows, "summary": summarise(rows)}

    table = markdown(report)
    (args.work / f"{name}.md").write_text(table + "\n")
    (args.work / f"{name}.json").write_text(json.dumps(report, indent=2) + "\n")
    if not args.no_plot:
        from visiontf.evaluation.convergence import plot_convergence

        runs = [(v, r["run_dir"]) for v, rep in report["variants"].items() for r in rep["runs"]]
        png = plot_convergence(runs, args.work / f"{name}.png",
                               title=f"{name}: COCO mAP against training time ({args.preset} set)")
        report["plot"] = str(png)
    print(table)
    print(json.dumps({k: report[k] for k in ("config", "preset", "max_time", "seeds")} |
                     {"summary": {k: v["summary"] for k, v in report["variants"].items()}}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
