"""The optimiser and schedule arguments every task shares, declared once with one spelling.

A task keeps them as flat ``__init__`` keywords (LightningCLI shows each one under ``model.init_args``
and checkpoints save them as hyper-parameters) and reads them back through :class:`OptimArgsMixin` as one
typed, checked :class:`OptimArgs`. Warm-up is always ``warmup_steps``, in optimizer steps; the
classification task once spelled it ``warmup_epochs`` (:data:`RENAMED`: a checkpoint saved so still loads,
with a warning naming the new spelling).
"""
from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

__all__ = ["RENAMED", "OptimArgs", "OptimArgsMixin", "renamed_hyperparameters"]

log = logging.getLogger(__name__)

#: hyper-parameters a former visiontf spelled otherwise: old name -> the name every task uses now
RENAMED: dict[str, str] = {"warmup_epochs": "warmup_steps"}


@dataclass(frozen=True)
class OptimArgs:
    """What every task's optimiser and schedule read (each task adds its own: learning-rate groups, steps).

    Args:
        lr: the base learning rate.
        weight_decay: decoupled weight decay (AdamW) or L2 (SGD).
        schedule: the task's schedule name (``"cosine"``, ``"poly"``, ``"step"``, ``"constant"``: each task
            says which it takes).
        warmup_steps: linear warm-up over this many optimizer steps (0: none).
        optimizer: ``"adamw"`` or ``"sgd"``.
        momentum: SGD's momentum.
    """

    lr: float
    weight_decay: float = 0.0
    schedule: str = "cosine"
    warmup_steps: int = 0
    optimizer: str = "adamw"
    momentum: float = 0.9

    def __post_init__(self) -> None:
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.weight_decay < 0:
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay}")
        if isinstance(self.warmup_steps, bool) or int(self.warmup_steps) != self.warmup_steps or self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be a whole number of optimizer steps >= 0, got {self.warmup_steps!r}")
        object.__setattr__(self, "warmup_steps", int(self.warmup_steps))
        if self.optimizer.lower() not in ("adamw", "sgd"):
            raise ValueError(f"optimizer must be 'adamw' or 'sgd', got {self.optimizer!r}")

    @classmethod
    def from_hparams(cls, hparams: Mapping[str, Any], **overrides: Any) -> OptimArgs:
        """The fields a task's hyper-parameters hold (the others at their defaults), ``overrides`` on top."""
        names = {f.name for f in fields(cls)}
        return cls(**{**{k: v for k, v in hparams.items() if k in names}, **overrides})


def renamed_hyperparameters(hparams: Mapping[str, Any], where: str) -> dict[str, Any]:
    """``{old: value}`` of the :data:`RENAMED` hyper-parameters ``hparams`` holds, each logged once with its new name.

    Lightning builds a task from a checkpoint's hyper-parameters and leaves out the keywords the task no longer
    takes, so an old name is said here rather than lost without a word.
    """
    found = {old: hparams[old] for old in RENAMED if old in hparams}
    for old, value in found.items():
        log.warning("%s: the checkpoint was saved with %s=%r, which visiontf now spells %s (optimizer steps, as every "
                    "task); the weights load, that setting is not carried over: set %s in the config to train on",
                    where, old, value, RENAMED[old], RENAMED[old])
    return found


class OptimArgsMixin:
    """For a task: its optimiser and schedule hyper-parameters as one checked :class:`OptimArgs`."""

    hparams: Mapping[str, Any]

    @property
    def optim_args(self) -> OptimArgs:
        return OptimArgs.from_hparams(self.hparams)

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        super().on_load_checkpoint(checkpoint)  # type: ignore[misc]
        renamed_hyperparameters(checkpoint.get("hyper_parameters") or {}, type(self).__name__)
