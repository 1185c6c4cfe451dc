"""Lightning's ``ModelCheckpoint`` with a ``last.ckpt`` that is always the latest state.

What Lightning 2.6 does and why it is not enough:

* With ``save_last=True`` and a ``monitor``, ``last.ckpt`` is written only when a top-k checkpoint
  is (at epoch end Lightning checks "was a checkpoint saved at this step?"). When the monitored
  metric does not improve, ``last.ckpt`` keeps an old state, and ``--ckpt_path last`` resumes from
  it (re-running epochs) or evaluates the best model instead of the last one.
* With ``every_n_train_steps`` and a ``monitor`` that validation has not logged yet, both saves are
  deferred to the next validation, so nothing is written in between.
* With ``check_val_every_n_epoch > 1`` nothing is saved in the epochs without validation.
* After the run folder was moved, the restored ``last_model_path`` points at the old place, so the
  version counter writes ``last-v1.ckpt`` next to the real ``last.ckpt``, which stays behind.

:class:`LastAndBestCheckpoint` keeps Lightning's top-k logic as it is and adds: ``last.ckpt`` is
written at the end of every training epoch and every ``every_n_train_steps`` steps, whatever the
monitored metric does, always under the same name (no ``-vN`` copies); it is written after any
top-k checkpoint of the same step, so its callback state knows that checkpoint. Resuming from a
moved folder re-bases the best-k paths onto the new folder when their files are there, so the
best checkpoint keeps being tracked. Atomic writes are the ``CheckpointIO``'s job
(:mod:`visiontf.callbacks.checkpoint_io`). A checkpoint whose state names files outside its own folder is refused
(:func:`visiontf.io.lightning_checkpoint.check_callback_paths`): Lightning deletes the files the restored
``kth_best_model_path`` and ``last_model_path`` name when it replaces them.
"""
from __future__ import annotations

import logging
import os
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.fabric.utilities.cloud_io import _is_local_file_protocol
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import Tensor

from visiontf.io.lightning_checkpoint import check_callback_paths, lies_under

log = logging.getLogger(__name__)


class LastAndBestCheckpoint(ModelCheckpoint):
    """``ModelCheckpoint`` (same arguments) whose ``last.ckpt`` is the latest state at every save.

    ``tools/train.py`` configures it under ``checkpoint`` (``--checkpoint.monitor``,
    ``--checkpoint.every_n_train_steps``, ...). ``save_last="link"`` keeps Lightning's behaviour.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._last_written_step = -1

    # ------------------------------------------------------------------ when
    def _may_save(self, trainer: pl.Trainer) -> bool:
        from lightning.pytorch.trainer.states import TrainerFn

        return bool(self.save_last) and not (
            trainer.fast_dev_run or trainer.state.fn != TrainerFn.FITTING or trainer.sanity_checking
        )

    def _save_last_if_stale(self, trainer: pl.Trainer) -> None:
        if self._may_save(trainer) and self._last_written_step != trainer.global_step:
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        n = self._every_n_train_steps
        if n >= 1 and trainer.global_step % n == 0:
            self._save_last_if_stale(trainer)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_validation_end(trainer, pl_module)
        # a top-k checkpoint saved just now was followed by Lightning's own last save; otherwise the
        # state after validation (new metrics in the callback state) is still the latest
        self._save_last_if_stale(trainer)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_train_epoch_end(trainer, pl_module)
        self._save_last_if_stale(trainer)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_train_end(trainer, pl_module)
        if self.monitor and not self.best_model_path and self._may_save(trainer) and trainer.is_global_zero:
            # max_steps / max_time ended the run before any validation logged the monitored metric
            log.warning(
                "training ended at step %d before any validation logged %r: no best checkpoint was written (only %s). "
                "Validate more often (--trainer.check_val_every_n_epoch, --trainer.val_check_interval) or train longer",
                trainer.global_step, self.monitor, self.last_model_path or "no last.ckpt")

    # ------------------------------------------------------------------ how
    def _save_last_checkpoint(self, trainer: pl.Trainer, monitor_candidates: dict[str, Tensor]) -> None:
        if not self.save_last:
            return
        if self.save_last == "link":
            super()._save_last_checkpoint(trainer, monitor_candidates)
            self._last_written_step = trainer.global_step
            return
        # one fixed name: overwrite it, never a "-v1" copy beside it
        filepath = self.format_checkpoint_name(monitor_candidates, self.CHECKPOINT_NAME_LAST)
        previous, self.last_model_path = self.last_model_path, filepath
        # trainer.save_checkpoint, not self._save_checkpoint: that one also marks the step as saved for
        # top-k ("_last_global_step_saved"), which would make Lightning skip a due top-k save
        trainer.save_checkpoint(filepath, self.save_weights_only)
        self._last_written_step = trainer.global_step
        self._last_checkpoint_saved = filepath
        if previous and self._should_remove_checkpoint(trainer, previous, filepath):
            self._remove_checkpoint(trainer, previous)

    # ------------------------------------------------------------------ resume
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # the restored paths are deleted when replaced: only files in the state's own folder, however the checkpoint
        # was read (visiontf's CheckpointIO checks every callback's state; a plain Trainer's does not)
        check_callback_paths({"callbacks": {self.state_key: state_dict}}, "the checkpoint resumed from")
        old = state_dict.get("dirpath")
        if old and self.dirpath and os.path.realpath(old) != os.path.realpath(self.dirpath):
            state_dict = self._rebased(state_dict, str(old), str(self.dirpath))
        super().load_state_dict(state_dict)
        # forgotten now, named when training starts: Lightning restores callbacks for validate, test and predict too,
        # where nothing is saved and the best checkpoints' tracking does not apply
        self._forgotten_paths = confine_restored_paths(self, warn=False)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        forgotten, self._forgotten_paths = getattr(self, "_forgotten_paths", []), []
        if forgotten:
            _warn_forgotten(self, forgotten)
        # every checkpoint callback's restored paths (Lightning's own ModelCheckpoint restores best_model_path from
        # another folder too), before anything saves, deletes or uploads what they name
        for callback in trainer.checkpoint_callbacks:
            if isinstance(callback, ModelCheckpoint) and not isinstance(callback, LastAndBestCheckpoint):
                confine_restored_paths(callback)

    @staticmethod
    def _rebased(state: dict[str, Any], old: str, new: str) -> dict[str, Any]:
        """The state with paths under ``old`` moved under ``new``, when the folder was moved (its best
        checkpoint is there); otherwise unchanged (Lightning then drops the best-k state, as it does
        for a different folder)."""
        prefix = old.rstrip(os.sep) + os.sep

        def move(path: Any) -> Any:
            if not isinstance(path, str) or not path.startswith(prefix):
                return path
            # the name below the old folder, never an absolute path (os.path.join(new, "/x") is "/x")
            return os.path.join(new, path[len(prefix):].lstrip("/\\"))

        best = move(state.get("best_model_path") or "")
        if not best or best == state.get("best_model_path") or not os.path.isfile(best):
            return state
        out = dict(state)
        for key in ("best_model_path", "kth_best_model_path", "last_model_path"):
            out[key] = move(state.get(key))
        out["best_k_models"] = {move(k): v for k, v in (state.get("best_k_models") or {}).items() if os.path.isfile(move(k))}
        out["dirpath"] = new
        log.info("checkpoint folder moved from %s to %s; tracking its %d best checkpoint(s) there", old, new,
                 len(out["best_k_models"]))
        return out


def confine_restored_paths(callback: ModelCheckpoint, warn: bool = True) -> list[str]:
    """Forget the paths of ``callback``'s state that do not name a checkpoint file (``FILE_EXTENSION``) in its own
    folder (real paths), and return them.

    What a checkpoint callback restores from a file it later deletes (the last and the k-th best checkpoint when
    replaced), reads (``best`` for testing) and hands to the loggers that upload checkpoints (``log_model``):
    whatever the file wrote, only files of the run's own checkpoint folder are kept. A path elsewhere clears the
    top-k state it belongs to (the best scores go with their files) or the last checkpoint's path, with one warning
    (``warn``; the caller may give it later, :func:`_warn_forgotten`).
    """
    folder = callback.dirpath
    if not folder:
        return []
    local = _is_local_file_protocol(str(folder))
    real = os.path.realpath(folder) if local else str(folder)

    def inside(path: Any) -> bool:
        # a checkpoint file of the folder: the callback deletes what these paths name, and names its files so
        return not path or (isinstance(path, str) and path.endswith(callback.FILE_EXTENSION)
                            and lies_under(os.path.realpath(path) if local else path, real))

    dropped = []
    top_k = [callback.best_model_path, callback.kth_best_model_path, *callback.best_k_models]
    if not all(inside(p) for p in top_k):
        dropped += [str(p) for p in top_k if not inside(p)]
        callback.best_k_models = {}
        callback.kth_best_model_path = callback.best_model_path = ""
        callback.best_model_score = None
        callback.kth_value = torch.tensor(torch.inf if callback.mode == "min" else -torch.inf)
    if not inside(callback.last_model_path):
        dropped.append(str(callback.last_model_path))
        callback.last_model_path = ""
    if dropped and warn:
        _warn_forgotten(callback, dropped)
    return dropped


def _warn_forgotten(callback: ModelCheckpoint, dropped: list[str]) -> None:
    log.warning("%s: the checkpoint resumed from names %s, which are not checkpoint files of this run's checkpoint "
                "folder %s; they are not tracked (nor deleted, read or uploaded), and the best checkpoints start "
                "afresh here",
                type(callback).__name__, ", ".join(sorted(set(dropped))), callback.dirpath)


__all__ = ["LastAndBestCheckpoint", "confine_restored_paths"]
