"""The CPU recipe's training step (``configs/rtdetr/rtdetr_tiny_shapes.yaml``) under model variants, and what its
two DDP processes cost against one.

    .venv/bin/python benchmarks/realtime_step.py --data data/demo_det \
        [--variant 'NAME={YAML mapping}' ...] [--rounds 3] [--steps 30]
    .venv/bin/python benchmarks/realtime_step.py --data data/demo_det --processes [--steps 200] [--rounds 2]

Default: the median step of a Lightning fit of the config in this process, one thread, bf16 autocast, no
validation (after 5 warm-up steps), for the config and for each ``--variant``: the config's ``model_kwargs``
with the variant's mapping merged over them, e.g.
``--variant 'two levels={backbone: {stages: [3, 4]}, encoder: {aifi_levels: [1]}, decoder: {num_levels: 2, num_points: [4, 4]}}'``.
The variants alternate over ``--rounds`` rounds, so that other load on the machine hits each alike.

``--processes``: whole ``tools/train.py fit`` runs of the config (no validation): its two DDP processes of one
thread, the config's batch each, against one process of one thread. Each is run to ``--steps`` and to 20 steps, and the
difference of the two wall times over the steps between gives the time a step with the start-up taken off.
Needs a detection set (``tools/make_synthetic.py --task detection --preset demo``).
"""
from __future__ import annotations

import argparse
import functools
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from benchmarks.common import median_of_rounds, print_against_first  # noqa: E402
from visiontf.core.config_files import merge_config_data, read_config  # noqa: E402

CONFIG = "configs/rtdetr/rtdetr_tiny_shapes.yaml"
RUN_DIR = "outputs/bench_realtime_step"


def config_init_args(section: str) -> dict[str, Any]:
    """The config's ``init_args`` of ``section`` (``model``, ``data``), composed as the CLI composes it."""
    return read_config(REPO / CONFIG)[section]["init_args"]


def config_model_kwargs() -> dict[str, Any]:
    return config_init_args("model").get("model_kwargs") or {}


def parse_variant(text: str) -> tuple[str, dict[str, Any]]:
    name, sep, mapping = text.partition("=")
    over = yaml.safe_load(mapping) if sep else None
    if not name or not isinstance(over, dict):
        raise SystemExit(f"--variant {text!r}: give NAME={{a YAML mapping of model_kwargs}}, "
                         "e.g. 'fewer slots={denoising: {num_denoising: 20}}'")
    return name, over


def in_process_step(data: str, model_kwargs: dict[str, Any], steps: int, run_dir: str = RUN_DIR) -> float:
    from benchmarks.precision_step import median_step

    return median_step(["--config", CONFIG, f"--data.init_args.root={data}", "--trainer.devices=1",
                        "--trainer.strategy=auto", "--torch_num_threads=1", f"--trainer.max_steps={steps}",
                        "--trainer.limit_val_batches=0", "--trainer.logger=false", "--trainer.enable_progress_bar=false",
                        f"--model.init_args.model_kwargs={json.dumps(model_kwargs)}", f"--trainer.default_root_dir={run_dir}"])


def wall_time(data: str, steps: int, processes: int) -> float:
    args = [sys.executable, "tools/train.py", "fit", "--config", CONFIG, f"--data.init_args.root={data}",
            f"--trainer.max_steps={steps}", "--trainer.limit_val_batches=0", "--trainer.logger=false",
            "--trainer.enable_progress_bar=false", f"--trainer.default_root_dir={RUN_DIR}"]
    if processes == 1:
        args += ["--trainer.devices=1", "--trainer.strategy=auto", "--torch_num_threads=1"]
    start = time.perf_counter()
    done = subprocess.run(args, cwd=REPO, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args[1:])} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return seconds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    p.add_argument("--data", required=True, help="a detection set in COCO layout")
    p.add_argument("--variant", action="append", default=[], help="NAME={YAML mapping merged over the config's model_kwargs}")
    p.add_argument("--processes", action="store_true", help="time the config's two DDP processes against one process")
    p.add_argument("--steps", type=int, default=None, help="steps a run (default 30; with --processes 200)")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    if args.processes:
        steps = args.steps or 200
        if steps < 60:  # the start-up varies by seconds between runs: fewer steps than this drown in it
            raise SystemExit("--processes: --steps must be at least 60, 40 beyond the 20 steps of the start-up run")
        batch = config_init_args("data")["batch_size"]
        rows = {f"two DDP processes of one thread, batch {batch} each (the config)": 2, f"one process of one thread, batch {batch}": 1}

        def step(n: int) -> float:
            seconds = (wall_time(args.data, steps, n) - wall_time(args.data, 20, n)) / (steps - 20)
            if seconds <= 0:
                raise SystemExit(f"--processes: {steps} steps took no longer than 20 (the start-up's spread is larger "
                                 "than the steps): run more (--steps 200)")
            return seconds

        medians = median_of_rounds({name: functools.partial(step, n) for name, n in rows.items()}, args.rounds)
        print_against_first(medians)
        for name, n in rows.items():
            print(f"{name}: {batch * n / medians[name]:.1f} images a second")
        return
    base = config_model_kwargs()
    variants = {"the config": base} | {name: merge_config_data(base, over) for name, over in map(parse_variant, args.variant)}
    measures = {name: functools.partial(in_process_step, args.data, kwargs, args.steps or 30) for name, kwargs in variants.items()}
    print_against_first(median_of_rounds(measures, args.rounds))


if __name__ == "__main__":
    main()
