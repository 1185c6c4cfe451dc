"""Training time at every validation, logged with the validation metrics (mAP against minutes).

    --trainer.callbacks+=visiontf.callbacks.ElapsedTime

At the end of every validation run during ``fit`` (sanity check excluded) it logs

* ``time/elapsed_min``: wall-clock minutes since ``fit`` started, validation included, which is
  what ``--trainer.max_time`` counts;
* ``time/train_min``: the same without the time spent in validation loops.

Both are measured up to the start of that validation, i.e. the training time that produced the
weights being evaluated. They go to every logger on the validation row, so the CSV log holds
``val/mAP`` and ``time/elapsed_min`` side by side. Resuming continues the clocks from the
checkpoint (the time between the kill and the restart is not counted).
"""
from __future__ import annotations

import time
from typing import Any

import lightning as L


class ElapsedTime(L.Callback):
    """Logs ``time/elapsed_min`` and ``time/train_min`` at each validation of ``fit``."""

    def __init__(self) -> None:
        super().__init__()
        self._offset_s = 0.0  # time of earlier runs (restored from a checkpoint)
        self._offset_val_s = 0.0
        self._start: float | None = None
        self._val_s = 0.0  # validation time of this run
        self._val_start: float | None = None
        self._snapshot: tuple[float, float] | None = None

    def _now(self) -> float:
        return time.monotonic()

    def elapsed_s(self) -> float:
        """Seconds since fit started (this run and the restored ones)."""
        return self._offset_s + (self._now() - self._start if self._start is not None else 0.0)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start = self._now()
        self._val_s = 0.0

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or self._start is None:
            return
        self._val_start = self._now()
        elapsed = self.elapsed_s()
        self._snapshot = (elapsed, elapsed - self._offset_val_s - self._val_s)

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or self._snapshot is None:
            return
        elapsed, train = self._snapshot
        pl_module.log_dict({"time/elapsed_min": elapsed / 60.0, "time/train_min": train / 60.0},
                           on_step=False, on_epoch=True, sync_dist=False, rank_zero_only=True)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or self._val_start is None:
            return
        self._val_s += self._now() - self._val_start
        self._val_start = None
        self._snapshot = None

    def state_dict(self) -> dict[str, Any]:
        return {"elapsed_s": self.elapsed_s(), "validation_s": self._offset_val_s + self._val_s}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._offset_s = float(state_dict["elapsed_s"])
        self._offset_val_s = float(state_dict["validation_s"])


__all__ = ["ElapsedTime"]
