"""Checks of the training state a resumed checkpoint hands to the optimizers, schedulers, loops and precision.

Lightning restores these with each object's own ``load_state_dict``, which trusts the file. Torch's fused AdamW then
steps over a state tensor smaller than its parameter and writes past the end of it: heap corruption, and the process
aborts. Other values of the wrong type end in a bare ``TypeError`` or ``KeyError`` at the first step, and a
scheduler's ``load_state_dict`` copies every key of the file onto the scheduler object, so a key it does not have
becomes a new attribute. A checkpoint is data: each of these states is compared, before it is restored, with the
state the run itself built (the live optimizer, scheduler and loop), and anything that is not the same kind of value
is refused with the file and the field.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from visiontf.core.errors import UserError
from visiontf.core.saved_arguments import short_repr
from visiontf.io.weights import short_of_memory

#: an optimizer group's flags that choose the kernel a step runs: the run's own settings, never the file's
KERNEL_FLAGS = ("fused", "capturable", "differentiable")

_SCALARS = (type(None), bool, int, float, str)

#: what every refusal suggests
_FIX = ("resume from a checkpoint this config wrote (tools/train.py), or start from its weights alone with "
        "--model.init_args.pretrained")


class TrainingStateError(UserError, ValueError):
    """A resumed checkpoint's optimizer, scheduler, loop or precision state does not fit the run."""


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_plain(value: Any, depth: int = 0) -> bool:
    """Scalars, or lists and mappings of them (a few levels deep): values nothing reads as code or as a tensor."""
    if isinstance(value, _SCALARS):
        return True
    if depth >= 4:
        return False
    if isinstance(value, (list, tuple)):
        return all(_is_plain(v, depth + 1) for v in value)
    if isinstance(value, Mapping):
        return all(isinstance(k, (str, int)) and _is_plain(v, depth + 1) for k, v in value.items())
    return False


def _dtype_kind(dtype: torch.dtype) -> str:
    if dtype == torch.bool:
        return "bool"
    if dtype.is_complex:
        return "complex"
    return "floating" if dtype.is_floating_point else "integer"


def describe_value(value: Any) -> str:
    """What ``value`` is, for a message: a tensor by its kind and shape, a container by its kind and length."""
    if isinstance(value, torch.Tensor):
        kind = _dtype_kind(value.dtype)
        return f"{'an' if kind == 'integer' else 'a'} {kind} tensor of shape {tuple(value.shape)}"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, (list, tuple)):
        return f"a list of {len(value)}"
    if value is None or isinstance(value, bool):
        return "None or true/false"
    if _is_number(value):
        return "a number"
    return f"a {type(value).__name__}"


def unlike(saved: Any, live: Any, field: str, extra_keys: str = "plain", missing_keys: bool = True
           ) -> tuple[str, Any, str] | None:
    """The first place where ``saved`` is not the same kind of value as ``live``: (field, saved value, what it should
    be), or None.

    Tensors: the same shape and kind of dtype, floating ones finite; numbers: numbers, not NaN; None and booleans:
    None or a boolean; strings: strings; lists: the same length, item by item; mappings: each key of ``live`` present
    (unless ``missing_keys`` is False) and alike, and a key only ``saved`` has is refused (``extra_keys="refuse"``) or
    must be plain data (``"plain"``: scalars, lists and mappings of them).
    """
    if isinstance(live, torch.Tensor):
        if (not isinstance(saved, torch.Tensor) or saved.shape != live.shape
                or _dtype_kind(saved.dtype) != _dtype_kind(live.dtype)):
            return field, saved, describe_value(live)
        if saved.dtype.is_floating_point and not bool(torch.isfinite(saved).all()):
            return field, saved, "finite values"
        return None
    if live is None or isinstance(live, bool):
        return None if saved is None or isinstance(saved, bool) else (field, saved, describe_value(live))
    if _is_number(live):
        # infinity is a value some states start from (ReduceLROnPlateau's best); NaN compares with nothing
        if not _is_number(saved) or math.isnan(saved):
            return field, saved, "a number"
        return None
    if isinstance(live, str):
        return None if isinstance(saved, str) else (field, saved, "a string")
    if isinstance(live, (list, tuple)):
        if not isinstance(saved, (list, tuple)) or len(saved) != len(live):
            return field, saved, describe_value(live)
        for i, (s, v) in enumerate(zip(saved, live)):
            found = unlike(s, v, f"{field}[{i}]", extra_keys, missing_keys)
            if found:
                return found
        return None
    if isinstance(live, Mapping):
        if not isinstance(saved, Mapping):
            return field, saved, "a mapping"
        for key, value in live.items():
            if key not in saved:
                if missing_keys:
                    return f"{field}[{short_repr(key)}]", None, f"present ({describe_value(value)})"
                continue
            found = unlike(saved[key], value, f"{field}[{short_repr(key)}]", extra_keys, missing_keys)
            if found:
                return found
        for key in saved:
            if key in live:
                continue
            if extra_keys == "refuse":
                return f"{field}[{short_repr(key)}]", saved[key], "absent (this run's state has no such key)"
            if not _is_plain(saved[key]):
                return f"{field}[{short_repr(key)}]", saved[key], "plain data (numbers, strings, lists)"
        return None
    # a live value of another type (a scheduler's callable object): the file may not replace it
    return None if saved is live else (field, saved, f"absent (this run holds a {type(live).__name__} there)")


def _refuse(where: str | Path, found: tuple[str, Any, str], fix: str) -> TrainingStateError:
    field, value, expected = found
    return TrainingStateError(f"{where}: {field} is {shown(value)}, where this run needs {expected}; {fix}")


def shown(value: Any) -> str:
    """A saved value in a message: a tensor described, anything else by its short repr."""
    return describe_value(value) if isinstance(value, torch.Tensor) else short_repr(value)


def _check_param_state(saved: Any, param: torch.Tensor, field: str) -> tuple[str, Any, str] | None:
    """A parameter's saved optimizer state: tensors of the parameter's shape (``step`` a single number), plain
    numbers and flags."""
    if not isinstance(saved, Mapping):
        return field, saved, "a mapping of state names to tensors"
    for key, value in saved.items():
        at = f"{field}[{short_repr(key)}]"
        if not isinstance(key, str):
            return at, key, "a state name (a string)"
        if isinstance(value, torch.Tensor):
            kind = _dtype_kind(value.dtype)
            if key == "step":
                if value.numel() != 1 or kind not in ("floating", "integer"):
                    return at, value, "a single number"
                continue
            if value.shape != param.shape or kind not in ("floating", "complex"):
                return at, value, f"a floating tensor of its parameter's shape {tuple(param.shape)}"
            held = short_of_memory(value)
            if held is not None:
                # a zero-stride view: the optimizer's step writes every element as if each had its own memory
                return at, value, f"a tensor with memory for each of its values (it holds {held} bytes)"
            if not bool(torch.isfinite(value).all()):
                return at, value, "finite values"
        elif value is not None and not isinstance(value, bool) and not (_is_number(value) and math.isfinite(value)):
            return at, value, "a tensor or a finite number"
    return None


def check_optimizer_state(saved: Any, optimizer: torch.optim.Optimizer, where: str | Path, field: str,
                          own_layout: bool = True) -> None:
    """Refuse a saved optimizer state (``optimizer.state_dict()``'s layout) that does not fit ``optimizer``.

    Its groups must be as many and as large as the optimizer's, with the same kind of values (a kernel flag, fused,
    capturable or differentiable, equal to the run's), and each parameter's state tensors of that parameter's shape.
    ``own_layout=False``: the file holds the state in a strategy's own layout (FSDP's whole, unflattened parameters),
    which the strategy converts when it loads it; only the kinds of values are checked.

    Raises:
        TrainingStateError: naming the file and the field.
    """
    if not isinstance(saved, Mapping) or not isinstance(saved.get("param_groups"), list):
        raise _refuse(where, (field, saved, "an optimizer state (a mapping with 'state' and 'param_groups')"), _FIX)
    groups, live_groups = saved["param_groups"], optimizer.param_groups
    if not own_layout:
        _check_values_only(saved, groups, live_groups, where, field)
        return
    if len(groups) != len(live_groups):
        raise _refuse(where, (f"{field}['param_groups']", groups, f"a list of {len(live_groups)} groups (this run's "
                              "optimizer groups: a checkpoint of another model or param_groups config)"), _FIX)
    params: dict[Any, torch.Tensor] = {}
    for g, (group, live) in enumerate(zip(groups, live_groups)):
        at = f"{field}['param_groups'][{g}]"
        if not isinstance(group, Mapping):
            raise _refuse(where, (at, group, "a mapping"), _FIX)
        ids = group.get("params")
        if (not isinstance(ids, list) or len(ids) != len(live["params"])
                or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids)):
            raise _refuse(where, (f"{at}['params']", ids, f"a list of {len(live['params'])} parameter indices"), _FIX)
        for i, p in zip(ids, live["params"]):
            if i in params:
                raise _refuse(where, (f"{at}['params']", ids, "indices that each name one parameter"), _FIX)
            params[i] = p
        hyper = {k: v for k, v in live.items() if k != "params"}
        found = unlike({k: v for k, v in group.items() if k != "params"}, hyper, at, missing_keys=False)
        if found:
            raise _refuse(where, found, _FIX)
        for flag in KERNEL_FLAGS:
            if flag in group and bool(group[flag]) != bool(live.get(flag)):
                raise _refuse(where, (f"{at}[{flag!r}]", group[flag], f"{live.get(flag)!r}, this run's (the run "
                                      "chooses the optimizer's kernel, not the file)"), _FIX)
    state = saved.get("state", {})
    if not isinstance(state, Mapping):
        raise _refuse(where, (f"{field}['state']", state, "a mapping of parameter indices to states"), _FIX)
    for i, param_state in state.items():
        if i not in params:
            raise _refuse(where, (f"{field}['state'][{short_repr(i)}]", param_state,
                                  "absent (no parameter of its param_groups has that index)"), _FIX)
        found = _check_param_state(param_state, params[i], f"{field}['state'][{i}]")
        if found:
            raise _refuse(where, found, _FIX)


def _check_scheduler_state(saved: Any, scheduler: Any, field: str) -> tuple[str, Any, str] | None:
    """A scheduler's saved state against its live one. Torch's schedulers copy every key of the file onto themselves
    (``__dict__.update``), and ``LambdaLR`` each ``lr_lambdas`` mapping onto its function object: a key the live state
    lacks may only be a plain scalar that names no attribute of the scheduler (a key of another torch version), and a
    function the run holds (None in its state) takes nothing from the file."""
    live = scheduler.state_dict()
    if not isinstance(saved, Mapping):
        return field, saved, "a scheduler state (a mapping)"
    for key, value in saved.items():
        at = f"{field}[{short_repr(key)}]"
        if key in live:
            continue
        if not isinstance(key, str) or not isinstance(value, _SCALARS) or hasattr(scheduler, key):
            return at, value, f"absent (this run's {type(scheduler).__name__} has no such state)"
    lambdas, live_lambdas = saved.get("lr_lambdas"), live.get("lr_lambdas")
    if isinstance(live_lambdas, list) and isinstance(lambdas, list) and len(lambdas) == len(live_lambdas):
        for i, (s, v) in enumerate(zip(lambdas, live_lambdas)):
            if v is None and s is not None:
                return f"{field}['lr_lambdas'][{i}]", s, "None (the run's schedule is a function it builds itself)"
    return unlike({k: v for k, v in saved.items() if k in live}, live, field, extra_keys="refuse", missing_keys=False)


def _check_values_only(saved: Mapping, groups: list, live_groups: list, where: str | Path, field: str) -> None:
    """An optimizer state in a strategy's own layout: its groups' values and its states' kinds of values only."""
    for g, group in enumerate(groups):
        at = f"{field}['param_groups'][{g}]"
        if not isinstance(group, Mapping):
            raise _refuse(where, (at, group, "a mapping"), _FIX)
        if g < len(live_groups):
            live = {k: v for k, v in live_groups[g].items() if k != "params"}
            found = unlike({k: v for k, v in group.items() if k != "params"}, live, at, missing_keys=False)
            if found:
                raise _refuse(where, found, _FIX)
    state = saved.get("state", {})
    if not isinstance(state, Mapping):
        raise _refuse(where, (f"{field}['state']", state, "a mapping of parameters to states"), _FIX)
    for key, param_state in state.items():
        if not isinstance(param_state, Mapping):
            raise _refuse(where, (f"{field}['state'][{short_repr(key)}]", param_state, "a mapping"), _FIX)
        for name, value in param_state.items():
            at = f"{field}['state'][{short_repr(key)}][{short_repr(name)}]"
            if isinstance(value, torch.Tensor):
                if _dtype_kind(value.dtype) not in ("floating", "integer") or (
                        value.dtype.is_floating_point and not bool(torch.isfinite(value).all())):
                    raise _refuse(where, (at, value, "a tensor of finite numbers"), _FIX)
            elif value is not None and not isinstance(value, bool) and not (_is_number(value) and math.isfinite(value)):
                raise _refuse(where, (at, value, "a tensor or a finite number"), _FIX)


def _one_each(checkpoint: Mapping, key: str, live: Sequence[Any], where: str | Path) -> list:
    """The file's list of states under ``key``, one for each of the run's objects (none when the file has no key)."""
    saved = checkpoint.get(key)
    if saved is None:
        return []
    if not isinstance(saved, list) or len(saved) != len(live):
        raise _refuse(where, (key, saved, f"a list of {len(live)} states (one for each of this run's "
                              f"{'optimizers' if key == 'optimizer_states' else 'schedulers'})"), _FIX)
    return saved


def check_restored_state(checkpoint: Mapping, where: str | Path, optimizers: Sequence[torch.optim.Optimizer],
                         schedulers: Sequence[Any], loops: Mapping[str, Any], precision: tuple[str, Any] | None,
                         own_layout: bool = True) -> None:
    """Refuse a resumed checkpoint whose optimizer, scheduler, loop or precision states do not fit the run's own.

    Args:
        checkpoint: the file's content (Lightning's layout).
        where: the file, for the message.
        optimizers: the run's optimizers, in order; ``schedulers``: its schedulers, in order.
        loops: the run's loops' states by the checkpoint's key (``{"fit_loop": trainer.fit_loop.state_dict()}``).
        precision: the precision plugin's key in the file and its live state, or None.
        own_layout: whether the optimizer states are in the optimizers' own layout (see :func:`check_optimizer_state`).

    Raises:
        TrainingStateError: naming the file and the field.
    """
    for i, (state, optimizer) in enumerate(zip(_one_each(checkpoint, "optimizer_states", optimizers, where), optimizers)):
        check_optimizer_state(state, optimizer, where, f"optimizer_states[{i}]", own_layout)
    for i, (state, scheduler) in enumerate(zip(_one_each(checkpoint, "lr_schedulers", schedulers, where), schedulers)):
        found = _check_scheduler_state(state, scheduler, f"lr_schedulers[{i}]")
        if found:
            raise _refuse(where, found, _FIX)
    saved = checkpoint.get("loops")
    if saved is not None:
        if not isinstance(saved, Mapping):
            raise _refuse(where, ("loops", saved, "a mapping of loop names to states"), _FIX)
        for name, live in loops.items():
            found = unlike(saved.get(name), live, f"loops[{name!r}]")
            if found:
                raise _refuse(where, found, _FIX)
    if precision is not None and precision[0] in checkpoint:
        found = unlike(checkpoint[precision[0]], precision[1], repr(precision[0]))
        if found:
            raise _refuse(where, found, _FIX)


__all__ = ["KERNEL_FLAGS", "TrainingStateError", "check_optimizer_state", "check_restored_state", "describe_value",
           "shown", "unlike"]
