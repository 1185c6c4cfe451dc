"""How long training waits on the data loader: images per second and the share of time spent waiting.

    --trainer.callbacks+=visiontf.callbacks.DataWaitTimer
    --trainer.callbacks+=visiontf.callbacks.DataWaitTimer --trainer.callbacks.init_args.out wait.json

Between the end of one training batch (``on_train_batch_end``) and the start of the next
(``on_train_batch_start``) the loop fetches the next batch from the loader and copies it to the
device; when the loader's workers keep up that takes milliseconds, when they do not it is the time
the accelerator sits idle. With ``sync=True`` (the default) the accelerator's queued work is
finished first at every batch end, so the interval holds the wait alone (the step's own kernels are
not counted as waiting). That synchronisation costs a little overlap: the figures describe the
loader, the run's speed without the callback is at least as good.

At the end of ``fit`` it prints one line and (``out``) writes a JSON file with: ``steps`` timed
(after ``skip`` warm-up steps), ``images_per_s``, ``wait_share`` (wait / wall time), ``wait_s`` and
``wall_s``, ``step_s_median`` and ``wait_s_median``. ``summary()`` returns the same dict.
"""
from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch

__all__ = ["DataWaitTimer"]


class DataWaitTimer(L.Callback):
    """Wall time per training step and the part of it spent waiting for the next batch."""

    def __init__(self, skip: int = 10, sync: bool = True, out: str | None = None) -> None:
        super().__init__()
        if skip < 0:
            raise ValueError(f"DataWaitTimer: skip must be >= 0 (warm-up steps left out), got {skip}")
        self.skip = skip
        self.sync = sync
        self.out = out
        self._batch_end: float | None = None
        self._seen = 0
        self._waits: list[float] = []
        self._steps: list[float] = []
        self._images = 0
        self._previous_start = 0.0
        self._batch_images = 0

    def _now(self, trainer: L.Trainer) -> float:
        if self.sync and trainer.strategy.root_device.type == "cuda":
            torch.cuda.synchronize(trainer.strategy.root_device)
        return time.perf_counter()

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int) -> None:
        now = time.perf_counter()  # no sync: the accelerator finished at the last batch end
        if self._batch_end is not None and self._seen > self.skip:  # the step that just ended is past the warm-up
            self._waits.append(now - self._batch_end)
            self._steps.append(now - self._previous_start)
            self._images += self._batch_images
        self._previous_start = now
        self._batch_images = _count_images(batch)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        self._batch_end = self._now(trainer)
        self._seen += 1

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._batch_end = None  # the pause between epochs (validation, a new loader iterator) is not a batch wait

    def summary(self) -> dict:
        wall, wait = sum(self._steps), sum(self._waits)
        return {
            "steps": len(self._steps),
            "images_per_s": self._images / wall if wall else float("nan"),
            "wait_share": wait / wall if wall else float("nan"),
            "wait_s": wait,
            "wall_s": wall,
            "step_s_median": statistics.median(self._steps) if self._steps else float("nan"),
            "wait_s_median": statistics.median(self._waits) if self._waits else float("nan"),
        }

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        s = self.summary()
        print(f"DataWaitTimer: {s['steps']} steps, {s['images_per_s']:.2f} images/s on this process, "
              f"waiting on data {100 * s['wait_share']:.1f}% of the time (median wait {1000 * s['wait_s_median']:.1f} ms, "
              f"median step {1000 * s['step_s_median']:.1f} ms)")
        if self.out is not None:
            Path(self.out).parent.mkdir(parents=True, exist_ok=True)
            Path(self.out).write_text(json.dumps(s, indent=1))


def _count_images(batch: Any) -> int:
    """Images in a batch: the first dimension of its first tensor (every task's batch starts with its
    images: ``(images, mask, targets)``, ``(images, labels)``, a ``PaddedBatch``)."""
    if isinstance(batch, torch.Tensor):
        return batch.shape[0]
    if isinstance(batch, (list, tuple)) and batch:
        return _count_images(batch[0])
    if isinstance(batch, dict) and batch:
        return _count_images(next(iter(batch.values())))
    return 0
