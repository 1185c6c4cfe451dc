"""Optimizers and learning-rate schedules shared by the tasks."""
from __future__ import annotations

import math
from typing import Iterable

import torch


def build_optimizer(name: str, param_groups: Iterable[dict], lr: float, weight_decay: float, momentum: float = 0.9) -> torch.optim.Optimizer:
    name = name.lower()
    if name == "adamw":
        return torch.optim.AdamW(param_groups, lr=lr, weight_decay=weight_decay)
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
