"""One line per epoch on stdout, for runs without a progress bar (``make demo``, logs, SLURM output).

    epoch  9/40  loss 1.913  13.2 s/epoch  elapsed 1:59  about 6:50 left
    epoch 10/40  loss 1.842  14.1 s/epoch  elapsed 2:21  about 7:03 left  val/mAP 0.113  val/map_50 0.301

The loss is the mean of the epoch's training-step losses; the time left extrapolates the mean epoch
time (validation included) to ``max_epochs``, or is what remains of ``max_time`` when that ends
first (``make demo``: 100 epochs would take hours, its 8-minute budget ends the run). An epoch that
validated also shows up to three ``val/*`` metrics, the monitored ones first. Only rank 0 prints. ``visiontf.cli`` adds this callback whenever the
progress bar is off (``--trainer.enable_progress_bar=false``).
"""
from __future__ import annotations

import time
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Timer
from lightning.pytorch.utilities import rank_zero_only

#: metrics shown first on validation lines, when logged (other val/* metrics fill up to three)
PREFERRED = ("val/mAP", "val/map_50", "val/acc1", "val/acc5", "val/mIoU", "val/mAcc")


def _clock(seconds: float) -> str:
    m, s = divmod(int(round(seconds)), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def _time_limit_left(trainer: L.Trainer) -> float | None:
    """Seconds of ``max_time`` left (the Timer callback it creates), or None without a time limit."""
    for cb in getattr(trainer, "callbacks", ()):
        remaining = cb.time_remaining() if isinstance(cb, Timer) else None
        if remaining is not None:
            return max(0.0, remaining)
    return None


class EpochLines(L.Callback):
    """Prints a line per training epoch (loss, time, time left) and per validation (metrics)."""

    def __init__(self, max_val_metrics: int = 3) -> None:
        super().__init__()
        self.max_val_metrics = max_val_metrics
        self._fit_start: float | None = None
        self._first_epoch = 0
        self._loss_sum = 0.0
        self._loss_n = 0
        self._val: str = ""

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._fit_start = time.monotonic()
        self._first_epoch = trainer.current_epoch  # a resumed run starts later

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._loss_sum, self._loss_n = 0.0, 0

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if loss is not None and hasattr(loss, "detach"):
            value = float(loss.detach())
            if value == value:  # skip NaN steps (the task's non-finite guard reports those)
                self._loss_sum += value
                self._loss_n += 1

    @rank_zero_only
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._fit_start is None:
            return
        epoch = trainer.current_epoch + 1
        total = trainer.max_epochs if trainer.max_epochs and trainer.max_epochs > 0 else None
        elapsed = time.monotonic() - self._fit_start
        per_epoch = elapsed / max(1, epoch - self._first_epoch)
        width = len(str(total)) if total else 1
        parts = [f"epoch {epoch:>{width}}/{total}" if total else f"epoch {epoch}"]
        if self._loss_n:
            parts.append(f"loss {self._loss_sum / self._loss_n:.3f}")
        parts += [f"{per_epoch:.1f} s/epoch", f"elapsed {_clock(elapsed)}"]
        if not total or epoch < total:
            estimates = [per_epoch * (total - epoch)] if total else []
            time_left = _time_limit_left(trainer)
            if time_left is not None:
                estimates.append(time_left)
            if estimates:
                parts.append(f"about {_clock(min(estimates))} left")
        if self._val:
            parts.append(self._val)
            self._val = ""
        print("  ".join(parts), flush=True)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or self._fit_start is None:
            return
        metrics = {k: v for k, v in trainer.callback_metrics.items() if k.startswith("val/") and getattr(v, "numel", lambda: 1)() == 1}
        monitored = [cb.monitor for cb in trainer.checkpoint_callbacks if getattr(cb, "monitor", None)]
        order = [k for k in (*monitored, *PREFERRED) if k in metrics]
        if not order:  # a task without the usual metrics: whatever it logs, the loss first
            order = sorted(metrics, key=lambda k: (k != "val/loss", k))
        shown = list(dict.fromkeys(order))[: self.max_val_metrics]
        self._val = "  ".join(f"{k} {float(metrics[k]):.3f}" for k in shown)
