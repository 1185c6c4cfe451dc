"""Training-step cost of the CPU recipe under each precision, with the clipping it ships (0.1).

    .venv/bin/python benchmarks/precision_step.py --data data/demo_det [--steps 30] [--rounds 2]

Rows: bf16-mixed with clipping and the fused AdamW (what the tasks run: ``BaseTask`` clips itself where
Lightning's mixed-precision plugin refuses a fused optimizer), the same with torch's for-loop AdamW (the
other way to make clipping work), bf16-mixed without clipping, and float32 with clipping. Each is a
Lightning fit of ``--steps`` steps of ``configs/deformable_detr/deformable_detr_tiny_shapes.yaml`` in one
process (the recipe's batch of 4 per process); the median step time after 5 warm-up steps is
reported, the variants alternating over ``--rounds`` rounds so that other load on the machine hits
each alike. Needs a detection set (``tools/make_synthetic.py --task detection --preset demo``).
"""
from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import lightning as L  # noqa: E402

from benchmarks.common import median_of_rounds, print_against_first  # noqa: E402

CONFIG = "configs/deformable_detr/deformable_detr_tiny_shapes.yaml"
VARIANTS = {
    "bf16-mixed, clip 0.1, fused AdamW": ("bf16-mixed", 0.1, True),
    "bf16-mixed, clip 0.1, for-loop AdamW": ("bf16-mixed", 0.1, False),
    "bf16-mixed, no clip, fused AdamW": ("bf16-mixed", None, True),
    "32-true, clip 0.1, fused AdamW": ("32-true", 0.1, True),
}


class StepTimes(L.Callback):
    def __init__(self) -> None:
        self.times: list[float] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.times.append(time.perf_counter() - self._start)


def median_step(cli_args: list[str]) -> float:
    """The median training step (after 5 warm-up steps) of a ``tools/train.py fit`` with ``cli_args``, in this process."""
    from visiontf.cli.train import make_cli

    cli = make_cli(cli_args, run=False)
    timer = StepTimes()
    cli.trainer.callbacks.append(timer)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    return statistics.median(timer.times[5:])


def step_time(data: str, precision: str, clip: float | None, fused: bool, steps: int) -> float:
    from visiontf.tasks import optim

    saved = optim.can_fuse_adamw
    if not fused:
        optim.can_fuse_adamw = lambda groups: False
    try:
        return median_step(["--config", CONFIG, f"--data.init_args.root={data}", "--trainer.devices=1", "--trainer.strategy=auto",
                            f"--trainer.precision={precision}", f"--trainer.gradient_clip_val={'null' if clip is None else clip}", f"--trainer.max_steps={steps}",
                            "--precision_without_native_bf16=null", "--trainer.limit_val_batches=0", "--trainer.logger=false",
                            "--trainer.enable_progress_bar=false",
                            "--trainer.default_root_dir=outputs/bench_precision"])
    finally:
        optim.can_fuse_adamw = saved


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    measures = {name: functools.partial(step_time, args.data, precision, clip, fused, args.steps)
                for name, (precision, clip, fused) in VARIANTS.items()}
    print_against_first(median_of_rounds(measures, args.rounds))


if __name__ == "__main__":
    main()
