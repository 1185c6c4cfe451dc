"""Exponential moving average (EMA) of the weights, with RT-DETR's / RF-DETR's warm-up ramp.

In a YAML config (RT-DETR's defaults; RF-DETR uses ``decay: 0.993, warmup_steps: 100``)::

    trainer:
      callbacks:
        - class_path: visiontf.callbacks.ModelEMA
          init_args: {decay: 0.9999, warmup_steps: 2000}

or ``--trainer.callbacks+=visiontf.callbacks.ModelEMA --trainer.callbacks.init_args.decay=0.993``.

Built on Lightning's :class:`~lightning.pytorch.callbacks.WeightAveraging` (Lightning >= 2.6),
which keeps a :class:`torch.optim.swa_utils.AveragedModel` copy of the LightningModule, swaps it
in for validation, copies it into the model when training ends, and writes checkpoints whose
``state_dict`` is the average (the raw weights go to ``current_model_state``, the update count
to ``averaging_state``). Anything that reads a checkpoint's ``state_dict`` (``tools/eval.py``,
``Predictor.from_checkpoint``, ``tools/export.py``) therefore gets the EMA weights with no code of
its own. The averaging itself is torch's ``get_ema_multi_avg_fn`` (a ``_foreach_lerp_``).

What this subclass adds to it:

* the decay ramp of RT-DETR (``src/optim/ema.py``) and RF-DETR (``rfdetr/util/utils.py``):
  ``d_u = decay * (1 - exp(-u / warmup_steps))`` at the ``u``-th update (``u = 1, 2, ...``), so the
  average follows the fast-moving early weights; ``warmup_steps: 0`` gives a constant decay.
  The first update copies the weights (torch's AveragedModel; ``d_1`` is ~0 anyway);
* integer buffers (BatchNorm's ``num_batches_tracked``) are copied, not averaged;
* DDP: parameters are identical on every rank, but BatchNorm running statistics are not (each
  rank normalises its own batch; DDP re-broadcasts rank 0's buffers only at the next forward).
  After each update the EMA's buffers are broadcast from rank 0, so every rank holds rank 0's
  EMA, which is also the one rank 0 writes to checkpoints;
* validation swaps in the EMA only while fitting, and resuming restores the raw weights only
  while fitting: ``trainer.validate/test(ckpt_path=...)`` after ``fit`` evaluates the EMA that
  checkpoint holds (Lightning's base class would evaluate the final average, or the raw weights);
* a checkpoint written after training ended (``ModelCheckpoint.on_train_end``) still stores the
  raw weights in ``current_model_state``, although the model then holds the EMA;
* D-FINE's restart at the end of the strong augmentation (``restart_epoch``, D-FINE's ``stop_epoch``): while the
  epochs before it are validated, the callback keeps the weights, the EMA (with its update count) and the optimizer
  state of the best validation (``monitor``, of the EMA's weights, as D-FINE's ``best_stg1.pth``); at the start of
  epoch ``restart_epoch`` it puts them back, and trains on from there with ``restart_decay`` (None: the decay stays).
  D-FINE also assigns its ``ema_restart_decay`` to its EMA's ``decay`` attribute then, which its update formula does not
  read (the formula closes over the decay it was built with): its decay stays, so its configs here leave
  ``restart_decay`` unset. The kept state lives in memory: a run resumed between the best epoch and the restart puts
  back the best state seen since the resume;
* the copy is made before ``configure_model``: visiontf tasks build their layers in ``__init__``
  and ``configure_model`` only compiles, and a compiled module is not worth deep-copying. A
  mismatch between the copy and the model is refused at fit start.
"""
from __future__ import annotations

import copy
import logging
import math
from collections.abc import Mapping
from typing import Any

import lightning.pytorch as pl
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import WeightAveraging
from lightning.pytorch.trainer.states import TrainerFn
from torch import Tensor
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from visiontf.core.saved_arguments import short_repr
from visiontf.io.training_state import TrainingStateError, shown, unlike

log = logging.getLogger(__name__)


def ema_decay(update: int, decay: float, warmup_steps: int) -> float:
    """Decay of the ``update``-th EMA update (1-based): ``decay * (1 - exp(-update / warmup_steps))``."""
    if warmup_steps <= 0:
        return decay
    return decay * (1.0 - math.exp(-update / warmup_steps))


class ModelEMA(WeightAveraging):
    """EMA of a LightningModule's parameters and buffers, updated after every optimizer step.

    Args:
        decay: the decay the ramp tends to (RT-DETR 0.9999, RF-DETR 0.993).
        warmup_steps: time constant of the ramp in optimizer steps (RT-DETR 2000, RF-DETR's
            ``ema_tau`` 100); 0 disables it.
        use_buffers: average the floating-point buffers (BatchNorm statistics) too, as RT-DETR
            and RF-DETR do; False keeps the EMA's buffers equal to the model's.
        device: where the EMA lives (default: the model's device); ``"cpu"`` saves accelerator
            memory at the cost of a copy per step.
        restart_epoch: D-FINE's restart: at the start of this epoch, put back the weights, EMA and optimizer state of
            the best validation before it (None: no restart).
        restart_decay: the decay after the restart (None: unchanged).
        monitor: the validation metric that picks the best state (higher is better).

    The update count is ``AveragedModel.n_averaged``, saved in checkpoints and restored on resume.
    """

    def __init__(
        self,
        decay: float = 0.9999,
        warmup_steps: int = 2000,
        use_buffers: bool = True,
        device: torch.device | str | int | None = None,
        restart_epoch: int | None = None,
        restart_decay: float | None = None,
        monitor: str = "val/mAP",
    ) -> None:
        if not 0.0 <= decay <= 1.0:
            raise ValueError(f"ModelEMA: decay must be in [0, 1], got {decay}")
        if restart_epoch is not None and (isinstance(restart_epoch, bool) or int(restart_epoch) != restart_epoch or restart_epoch < 1):
            raise ValueError(f"ModelEMA: restart_epoch must be an epoch >= 1 (D-FINE's stop_epoch), got {restart_epoch!r}")
        if restart_decay is not None and not 0.0 <= restart_decay <= 1.0:
            raise ValueError(f"ModelEMA: restart_decay must be in [0, 1], got {restart_decay}")
        if warmup_steps < 0:
            raise ValueError(f"ModelEMA: warmup_steps must be >= 0, got {warmup_steps}")
        super().__init__(device=device, use_buffers=use_buffers, multi_avg_fn=self._average)
        self.decay = float(decay)
        self.warmup_steps = int(warmup_steps)
        self._raw_after_fit: dict[str, Tensor] | None = None
        self.restart_epoch = None if restart_epoch is None else int(restart_epoch)
        self.restart_decay = None if restart_decay is None else float(restart_decay)
        self.monitor = monitor
        self._best: tuple[float, dict[str, Any]] | None = None
        self.restarted_from: float | None = None  # the monitored value of the state put back, once restarted

    # -- the average ---------------------------------------------------------------------------
    def decay_at(self, update: int) -> float:
        """Decay used at the ``update``-th update (1-based)."""
        return ema_decay(update, self.decay, self.warmup_steps)

    @torch.no_grad()
    def _average(self, ema: list[Tensor], current: list[Tensor], num_averaged: Tensor) -> None:
        # AveragedModel calls this once per (device, dtype) group from the second update on;
        # num_averaged counts the updates before this one.
        if torch.is_floating_point(ema[0]) or torch.is_complex(ema[0]):
            get_ema_multi_avg_fn(self.decay_at(int(num_averaged) + 1))(ema, current, num_averaged)
        else:
            for e, c in zip(ema, current):
                e.copy_(c)

    @property
    def num_updates(self) -> int:
        """EMA updates done so far (0 before fit)."""
        return int(self._average_model.n_averaged) if self._average_model is not None else 0

    # -- Lightning hooks -----------------------------------------------------------------------
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit":
            self._raw_after_fit = None
            device = self._device or pl_module.device
            self._average_model = AveragedModel(
                model=pl_module, device=device, use_buffers=self._use_buffers, **self._kwargs
            )

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._average_model is None:
            return
        ours = [tuple(t.shape) for t in (*self._average_model.module.parameters(), *self._average_model.module.buffers())]
        theirs = [tuple(t.shape) for t in (*pl_module.parameters(), *pl_module.buffers())]
        if ours != theirs:
            raise RuntimeError(
                "ModelEMA: the LightningModule's parameters changed after setup (layers created in "
                "configure_model?); ModelEMA copies the module in setup - build the layers in __init__"
            )

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any,
                           batch: Any, batch_idx: int) -> None:
        before = self._latest_update_step
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        if self._latest_update_step != before:
            self._broadcast_buffers(trainer)

    def _broadcast_buffers(self, trainer: pl.Trainer) -> None:
        if trainer.world_size < 2 or not (dist.is_available() and dist.is_initialized()):
            return
        assert self._average_model is not None
        buffers = list(self._average_model.module.buffers())
        for dtype in sorted({b.dtype for b in buffers}, key=str):
            group = [b for b in buffers if b.dtype == dtype]
            flat = torch.cat([b.detach().reshape(-1) for b in group]).to(trainer.strategy.root_device)
            dist.broadcast(flat, src=0)
            offset = 0
            for b in group:
                b.detach().copy_(flat[offset : offset + b.numel()].view_as(b))
                offset += b.numel()

    def on_validation_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.state.fn == TrainerFn.FITTING:
            super().on_validation_epoch_start(trainer, pl_module)

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.state.fn == TrainerFn.FITTING:
            super().on_validation_epoch_end(trainer, pl_module)

    # -- D-FINE's restart -------------------------------------------------------------------------
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if (self.restart_epoch is None or trainer.state.fn != TrainerFn.FITTING or trainer.sanity_checking
                or self._average_model is None or trainer.current_epoch >= self.restart_epoch):
            return
        value = trainer.callback_metrics.get(self.monitor)
        if value is None:
            return
        value = float(value)
        if self._best is None or value > self._best[0]:
            cpu = lambda sd: {k: v.detach().to("cpu", copy=True) for k, v in sd.items()}  # noqa: E731
            self._best = (value, {
                "model": cpu(pl_module.state_dict()), "ema": cpu(self._average_model.state_dict()),
                "optimizers": [copy.deepcopy(o.state_dict()) for o in trainer.optimizers]})

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.restart_epoch is None or trainer.current_epoch != self.restart_epoch or self.restarted_from is not None:
            return
        if self._best is not None:
            value, state = self._best
            pl_module.load_state_dict(state["model"])
            assert self._average_model is not None
            self._average_model.load_state_dict(state["ema"])
            for opt, saved in zip(trainer.optimizers, state["optimizers"]):
                opt.load_state_dict(saved)
            self.restarted_from = value
            self._best = None
        if self.restart_decay is not None:
            self.decay = self.restart_decay
        log.info("ModelEMA: restart at epoch %d from the best state before it (%s %s), decay %s", trainer.current_epoch,
                 self.monitor, "none validated" if self.restarted_from is None else f"{self.restarted_from:.4f}", self.decay)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # a checkpoint saved after this (ModelCheckpoint.on_train_end) must still carry the raw weights
        self._raw_after_fit = {k: v.detach().clone() for k, v in pl_module.state_dict().items()}
        super().on_train_end(trainer, pl_module)

    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(trainer, pl_module, checkpoint)
        if self._raw_after_fit is not None and "current_model_state" in checkpoint:
            checkpoint["current_model_state"] = self._raw_after_fit

    def on_load_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        if trainer.state.fn != TrainerFn.FITTING or self._average_model is None:
            # validate / test / predict: the checkpoint's state_dict already holds the EMA weights
            return
        # Lightning loads both strictly into the module and the average: another shape was a bare traceback, and
        # NaN raw weights trained on from NaN
        where = trainer.ckpt_path or "the checkpoint resumed from"
        own = {k: v for k, v in self._average_model.state_dict().items() if not k.startswith("module.")}
        for field, live in (("current_model_state", pl_module.state_dict()), ("averaging_state", own)):
            if field in checkpoint:
                found = unlike(checkpoint[field], live, field, extra_keys="refuse")
                if found:
                    raise TrainingStateError(f"{where}: {found[0]} is {shown(found[1])}, where this run's ModelEMA "
                                             f"needs {found[2]}; resume from a checkpoint this config wrote")
        super().on_load_checkpoint(trainer, pl_module, checkpoint)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        step = state_dict.get("latest_update_step") if isinstance(state_dict, Mapping) else None
        if not isinstance(step, int) or isinstance(step, bool) or step < -1:
            raise TrainingStateError(f"the checkpoint resumed from: its ModelEMA state {short_repr(state_dict)} is not "
                                     "the step count this callback saves ({'latest_update_step': N}); resume from a "
                                     "checkpoint this config wrote")
        super().load_state_dict(state_dict)


__all__ = ["ModelEMA", "ema_decay"]
