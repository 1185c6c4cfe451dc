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

It also keeps a resumed run from training one batch twice when the schedule changed. A checkpoint
written by validation at the end of an epoch (``last.ckpt`` of a finished run whose last epoch
validated) is, for Lightning, still inside that epoch; on resume Lightning ends the epoch only if
the *current* schedule validates it too. Extending a finished 3-epoch run to 6 epochs moves the
validation from epoch 3 to epoch 6 (or the user changed ``check_val_every_n_epoch``), so Lightning
trained one more batch in epoch 3 (the epoch's first batch again, from a fresh iterator) and every
later step was shifted by one. For that restarted epoch only, the schedule it was validated under is
put back, so Lightning ends it as it was saved; the new schedule holds from its end on.

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


def _restarts_after_the_last_batch_and_its_validation(trainer: L.Trainer) -> bool:
    """Resumed from a checkpoint written after an epoch's last batch, before the epoch ended (that is,
    by the validation at the epoch's end), while the current schedule does not validate that epoch.

    Lightning's loops say so only through their internals (restart stage, ready batches, the epoch's
    validation check); ``tests/cli/test_lightning_internals.py`` asserts each one, and pyproject.toml pins
    the Lightning minor version they hold for."""
    fit_loop = trainer.fit_loop
    epoch_loop = fit_loop.epoch_loop
    return (fit_loop.restarted_mid_epoch and epoch_loop.restarted_on_last
            and epoch_loop._num_ready_batches_reached() and not epoch_loop._should_check_val_epoch())


class ValidationSchedule(L.Callback):
    """Validates at the last epoch when the configured schedule would never validate (see the module)."""

    def __init__(self) -> None:
        self._schedule_after_restart: int | None = None

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # the loops are restored and their restart stage known here, before the epoch loop runs
        if _restarts_after_the_last_batch_and_its_validation(trainer):
            self._schedule_after_restart = trainer.check_val_every_n_epoch
            trainer.check_val_every_n_epoch = trainer.current_epoch + 1  # the saved epoch was validated
            log.info("resumed after the validation that ended epoch %d: that epoch is complete (the validation schedule "
                     "changed since; check_val_every_n_epoch=%s from epoch %d on)", trainer.current_epoch + 1,
                     self._schedule_after_restart, trainer.current_epoch + 2)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._restore_schedule(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._restore_schedule(trainer)

    def _restore_schedule(self, trainer: L.Trainer) -> None:
        if self._schedule_after_restart is not None:
            trainer.check_val_every_n_epoch, self._schedule_after_restart = self._schedule_after_restart, None

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
