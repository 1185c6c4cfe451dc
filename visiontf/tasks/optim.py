"""Optimizers and learning-rate schedules shared by the tasks, and their arguments.

The optimiser and schedule arguments every task shares, declared once with one spelling.

A task keeps them as flat ``__init__`` keywords (LightningCLI shows each one under ``model.init_args``
and checkpoints save them as hyper-parameters) and reads them back through :class:`OptimArgsMixin` as one
typed, checked :class:`OptimArgs`. Warm-up is always ``warmup_steps``, in optimizer steps; the
classification task once spelled it ``warmup_epochs`` (:data:`RENAMED`: a checkpoint saved so still loads,
with a warning naming the new spelling).
"""
from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import nn

from visiontf.models.contract import VisionModel

log = logging.getLogger(__name__)


def group_parameters(model: nn.Module, group_of: Callable[[str], str] | None = None) -> dict[str, list[nn.Parameter]]:
    """Trainable parameters by group name, each group in ``named_parameters()`` order.

    The group of a parameter is the model's own answer, ``model.param_group(name)`` (timm style: the
    model knows which of its parameters are backbone, heads or deformable offsets); ``group_of``
    replaces it (a task's own grouping).
    """
    if group_of is None:
        if not isinstance(model, VisionModel):
            raise TypeError(f"{type(model).__name__} is not a visiontf model (visiontf.models.contract.VisionModel), so it has "
                            "no param_group(name); subclass its kind or pass group_of")
        group_of = model.param_group
    groups: dict[str, list[nn.Parameter]] = {}
    for name, p in model.named_parameters():
        if p.requires_grad:
            groups.setdefault(group_of(name), []).append(p)
    return groups


def lr_groups(groups: dict[str, list[nn.Parameter]], lrs: dict[str, float], always: Sequence[str] = ()) -> list[dict]:
    """Optimizer param groups ``{"params", "lr"}`` in the order of ``lrs``; a group the model does not
    have is left out unless named in ``always`` (kept, possibly empty, so the optimizer state keeps its
    layout and old checkpoints resume)."""
    unknown = sorted(set(groups) - set(lrs))
    if unknown:
        raise ValueError(f"the model names parameter group(s) {unknown}; this task sets learning rates for {sorted(lrs)}")
    return [{"params": groups.get(g, []), "lr": lr} for g, lr in lrs.items() if g in groups or g in always]


def layer_decay_groups(model: nn.Module, lrs: dict[str, float], decay: float, always: Sequence[str] = ()) -> list[dict]:
    """:func:`lr_groups` with layer-wise learning-rate decay (ViTDet's ``get_vit_lr_decay_rate``, BEiT's):
    a parameter at ``model.layer_depth(name) == (i, L)`` trains at its group's lr times
    ``decay ** (L + 1 - i)`` (the patch embedding, i = 0, least; the last block, i = L, ``decay`` times;
    parameters without a depth, None, at the group's lr). One optimizer group per (group, factor), in
    the order of ``lrs`` and, within one, of decreasing factor; each carries its ``lr_scale``."""
    if not 0 < decay <= 1:
        raise ValueError(f"layer_decay={decay}: a factor in (0, 1] (ViTDet: 0.7)")
    if not isinstance(model, VisionModel):
        raise TypeError(f"{type(model).__name__} is not a visiontf model, so it has no layer_depth(name)")
    buckets: dict[tuple[str, float], list[nn.Parameter]] = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        depth = model.layer_depth(name)
        scale = 1.0 if depth is None else decay ** (depth[1] + 1 - depth[0])
        buckets.setdefault((model.param_group(name), scale), []).append(p)
    unknown = sorted({g for g, _ in buckets} - set(lrs))
    if unknown:
        raise ValueError(f"the model names parameter group(s) {unknown}; this task sets learning rates for {sorted(lrs)}")
    out = []
    for group, lr in lrs.items():
        scales = sorted((s for g, s in buckets if g == group), reverse=True)
        if not scales and group in always:
            out.append({"params": [], "lr": lr, "lr_scale": 1.0})
        out += [{"params": buckets[(group, s)], "lr": lr * s, "lr_scale": s} for s in scales]
    return out


def decay_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """timm's weight-decay split: biases, norms (every parameter with ndim <= 1) and the names in
    ``model.no_weight_decay()`` get none; two groups, decayed first."""
    skip = set(model.no_weight_decay())
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (no_decay if p.ndim <= 1 or name in skip else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


_FUSED_ADAMW_DEVICES = ("cpu", "cuda")


def can_fuse_adamw(param_groups: Iterable[dict]) -> bool:
    """Whether torch's fused AdamW takes these groups: floating-point parameters on CPU or CUDA.
    Fused, one AdamW step of ``dino_tiny`` takes 5 ms on a 2-core CPU instead of 21 ms (the for-loop
    implementation is torch's CPU default); the update is the same up to float rounding."""
    params = [p for g in param_groups for p in g["params"]]
    return bool(params) and all(p.is_floating_point() and p.device.type in _FUSED_ADAMW_DEVICES for p in params)


def build_optimizer(name: str, param_groups: Iterable[dict], lr: float, weight_decay: float, momentum: float = 0.9) -> torch.optim.Optimizer:
    """AdamW (fused where :func:`can_fuse_adamw`) or SGD (with ``momentum``) over ``param_groups``;
    ``lr``/``weight_decay`` are the groups' defaults."""
    name = name.lower()
    if name == "adamw":
        param_groups = list(param_groups)
        return torch.optim.AdamW(param_groups, lr=lr, weight_decay=weight_decay, fused=can_fuse_adamw(param_groups) or None)
    if name == "sgd":
        return torch.optim.SGD(param_groups, lr=lr, momentum=momentum, weight_decay=weight_decay)
    raise ValueError(f"unknown optimizer {name!r}; use 'adamw' or 'sgd'")


def lr_lambda(schedule: str, total_steps: int, warmup_steps: int = 0, power: float = 0.9, min_ratio: float = 0.0):
    """Per-step multiplier for ``LambdaLR``: linear warm-up then cosine / poly / constant."""
    schedule = schedule.lower()
    if schedule not in ("cosine", "poly", "constant"):
        raise ValueError(f"unknown step schedule {schedule!r}; use cosine, poly or constant")
    total = max(1, total_steps)

    def f(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        if schedule == "constant":
            return 1.0
        t = min(1.0, (step - warmup_steps) / max(1, total - warmup_steps))
        if schedule == "cosine":
            return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * t))
        return min_ratio + (1 - min_ratio) * (1 - t) ** power

    return f


def build_scheduler(optimizer, schedule: str, total_steps: int, warmup_steps: int = 0, power: float = 0.9,
                    step_epochs: int | None = None, gamma: float = 0.1, min_lr: float = 0.0) -> dict:
    """A Lightning ``lr_scheduler`` dict. ``"step"`` drops by ``gamma`` every ``step_epochs`` epochs (DETR).

    ``min_lr`` is an absolute floor shared by every parameter group (mmseg's PolyLR ``eta_min``):
    each group gets its own multiplier so groups with different base lrs all end at ``min_lr``.
    """
    if schedule == "step":
        if not step_epochs:
            raise ValueError("schedule 'step' needs lr_drop_epochs")
        return {"scheduler": torch.optim.lr_scheduler.StepLR(optimizer, step_size=step_epochs, gamma=gamma), "interval": "epoch"}
    lambdas = [
        lr_lambda(schedule, total_steps, warmup_steps, power, min_ratio=min(1.0, min_lr / g["lr"]) if min_lr else 0.0)
        for g in optimizer.param_groups
    ]
    sched = torch.optim.lr_scheduler.LambdaLR(optimizer, lambdas)
    return {"scheduler": sched, "interval": "step"}


# ---------------------------------------------------------------------------------------- arguments
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
