"""Make sure a run validates before it ends when its checkpoint keeps the best validation score.

With ``check_val_every_n_epoch: 10`` and ``max_epochs: 3`` Lightning never validates: the
checkpoint that monitors ``val/mAP`` is never chosen, and nothing says so. At the start of ``fit``
this callback

* validates at the last epoch instead (``check_val_every_n_epoch = max_epochs``) when a
  ``ModelCheckpoint`` or ``EarlyStopping`` monitors a metric and the schedule would never validate,
  with a warning that names both settings;
* only warns when nothing is monitored;
* warns when ``max_epochs`` is not a multiple of ``check_val_every_n_epoch``: the last epochs then
  train after the last validation, so the best checkpoint and the reported score predate them.

``visiontf.cli`` adds it to every run.
"""
from __future__ import annotations

import logging

import lightning as L
from lightning.pytorch.callbacks import EarlyStopping

log = logging.getLogger(__name__)


def _monitored(trainer: L.Trainer) -> list[str]:
    monitors = [cb.monitor for cb in trainer.checkpoint_callbacks if getattr(cb, "monitor", None)]
    monitors += [cb.monitor for cb in trainer.callbacks if isinstance(cb, EarlyStopping) and cb.monitor]
    return list(dict.fromkeys(monitors))


class ValidationSchedule(L.Callback):
    """Validates at the last epoch when the configured schedule would never validate (see the module)."""

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        every, max_epochs = trainer.check_val_every_n_epoch, trainer.max_epochs
        if not isinstance(every, int) or every <= 1 or not max_epochs or max_epochs < 1 or trainer.limit_val_batches == 0:
            return
        monitors = _monitored(trainer)
        if every > max_epochs:
            if monitors:
                log.warning(
                    "check_val_every_n_epoch=%d is more than max_epochs=%d, so this run would never validate, but %s "
                    "monitors %s: validating at the last epoch instead (set --trainer.check_val_every_n_epoch=%d or "
                    "lower to choose)", every, max_epochs, "the checkpoint" if trainer.checkpoint_callbacks else "early stopping",
                    ", ".join(monitors), max_epochs)
                trainer.check_val_every_n_epoch = max_epochs
            else:
                log.warning("check_val_every_n_epoch=%d is more than max_epochs=%d: this run never validates",
                            every, max_epochs)
        elif max_epochs % every:
            log.warning(
                "max_epochs=%d is not a multiple of check_val_every_n_epoch=%d: the last validation is at epoch %d, "
                "so the last %d epoch(s) are not validated%s", max_epochs, every, max_epochs - max_epochs % every,
                max_epochs % every, f" and the best checkpoint by {', '.join(monitors)} predates them" if monitors else "")
