"""Checking config values where they are read: the data modules' and tasks' ``__init__``.

A bad value (``batch_size: 0``, ``lr: -1``, ``num_workers: -2``) otherwise fails deep inside torch
("batch_size should be a positive integer value", an optimizer's "Invalid learning rate") without
naming the config key. LightningCLI instantiates the classes as it reads the config, so a
:class:`ConfigError` raised here names the key (``data.init_args.batch_size``) before anything runs.

    check_config("CocoDataModule", "data", batch_size=(batch_size, positive_int),
                 num_workers=(num_workers, optional(non_negative_int)))
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from visiontf.core.errors import UserError

#: a rule: None when the value is fine, else what it must be ("an integer >= 1")
Rule = Callable[[Any], "str | None"]


class ConfigError(UserError, ValueError):
    """A config value is out of its range; the message names the key, the value and the rule."""


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def positive_int(v: Any) -> str | None:
    return None if _is_int(v) and v >= 1 else "an integer >= 1"


def non_negative_int(v: Any) -> str | None:
    return None if _is_int(v) and v >= 0 else "an integer >= 0"


def positive(v: Any) -> str | None:
    return None if _is_number(v) and v > 0 else "a finite number > 0"


def non_negative(v: Any) -> str | None:
    return None if _is_number(v) and v >= 0 else "a finite number >= 0"


def fraction(v: Any) -> str | None:
    return None if _is_number(v) and 0 <= v <= 1 else "a number in [0, 1]"


def unit_interval_open_right(v: Any) -> str | None:
    return None if _is_number(v) and 0 <= v < 1 else "a number in [0, 1)"


def unit_interval_open_left(v: Any) -> str | None:
    return None if _is_number(v) and 0 < v <= 1 else "a number in (0, 1]"


def optional(rule: Rule) -> Rule:
    """``rule``, or None."""
    return lambda v: None if v is None else (None if rule(v) is None else f"{rule(v)} or null")


def one_of(*choices: Any) -> Rule:
    return lambda v: None if v in choices else f"one of {list(choices)}"


def each(rule: Rule, min_len: int = 1) -> Rule:
    """A list (or tuple) of at least ``min_len`` items, each passing ``rule``."""

    def check(v: Any) -> str | None:
        if not isinstance(v, (list, tuple)) or len(v) < min_len or any(rule(x) is not None for x in v):
            return f"a list of {min_len}+ items, each {rule(None) or 'valid'}"
        return None

    return check


def check_config(owner: str, section: str, **values: tuple[Any, Rule]) -> None:
    """Raise one :class:`ConfigError` listing every ``key=(value, rule)`` whose value breaks its rule.

    ``section`` is where the keys live in a LightningCLI config (``"data"``, ``"model"``), so the
    message names them as they are written: ``data.init_args.batch_size=0: must be an integer >= 1``.
    """
    problems = []
    for key, (value, rule) in values.items():
        broken = rule(value)
        if broken is not None:
            problems.append(f"{section}.init_args.{key}={value!r}: must be {broken}")
    if problems:
        raise ConfigError(f"{owner}: " + "; ".join(problems) + " (fix the config or the command-line override)")


__all__ = ["ConfigError", "check_config", "each", "fraction", "non_negative", "non_negative_int", "one_of", "optional",
           "positive", "positive_int", "unit_interval_open_left", "unit_interval_open_right"]
