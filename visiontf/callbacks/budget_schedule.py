"""Anneal the learning rate over whatever budget the run has, steps or wall-clock time.

    trainer:
      max_epochs: 200              # an upper bound
      callbacks:
        - class_path: visiontf.callbacks.BudgetCosine
          init_args: {time_fraction: 0.97}

and ``--trainer.max_time 00:00:08:00`` on the command line. A step-based schedule (cosine over
``max_epochs``) cut off by ``max_time`` loses its annealing, and how far it gets depends on the
machine's speed. This callback multiplies the task scheduler's learning rates (keep the task's
schedule ``constant``, with its warm-up) by a cosine of the run's *progress*,

    progress = max(global_step / total_steps, elapsed / (time_fraction * max_time)),

so the learning rate reaches ``min_factor`` exactly when the first budget runs out: the step budget
(``max_epochs`` / ``max_steps``) on a fast machine, the time budget on a slow or shared one. When
the time budget's annealing is complete it stops training, which runs the final validation (and
writes ``last.ckpt``) inside the time limit; ``time_fraction`` leaves the rest of ``max_time`` for it.
The time is :class:`~lightning.pytorch.callbacks.Timer`'s (the one ``max_time`` creates), so it
counts validation and resumes with the checkpoint's elapsed time. Under DDP it is rank 0's clock, sent to the
other ranks after every step: each rank reading its own clock stopped at its own step, and the rank that
stopped first left the others in a collective it no longer joined (a crash or a hang at the end of the run,
before the final validation), and the ranks' learning rates differed in their last digits.
"""
from __future__ import annotations

import math
from typing import Any

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import Timer


class BudgetCosine(L.Callback):
    """Cosine factor on every learning rate over the step or time budget, whichever ends first.

    Args:
        time_fraction: share of ``max_time`` over which the learning rate anneals; training then
            stops, leaving the rest for the final validation and checkpoint.
        min_factor: the factor at the end of the budget (0: anneal to zero).
        flat_fraction: share of the progress held at factor 1 before the cosine starts (DEIM's flat-cosine
            shape: the cosine then spans the remaining ``1 - flat_fraction``); 0 anneals from the start.
    """

    def __init__(self, time_fraction: float = 0.97, min_factor: float = 0.0, flat_fraction: float = 0.0) -> None:
        super().__init__()
        if not 0.0 < time_fraction <= 1.0:
            raise ValueError(f"BudgetCosine: time_fraction must be in (0, 1], got {time_fraction}")
        if not 0.0 <= min_factor <= 1.0:
            raise ValueError(f"BudgetCosine: min_factor must be in [0, 1], got {min_factor}")
        if not 0.0 <= flat_fraction < 1.0:
            raise ValueError(f"BudgetCosine: flat_fraction must be in [0, 1), got {flat_fraction}")
        self.time_fraction = time_fraction
        self.flat_fraction = flat_fraction
        self.min_factor = min_factor
        # per optimizer param group: the scheduler's lr we scaled and the value we wrote
        self._scheduled: list[float] = []
        self._written: list[float] = []
        # rank 0's time progress after the last step (None until the run's first step)
        self._shared_time_progress: float | None = None

    @staticmethod
    def _timer(trainer: L.Trainer) -> Timer | None:
        for cb in trainer.callbacks:
            if isinstance(cb, Timer) and cb._duration is not None:
                return cb
        return None

    def time_progress(self, trainer: L.Trainer) -> float:
        """Elapsed share of the time budget's annealing (0 without ``max_time``)."""
        timer = self._timer(trainer)
        if timer is None:
            return 0.0
        elapsed = timer.time_elapsed("train")
        total = elapsed + (timer.time_remaining("train") or 0.0)
        return elapsed / max(self.time_fraction * total, 1e-9)

    def shared_time_progress(self, trainer: L.Trainer) -> float:
        """:meth:`time_progress` by rank 0's clock, the same on every rank (one broadcast of one number)."""
        progress = self.time_progress(trainer)
        if self._timer(trainer) is None or trainer.world_size < 2 or not (dist.is_available() and dist.is_initialized()):
            return progress
        value = torch.tensor([progress], dtype=torch.float64, device=trainer.strategy.root_device)
        dist.broadcast(value, src=0)
        return float(value.item())

    def progress(self, trainer: L.Trainer, time_progress: float | None = None) -> float:
        """The run's progress in [0, 1]: the larger of the step and the time progress (``time_progress``, or this
        rank's :meth:`time_progress`)."""
        steps = trainer.estimated_stepping_batches
        by_steps = trainer.global_step / steps if steps and math.isfinite(steps) else 0.0
        return min(1.0, max(by_steps, self.time_progress(trainer) if time_progress is None else time_progress))

    def factor(self, progress: float) -> float:
        """1 up to ``flat_fraction``, then a cosine from 1 to ``min_factor`` at progress 1."""
        progress = max(0.0, progress - self.flat_fraction) / (1.0 - self.flat_fraction)
        return self.min_factor + (1.0 - self.min_factor) * 0.5 * (1.0 + math.cos(math.pi * progress))

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._shared_time_progress = None

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int) -> None:
        if self._shared_time_progress is None:
            self._shared_time_progress = self.shared_time_progress(trainer)
        f = self.factor(self.progress(trainer, self._shared_time_progress))
        groups = [g for opt in trainer.optimizers for g in opt.param_groups]
        if len(self._scheduled) != len(groups):
            self._scheduled = [g["lr"] for g in groups]
            self._written = [math.nan] * len(groups)
        for i, g in enumerate(groups):
            # the task's scheduler rewrites lr at its own steps; otherwise lr still holds our last value
            if g["lr"] != self._written[i]:
                self._scheduled[i] = g["lr"]
            g["lr"] = self._written[i] = self._scheduled[i] * f
        pl_module.log("lr_budget_factor", f, on_step=True, on_epoch=False, batch_size=1)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self._timer(trainer) is None:
            return
        # one decision for all ranks, and the next step's learning rate from the same number
        self._shared_time_progress = self.shared_time_progress(trainer)
        if self._shared_time_progress >= 1.0:
            # annealed: stop now, so the final validation and last.ckpt fit in max_time
            trainer.should_stop = True

    def state_dict(self) -> dict[str, Any]:
        # a resumed optimizer holds the scaled lr: it must not be taken for the scheduler's
        return {"scheduled": list(self._scheduled), "written": list(self._written)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._scheduled = list(state_dict.get("scheduled", []))
        self._written = list(state_dict.get("written", []))


__all__ = ["BudgetCosine"]
