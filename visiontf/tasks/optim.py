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
import re
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
    Fused, the update is one kernel over all parameters instead of torch's CPU default, a Python loop over
    them, which costs most on small models (docs/record/speed.md#measurements-behind-comments-in-the-code);
    the update is the same up to float rounding."""
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


# ---------------------------------------------------------------------------------------- declared parameter groups
#: what a parameter is, for :class:`ParamGroupRule`'s ``kinds``
PARAM_KINDS = ("norm", "bias", "weight")

_NORM_TYPES: tuple[type[nn.Module], ...] = (nn.modules.batchnorm._NormBase, nn.LayerNorm, nn.GroupNorm,
                                            *((nn.RMSNorm,) if hasattr(nn, "RMSNorm") else ()))


def param_kinds(model: nn.Module) -> dict[str, str]:
    """Each parameter's kind by the module that holds it: ``"norm"`` (a normalisation layer's weight or bias:
    BatchNorm, LayerNorm, GroupNorm and their subclasses, whatever they are called), ``"bias"`` (another layer's
    ``bias``) or ``"weight"`` (the rest: convolution and linear weights, embeddings, scales)."""
    kinds: dict[str, str] = {}
    for prefix, module in model.named_modules():
        is_norm = isinstance(module, _NORM_TYPES)
        for name, _ in module.named_parameters(recurse=False):
            full = f"{prefix}.{name}" if prefix else name
            kinds[full] = "norm" if is_norm else "bias" if name == "bias" else "weight"
    return kinds


def backtracking_hazard(pattern: str) -> str | None:
    """Why ``pattern`` can backtrack exponentially (a repeat of something that itself repeats or branches, as
    ``(.*)*x`` or ``(a|ab)+c``, or a back-reference), or None."""
    from re import _constants as c
    from re import _parser

    def repeats(items) -> bool:  # whether items match more than one way by themselves
        return any(op in (c.MAX_REPEAT, c.MIN_REPEAT, c.POSSESSIVE_REPEAT) and av[1] > 1 or op is c.BRANCH
                   or any(repeats(sub) for sub in _children(op, av)) for op, av in items)

    def _children(op, av) -> list:
        if op is c.SUBPATTERN:
            return [av[-1]]
        if op in (c.MAX_REPEAT, c.MIN_REPEAT, c.POSSESSIVE_REPEAT):
            return [av[2]]
        if op is c.BRANCH:
            return list(av[1])
        if op in (c.ASSERT, c.ASSERT_NOT):
            return [av[1]]
        if op is c.ATOMIC_GROUP:
            return [av]
        return []

    def walk(items) -> str | None:
        for op, av in items:
            if op in (c.GROUPREF, c.GROUPREF_EXISTS):
                return "has a back-reference"
            if op in (c.MAX_REPEAT, c.MIN_REPEAT) and av[1] == c.MAXREPEAT and repeats(av[2]):
                return "repeats a part that itself repeats or branches"
            for sub in _children(op, av):
                why = walk(sub)
                if why:
                    return why
        return None

    return walk(_parser.parse(pattern))


@dataclass(frozen=True)
class ParamGroupRule:
    """One declared optimizer group (a config section: ``model.init_args.param_groups`` is a list of them).

    The trainable parameters whose name ``pattern`` finds (``re.search``; ``""``: every name) and whose kind
    (:func:`param_kinds`) is in ``kinds`` (empty: any) train with this group's ``weight_decay`` and ``lr`` instead of
    the task's. The first rule that takes a parameter wins; parameters no rule takes keep the task's groups. A rule
    leaves the learning-rate group a parameter is in (the model's ``param_group``: backbone, default, offsets) as it
    is unless it sets ``lr``, so "backbone norms without decay" keeps the backbone's rate.

    Args:
        pattern: a regular expression searched in the parameter's name (``"^(encoder|decoder)\\."``).
        kinds: any of ``"norm"``, ``"bias"``, ``"weight"``.
        weight_decay: the group's weight decay (None: the task's).
        lr: the group's learning rate, absolute (None: the rate of the parameter's own learning-rate group).
    """

    pattern: str = ""
    kinds: tuple[str, ...] = ()
    weight_decay: float | None = None
    lr: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "kinds", tuple(self.kinds))
        bad = [k for k in self.kinds if k not in PARAM_KINDS]
        if bad:
            raise ValueError(f"param_groups: kinds {bad} unknown; use any of {list(PARAM_KINDS)}")
        try:
            re.compile(self.pattern)
        except re.error as e:
            raise ValueError(f"param_groups: pattern {self.pattern!r} is not a regular expression ({e})") from None
        why = backtracking_hazard(self.pattern)
        if why:
            # a checkpoint's hyper-parameters carry these rules: a file must not be able to stall a run in re.search
            raise ValueError(f"param_groups: pattern {self.pattern!r} {why}, which can take exponential time to search; "
                             "write it without (e.g. '^(encoder|decoder)\\.' or 'backbone\\..*norm')")
        if self.weight_decay is not None and self.weight_decay < 0:
            raise ValueError(f"param_groups: weight_decay must be >= 0, got {self.weight_decay}")
        if self.lr is not None and not self.lr > 0:
            raise ValueError(f"param_groups: lr must be > 0, got {self.lr}")

    def takes(self, name: str, kind: str) -> bool:
        return (not self.kinds or kind in self.kinds) and re.search(self.pattern, name) is not None

    @classmethod
    def of(cls, value: ParamGroupRule | Mapping[str, Any]) -> ParamGroupRule:
        """A rule from itself or from its fields as a mapping (a checkpoint's hyper-parameters hold mappings)."""
        if isinstance(value, ParamGroupRule):
            return value
        if not isinstance(value, Mapping):
            raise TypeError(f"param_groups: each entry is a mapping of {[f.name for f in fields(cls)]}, got {value!r}")
        unknown = sorted(set(value) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"param_groups: unknown field(s) {unknown}; a rule has {[f.name for f in fields(cls)]}")
        return cls(**value)

    def as_dict(self) -> dict[str, Any]:
        return {"pattern": self.pattern, "kinds": list(self.kinds), "weight_decay": self.weight_decay, "lr": self.lr}


def rule_groups(model: nn.Module, lrs: dict[str, float], rules: Sequence[ParamGroupRule],
                always: Sequence[str] = ()) -> list[dict]:
    """:func:`lr_groups` with the declared :class:`ParamGroupRule` groups split off.

    Per learning-rate group (in the order of ``lrs``): the parameters no rule takes (kept, possibly empty, for the
    names in ``always``), then one group per rule that takes any of them, in the rules' order, with the rule's
    ``weight_decay`` and ``lr`` where it sets them. Every group carries ``rule``: None or the rule's index.
    """
    if not isinstance(model, VisionModel):
        raise TypeError(f"{type(model).__name__} is not a visiontf model, so it has no param_group(name)")
    kinds = param_kinds(model)
    buckets: dict[tuple[str, int | None], list[nn.Parameter]] = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        rule = next((i for i, r in enumerate(rules) if r.takes(name, kinds[name])), None)
        buckets.setdefault((model.param_group(name), rule), []).append(p)
    unknown = sorted({g for g, _ in buckets} - set(lrs))
    if unknown:
        raise ValueError(f"the model names parameter group(s) {unknown}; this task sets learning rates for {sorted(lrs)}")
    out: list[dict] = []
    for group, lr in lrs.items():
        if (group, None) in buckets or group in always:
            out.append({"params": buckets.get((group, None), []), "lr": lr, "rule": None})
        for i, r in enumerate(rules):
            if (group, i) in buckets:
                g = {"params": buckets[(group, i)], "lr": lr if r.lr is None else r.lr, "rule": i}
                if r.weight_decay is not None:
                    g["weight_decay"] = r.weight_decay
                out.append(g)
    return out


# ---------------------------------------------------------------------------------------- DEIM's flat-cosine schedule
@dataclass(frozen=True)
class FlatCosine:
    """DEIM's flat-cosine learning rate (``model.init_args.flat_cosine``, with ``schedule: flat_cosine``).

    A warm-up over the task's ``warmup_steps`` (DEIM's is quadratic: ``(step / warmup) ** 2``), the full rate until
    epoch ``flat_epochs``, a half cosine down to ``min_ratio`` times the rate until ``no_aug_epochs`` before the end,
    and ``min_ratio`` times the rate after. DEIM-D-FINE-S: flat 64, no_aug 12 of 132 epochs, min_ratio 0.5 (its
    ``lr_gamma``); DEIM-D-FINE-N's flat 7800 of 160 with min_ratio 1 keeps the full rate. Each parameter group follows
    it at its own rate. DEIM sets the rate after each step for the next one (its step k >= 1 runs at the formula's
    value at k - 1, its first step at the full rate); here step k runs at the value at k.

    Args:
        flat_epochs: the epoch the cosine starts at (DEIM's ``flat_epoch``; the warm-up is inside it).
        no_aug_epochs: the last epochs, at the lowest rate (DEIM's ``no_aug_epoch``).
        min_ratio: the lowest rate over the full one (DEIM's ``lr_gamma``).
        warmup: ``"quadratic"`` (DEIM) or ``"linear"``.
    """

    flat_epochs: int
    no_aug_epochs: int = 0
    min_ratio: float = 0.5
    warmup: str = "quadratic"

    def __post_init__(self) -> None:
        for name in ("flat_epochs", "no_aug_epochs"):
            v = getattr(self, name)
            if isinstance(v, bool) or int(v) != v or v < 0:
                raise ValueError(f"flat_cosine.{name} must be a whole number of epochs >= 0, got {v!r}")
            object.__setattr__(self, name, int(v))
        if not 0 <= self.min_ratio <= 1:
            raise ValueError(f"flat_cosine.min_ratio must be in [0, 1], got {self.min_ratio}")
        if self.warmup not in ("quadratic", "linear"):
            raise ValueError(f"flat_cosine.warmup must be 'quadratic' or 'linear', got {self.warmup!r}")

    @classmethod
    def of(cls, value: FlatCosine | Mapping[str, Any]) -> FlatCosine:
        if isinstance(value, FlatCosine):
            return value
        if not isinstance(value, Mapping):
            raise TypeError(f"flat_cosine: a mapping of {[f.name for f in fields(cls)]}, got {value!r}")
        unknown = sorted(set(value) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"flat_cosine: unknown field(s) {unknown}; it has {[f.name for f in fields(cls)]}")
        return cls(**value)

    def as_dict(self) -> dict[str, Any]:
        return {"flat_epochs": self.flat_epochs, "no_aug_epochs": self.no_aug_epochs, "min_ratio": self.min_ratio,
                "warmup": self.warmup}

    def factor(self, step: int, steps_per_epoch: int, total_epochs: int, warmup_steps: int) -> float:
        """The rate at optimizer step ``step`` (0-based) over the full rate."""
        total = steps_per_epoch * total_epochs
        flat = steps_per_epoch * self.flat_epochs
        tail = steps_per_epoch * self.no_aug_epochs
        if step <= warmup_steps and warmup_steps > 0:
            t = step / warmup_steps
            return t * t if self.warmup == "quadratic" else t
        if step <= flat:
            return 1.0
        if step >= total - tail:
            return self.min_ratio
        t = (step - flat) / max(1, total - flat - tail)
        return self.min_ratio + (1 - self.min_ratio) * 0.5 * (1 + math.cos(math.pi * t))


def build_flat_cosine(optimizer: torch.optim.Optimizer, schedule: FlatCosine, steps_per_epoch: int, total_epochs: int,
                      warmup_steps: int) -> dict:
    """A Lightning ``lr_scheduler`` dict for :class:`FlatCosine`, stepped every optimizer step."""
    f = lambda step: schedule.factor(step, steps_per_epoch, total_epochs, warmup_steps)  # noqa: E731
    return {"scheduler": torch.optim.lr_scheduler.LambdaLR(optimizer, f), "interval": "step"}
