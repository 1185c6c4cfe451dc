"""The best and the last checkpoint of a fit, kept with a Weights & Biases run as ``model`` artifacts.

Lightning's ``WandbLogger(log_model=True)`` refuses offline runs ("model checkpoints cannot be uploaded
in offline mode"), yet an offline run keeps artifacts until ``wandb sync`` uploads them. This callback
logs the checkpoint files at the end of the fit, online or offline::

    tools/train.py fit --config C.yaml --trainer.logger WandbLogger --trainer.logger.offline true \
        --trainer.callbacks+=visiontf.callbacks.WandbCheckpoints

MLflow keeps checkpoints through Lightning's own ``MLFlowLogger(log_model=True)``
(``--trainer.logger.log_model true``).
"""
from __future__ import annotations

import logging
from pathlib import Path

from lightning.pytorch import Callback, LightningModule, Trainer

from visiontf.callbacks.logger_sinks import log_wandb_checkpoints
from visiontf.io.lightning_checkpoint import lies_under

log = logging.getLogger(__name__)

__all__ = ["WandbCheckpoints"]


class WandbCheckpoints(Callback):
    """At the end of ``fit`` (rank 0), the checkpoint callback's best and last files as W&B ``model``
    artifacts aliased ``best`` and ``last``; a no-op without a W&B logger or without checkpoints."""

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not trainer.is_global_zero or trainer.checkpoint_callback is None:
            return
        cb = trainer.checkpoint_callback
        # files of this run's checkpoint folder only: a best_model_path restored from another folder is not uploaded
        found = {alias: Path(p) for alias, p in (("best", cb.best_model_path), ("last", cb.last_model_path))
                 if p and cb.dirpath and lies_under(str(p), str(cb.dirpath)) and Path(p).is_file()}
        if found:
            names = log_wandb_checkpoints(trainer, found)
            if names:
                log.info("W&B: checkpoints %s logged as %s", {k: str(v) for k, v in found.items()}, sorted(set(names)))
