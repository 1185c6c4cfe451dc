"""The task's set-loss config section: the matcher's costs, the criterion's settings and the loss weights, typed.

A detection config writes what it changes of the model's own set loss
(:func:`visiontf.set_prediction.build_criterion` picks the family's defaults) as one section that reads as the
object graph, the criterion holding its matcher::

    set_loss:
      matcher: {cost_class: 4.0, cost_bbox: 5.0, cost_giou: 2.0}
      criterion: {class_loss: vfl, eos_coef: 0.1}
      weights: {loss_ce: 1.0, loss_bbox: 5.0, loss_giou: 2.0}

Every field left out (None) keeps the family's value. ``weights`` are merged term by term into the family's
(``loss_fgl``, ``loss_mask`` are terms too). ``criterion.options`` passes keywords that only one family's criterion
takes (D-FINE's ``ddf_temperature``, ``union_matching``) through unchanged.

:func:`migrate_shortcuts` reads the task's keywords of before the section (``cost_class``, ``loss_ce``,
``eos_coef``, ... ``matcher_kwargs``, ``criterion_kwargs``) into it, by name, as plain data: it imports and calls
nothing a config or a checkpoint names.
"""
from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["CriterionSettings", "MatcherCosts", "SetLoss", "SHORTCUTS", "migrate_shortcuts"]

#: the task's keywords of before the ``set_loss`` section, in the order of its old signature
SHORTCUTS = ("cost_class", "cost_bbox", "cost_giou", "loss_ce", "loss_bbox", "loss_giou", "eos_coef",
             "matcher_kwargs", "criterion_kwargs")


def _number(where: str, value: Any, low_open: bool = False, high: float | None = None) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise ValueError(f"{where}={value!r}: must be a number")
    if (value <= 0 if low_open else value < 0) or (high is not None and value > high):
        span = f"in (0, {high:g}]" if high is not None else ("> 0" if low_open else ">= 0")
        raise ValueError(f"{where}={value!r}: must be a number {span}")


@dataclass(frozen=True)
class MatcherCosts:
    """:class:`~visiontf.set_prediction.HungarianMatcher`'s settings; None keeps the family's."""

    cost_class: float | None = None
    cost_bbox: float | None = None
    cost_giou: float | None = None
    class_cost: Literal["softmax", "focal"] | None = None
    focal_alpha: float | None = None
    focal_gamma: float | None = None

    def __post_init__(self) -> None:
        for name in ("cost_class", "cost_bbox", "cost_giou", "focal_alpha", "focal_gamma"):
            _number(f"set_loss.matcher.{name}", getattr(self, name))

    def kwargs(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) is not None}


@dataclass(frozen=True)
class CriterionSettings:
    """:class:`~visiontf.set_prediction.SetCriterion`'s settings other than its weights; None keeps the family's.

    ``one_to_many_repeats`` and ``one_to_many_weight``: hybrid matching's k and lambda (the terms of a model built with
    one-to-many queries, RT-DETR's ``decoder.num_one_to_many_queries``).

    ``options``: keywords of one family's criterion alone (D-FINE's and DEIM's ``ddf_temperature``,
    ``union_matching``, ``reg_max``), passed through unchanged; the criterion refuses a keyword it does not take.
    """

    class_loss: Literal["ce", "focal", "vfl", "ia_bce", "mal"] | None = None
    eos_coef: float | None = None
    focal_alpha: float | None = None
    focal_gamma: float | None = None
    one_to_many_repeats: int | None = None
    one_to_many_weight: float | None = None
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _number("set_loss.criterion.eos_coef", self.eos_coef, low_open=True, high=1.0)
        repeats = self.one_to_many_repeats
        if repeats is not None and (isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1):
            raise ValueError(f"set_loss.criterion.one_to_many_repeats={repeats!r}: must be a whole number >= 1 (H-DETR 6)")
        _number("set_loss.criterion.one_to_many_weight", self.one_to_many_weight)
        _number("set_loss.criterion.focal_alpha", self.focal_alpha)
        _number("set_loss.criterion.focal_gamma", self.focal_gamma)
        typed = {f.name for f in dataclasses.fields(self)} - {"options"}
        clash = sorted(set(self.options) & (typed | {"weight_dict", "matcher", "num_classes"}))
        if clash:
            raise ValueError(f"set_loss.criterion.options: {clash} have their own place (set_loss.criterion.<field>, "
                             "set_loss.weights, set_loss.matcher); write them there")

    def kwargs(self) -> dict[str, Any]:
        given = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                 if f.name != "options" and getattr(self, f.name) is not None}
        return {**given, **self.options}


@dataclass(frozen=True)
class SetLoss:
    """What a task changes of its model's set loss (module doc): ``matcher``, ``criterion`` and ``weights``
    (loss term -> weight in the total, merged term by term into the family's)."""

    matcher: MatcherCosts = field(default_factory=MatcherCosts)
    criterion: CriterionSettings = field(default_factory=CriterionSettings)
    weights: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, value in self.weights.items():
            if not isinstance(name, str) or not name.startswith("loss_"):
                raise ValueError(f"set_loss.weights: {name!r} is not a loss term (they are named loss_*: loss_ce, "
                                 "loss_bbox, loss_giou, ...)")
            _number(f"set_loss.weights.{name}", value)

    @classmethod
    def of(cls, value: SetLoss | Mapping[str, Any] | None) -> SetLoss:
        """The section from itself or from a mapping of its fields (a checkpoint's hyper-parameters hold
        mappings); ValueError naming the dotted key for a field the section does not have."""
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        return _build(cls, value, "set_loss")

    def as_dict(self) -> dict[str, Any]:
        """Plain data (the hyper-parameters saved with a checkpoint)."""
        return {"matcher": dataclasses.asdict(self.matcher), "criterion": dataclasses.asdict(self.criterion),
                "weights": dict(self.weights)}

    def is_empty(self) -> bool:
        return self == SetLoss()

    def matcher_kwargs(self) -> dict[str, Any]:
        return self.matcher.kwargs()

    def criterion_kwargs(self) -> dict[str, Any]:
        """The criterion's keywords with ``weight_dict`` (merged term by term by ``build_criterion``)."""
        return {**self.criterion.kwargs(), **({"weight_dict": dict(self.weights)} if self.weights else {})}

    def over(self, base: SetLoss) -> SetLoss:
        """This section's given fields on top of ``base``'s, field by field (weights and options term by term)."""
        def merged(new: Any, old: Any) -> dict[str, Any]:
            out = {f.name: getattr(old, f.name) for f in dataclasses.fields(old)}
            out.update({f.name: getattr(new, f.name) for f in dataclasses.fields(new)
                        if getattr(new, f.name) is not None and f.name != "options"})
            return out

        criterion = merged(self.criterion, base.criterion)
        criterion["options"] = {**base.criterion.options, **self.criterion.options}
        return SetLoss(MatcherCosts(**merged(self.matcher, base.matcher)), CriterionSettings(**criterion),
                       {**base.weights, **self.weights})


def _build(kind: type, value: Any, where: str) -> Any:
    if dataclasses.is_dataclass(value) and isinstance(value, kind):
        return value
    if not isinstance(value, Mapping):
        raise ValueError(f"{where}: expected a mapping of {kind.__name__}'s fields, got {type(value).__name__}")
    names = [f.name for f in dataclasses.fields(kind)]
    unknown = sorted(set(value) - set(names))
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}; {where} ({kind.__name__}) takes {', '.join(names)}")
    nested = {"matcher": MatcherCosts, "criterion": CriterionSettings} if kind is SetLoss else {}
    args = {k: _build(nested[k], v, f"{where}.{k}") if k in nested and v is not None else v for k, v in value.items()}
    if kind is SetLoss and args.get("weights") is None:
        args.pop("weights", None)
    if kind is CriterionSettings and args.get("options") is None:
        args.pop("options", None)
    try:
        return kind(**{k: v for k, v in args.items() if not (k in nested and v is None)})
    except TypeError as e:
        raise ValueError(f"{where}: {e}") from None


_MATCHER_FIELDS = frozenset(f.name for f in dataclasses.fields(MatcherCosts))
_CRITERION_FIELDS = frozenset(f.name for f in dataclasses.fields(CriterionSettings)) - {"options"}


def migrate_shortcuts(old: Mapping[str, Any], given: SetLoss | Mapping[str, Any] | None = None,
                      owner: str = "DetectionTask") -> SetLoss:
    """The ``set_loss`` section with the old keywords among ``old`` (:data:`SHORTCUTS`; None ones are left out)
    read into it by name and put on top of ``given``; one ``FutureWarning`` showing the new spelling when any was
    set. Plain data rewriting: nothing in ``old`` is imported or called."""
    base = SetLoss.of(given)
    old = {k: v for k, v in old.items() if k in SHORTCUTS and v is not None}
    if not old:
        return base
    matcher = {k: old[k] for k in ("cost_class", "cost_bbox", "cost_giou") if k in old}
    criterion: dict[str, Any] = {"eos_coef": old["eos_coef"]} if "eos_coef" in old else {}
    options: dict[str, Any] = {}
    weights = {k: old[k] for k in ("loss_ce", "loss_bbox", "loss_giou") if k in old}
    for key, value in dict(old.get("matcher_kwargs") or {}).items():
        if key not in _MATCHER_FIELDS:
            raise ValueError(f"matcher_kwargs.{key} is not a matcher setting (set_loss.matcher takes "
                             f"{', '.join(sorted(_MATCHER_FIELDS))})")
        matcher[key] = value
    for key, value in dict(old.get("criterion_kwargs") or {}).items():
        if key == "weight_dict":
            weights.update(dict(value or {}))
        elif key in _CRITERION_FIELDS:
            criterion[key] = value
        else:
            options[key] = value
    section = SetLoss.of({"matcher": matcher, "criterion": {**criterion, "options": options}, "weights": weights})
    new = {"matcher": matcher, "criterion": {**criterion, **({"options": options} if options else {})}, "weights": weights}
    spelt = _flow({k: v for k, v in new.items() if v})
    warnings.warn(f"{owner}: {', '.join(sorted(old))} are read into the set_loss section; write "
                  f"set_loss: {spelt} instead: the old spelling will be removed", FutureWarning, stacklevel=3)
    return section.over(base)


def _flow(value: Any) -> str:
    """``value`` in YAML's flow style, as a config writes it."""
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}: {_flow(v)}" for k, v in value.items()) + "}"
    return str(value).lower() if isinstance(value, bool) or value is None else str(value)
