"""Test-only callback: append one JSON line per training batch (epoch, batch index, global step and a
digest of the batch's images) to a file, so a test can compare the batches two runs trained on.

Use with ``PYTHONPATH=tests`` and ``--trainer.callbacks+=batch_record.RecordBatches
--trainer.callbacks.path=<file>``.
"""
from __future__ import annotations

import hashlib
import json

import lightning as L
import torch


def _digest(batch) -> str:
    images = batch[0] if isinstance(batch, (list, tuple)) else batch
    if isinstance(images, (list, tuple)):
        images = torch.cat([t.flatten() for t in images])
    return hashlib.sha1(images.detach().cpu().contiguous().numpy().tobytes()).hexdigest()[:16]


class RecordBatches(L.Callback):
    def __init__(self, path: str) -> None:
        self.path = path

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps({"epoch": trainer.current_epoch, "batch_idx": batch_idx,
                                "step": trainer.global_step, "digest": _digest(batch)}) + "\n")
