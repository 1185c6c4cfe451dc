"""A task's eval settings, typed, and the ``tools/predict.py`` options of a task (the standard library and visiontf.core only).

:class:`EvalSettings`: one frozen dataclass per task (each adapter's ``settings_type``) carries the
eval preprocessing from the model's ``pretrained_cfg`` through the adapter's preprocessing module to
checkpoints (``preprocess``) and exports (``.labels.json``), and back: whatever reaches it (a data
module's eval transform, a task's inference settings, a Predictor's ``preprocess=``, a saved file) is
checked key by key, and an unknown key is refused by name.

:class:`PredictOption`: an option of ``tools/predict.py`` that one task's adapter declares
(``predict_options``), with the settings key it sets, so the command line holds no task's options.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Literal, TypeVar

from visiontf.core.errors import UserError
from visiontf.core.saved_arguments import NotOfType, as_declared, short_repr, type_name

S = TypeVar("S", bound="EvalSettings")

#: the largest side, in pixels, eval settings read from a file may give (a checkpoint's ``preprocess`` of 10000 x 10000
#: kept a ViT's prediction of one small image busy for many minutes)
MAX_SIDE = 8192


class SettingsError(UserError, ValueError):
    """Eval settings with a key the task does not have, or a value it cannot take."""


def plain(value: Any) -> Any:
    """Lists (a config file's, a JSON file's) as tuples, so settings read back equal the ones saved; arrays and
    tensors (numpy's, torch's) as their numbers."""
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        value = value.tolist()
    return tuple(plain(v) for v in value) if isinstance(value, (list, tuple)) else value


@functools.cache
def _field_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


@dataclass(frozen=True)
class EvalSettings:
    """A task's complete eval settings. Subclasses declare the fields with the task's defaults (the values
    used where neither the model's ``pretrained_cfg`` nor anything given on top sets one).

    Values given on top (:meth:`updated`) are a mapping in which every key present is a value, None
    included (``resize=None``: no resize; ``max_size=None``: no cap); a key left out keeps what is there.
    """

    #: the fields that are sizes in pixels (an int or a tuple of them, None where the field allows it): each side
    #: from 1 to :data:`MAX_SIDE`
    pixel_fields: ClassVar[tuple[str, ...]] = ()

    def __post_init__(self) -> None:
        hints = _field_types(type(self))
        for f in fields(self):
            value = plain(getattr(self, f.name))
            # settings come from files too (a checkpoint's preprocess, an export's labels file): a value of another
            # type is named here, not met as a tensor error when the first image is prepared; the checker of saved
            # arguments reads the declared type (numbers of any library, an integral float as an int)
            try:
                value = as_declared(value, hints.get(f.name, Any))
            except NotOfType:
                raise SettingsError(f"{f.name} is {short_repr(value)}, not {type_name(hints[f.name])}") from None
            if f.name in ("mean", "std") and isinstance(value, tuple):
                # a NaN mean gave every image NaN pixels and no detection, a zero std a division error per image
                if not all(math.isfinite(v) for v in value) or (f.name == "std" and not all(v > 0 for v in value)):
                    raise SettingsError(f"{f.name} is {short_repr(value)}: the normalisation's {f.name} must be finite"
                                        + (" and above 0" if f.name == "std" else "") + " in every channel")
            object.__setattr__(self, f.name, value)

    def check_sizes(self, where: str) -> EvalSettings:
        """These settings, when each size in pixels is 1 to :data:`MAX_SIDE` (for settings read from a file: a run's
        own config or a caller's values may go beyond); otherwise a :class:`SettingsError` naming ``where``."""
        for name in self.pixel_fields:
            value = getattr(self, name)
            if any(side is not None and not 1 <= side <= MAX_SIDE for side in (value if isinstance(value, tuple) else (value,))):
                raise SettingsError(f"{where}: {name} is {short_repr(value)}: each size is 1 to {MAX_SIDE} pixels")
        return self

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @classmethod
    def check_keys(cls, values: Mapping[str, Any], where: str) -> None:
        """Refuse a key these settings do not have, naming it, ``where`` it came from and the keys there are."""
        unknown = sorted(set(values) - set(cls.keys()))
        if unknown:
            raise SettingsError(f"{where}: unknown key(s) {unknown} for {cls.__name__}; it takes {', '.join(cls.keys())}")

    def updated(self: S, values: Mapping[str, Any] | EvalSettings | None, where: str = "eval settings") -> S:
        """These settings with ``values`` on top: a mapping of some keys, or settings of this type (all of them)."""
        if values is None:
            return self
        if isinstance(values, EvalSettings):
            if not isinstance(values, type(self)):
                raise SettingsError(f"{where}: {type(values).__name__} given where {type(self).__name__} is needed")
            return values
        if not isinstance(values, Mapping):
            raise SettingsError(f"{where}: expected a mapping of {type(self).__name__} keys, got {type(values).__name__}")
        self.check_keys(values, where)
        try:
            return dataclasses.replace(self, **values)
        except (TypeError, ValueError) as e:
            raise SettingsError(f"{where}: {e}") from e

    @classmethod
    def from_pretrained(cls: type[S], pretrained: Mapping[str, Any]) -> S:
        """The task's defaults with a model's published settings on top (``pretrained_cfg.to_dict()``: the
        keys this task has; the others are another task's, or where the weights are)."""
        return cls().updated({k: v for k, v in pretrained.items() if k in cls.keys()})

    def to_dict(self) -> dict[str, Any]:
        """Every setting, as checkpoints (``preprocess``) and exports store them."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class PredictOption:
    """A ``tools/predict.py`` option of one task: ``flag VALUE`` sets ``key`` of the adapter's eval settings
    (``section="preprocess"``) or of the model's post-processing options (``"postprocess"``)."""

    flag: str
    key: str
    help: str
    section: Literal["preprocess", "postprocess"] = "preprocess"
    type: Callable[[str], Any] = str
    choices: tuple[Any, ...] | None = None
    metavar: str | None = None

    @property
    def dest(self) -> str:
        """The argparse destination: the flag without dashes, dots as underscores (``postprocess_num_top``)."""
        return self.flag.lstrip("-").replace(".", "_")

    def add_to(self, parser: argparse.ArgumentParser | Any) -> None:
        parser.add_argument(self.flag, dest=self.dest, type=self.type, choices=self.choices, metavar=self.metavar,
                            default=None, help=self.help)


def boolean(value: str) -> bool:
    """``true`` / ``false`` (any case), as the configs spell them."""
    try:
        return {"true": True, "false": False}[value.lower()]
    except KeyError:
        raise argparse.ArgumentTypeError(f"{value!r}: use true or false") from None


def at_least(least: int) -> Callable[[str], int]:
    """An int option type refusing values below ``least``."""

    def parse(value: str) -> int:
        number = int(value)
        if number < least:
            raise argparse.ArgumentTypeError(f"{number}: must be >= {least}")
        return number

    parse.__name__ = "int"
    return parse


__all__ = ["EvalSettings", "PredictOption", "SettingsError", "at_least", "boolean", "plain"]
