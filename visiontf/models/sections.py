"""A family's typed config sections: how a builder reads them, merges a config over a variant, and migrates
the flat keywords of before the sections.

A family declares its sections once (:class:`Sections`: keyword -> dataclass, each one's default, and the flat
keywords whose field has another name); its builder then reads every field by name, never by position:

* :meth:`Sections.section`: a section given as its dataclass, a config's mapping (on top of the default), or
  for ``backbone`` a name;
* :meth:`Sections.merge`: a config's sections over a variant's ``DEFAULT_CFGS`` entry, field by field (a
  variant config sets only what differs; another backbone name keeps none of the variant's backbone ``kwargs`` or ``stages``);
* :meth:`Sections.migrate`: the flat keywords of old configs and checkpoints' saved hyper-parameters moved
  into their sections by name, with one ``FutureWarning`` that shows the nested spelling;
* :meth:`Sections.of`: a ``DEFAULT_CFGS`` entry spelt flat in code, as sections (no warning).
"""
from __future__ import annotations

import dataclasses
import difflib
import re
import typing
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from visiontf.core.saved_arguments import NotOfType, as_declared
from visiontf.models.backbones.backbone import Backbone
from visiontf.models.backbones.spec import FLAT_BACKBONE_KEYWORDS, BackboneSpec
from visiontf.models.contract import ModelCfg, build_model

__all__ = ["Sections"]


@dataclass(frozen=True)
class Sections:
    """One family's sections: ``classes`` (keyword -> dataclass), ``defaults`` (keyword -> the value when a config
    leaves the section out) and ``renamed`` (flat keyword -> (section, field) where the names differ; every other
    field of a non-backbone section is its own flat keyword)."""

    classes: Mapping[str, type]
    defaults: Mapping[str, Any]
    renamed: Mapping[str, tuple[str, str]] = field(default_factory=dict)

    @classmethod
    def with_backbone(cls, classes: Mapping[str, type], defaults: Mapping[str, Any],
                      renamed: Mapping[str, tuple[str, str]] | None = None) -> Sections:
        """Sections with a ``backbone`` (:class:`BackboneSpec`) first and its old flat keywords."""
        flat = {k: ("backbone", v) for k, v in FLAT_BACKBONE_KEYWORDS.items()}
        return cls({"backbone": BackboneSpec, **classes}, {"backbone": BackboneSpec(), **defaults}, {**flat, **(renamed or {})})

    def flat_keywords(self) -> dict[str, tuple[str, str]]:
        """Every flat keyword of before the sections -> (section, field): by field name, never by position."""
        names = {f.name: (section, f.name) for section, kind in self.classes.items() if kind is not BackboneSpec
                 for f in dataclasses.fields(kind)}
        return {**names, **self.renamed}

    def nest(self, flat: Mapping[str, Any]) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
        """(the flat keywords among ``flat`` as section mappings, the other keywords as they are)."""
        where = self.flat_keywords()
        nested: dict[str, dict[str, Any]] = {}
        rest: dict[str, Any] = {}
        for key, value in flat.items():
            if key in where:
                section, name = where[key]
                nested.setdefault(section, {})[name] = value
            else:
                rest[key] = value
        return nested, rest

    def of(self, backbone: str | None = None, **flat: Any) -> dict[str, Any]:
        """A variant's settings spelt flat in code, as its sections (no warning): ``DEFAULT_CFGS`` entries."""
        nested, rest = self.nest(flat)  # the rest: the model class's own keywords (num_classes, a mask head's)
        if backbone is not None:
            nested["backbone"] = {"name": backbone, **nested.get("backbone", {})}
        return {**rest, **nested}

    def merge(self, base: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
        """``overrides`` on top of ``base``, section by section and field by field (module doc)."""
        merged = dict(base)
        for key, value in overrides.items():
            old = merged.get(key)
            if key in self.classes and old is not None and not isinstance(value, Backbone) and not isinstance(old, Backbone):
                old_map, new_map = _as_mapping(old), _as_mapping(value)
                if isinstance(old_map, Mapping) and isinstance(new_map, Mapping):
                    if key == "backbone":
                        old_map, new_map = _merge_backbone(old_map, new_map)
                    value = {**old_map, **new_map}
            merged[key] = value
        return merged

    def section(self, name: str, value: Any) -> Any:
        """A section as its dataclass: a mapping read by field name on top of the section's default."""
        kind, default = self.classes[name], self.defaults[name]
        if kind is BackboneSpec:
            return BackboneSpec.coerce(value, default, where=name)
        if value is None:
            return default
        if isinstance(value, kind):
            return value
        if not isinstance(value, Mapping):
            raise TypeError(f"{name}: expected a mapping of {kind.__name__} fields or a {kind.__name__}, got {type(value).__name__}")
        names = [f.name for f in dataclasses.fields(kind)]
        unknown = sorted(set(value) - set(names))
        if unknown:
            raise ValueError(f"{name}: unknown key(s) {unknown}; the {name} section ({kind.__name__}) takes {', '.join(names)}")
        return dataclasses.replace(default, **typed_fields(kind, value, name))

    def migrate(self, given: Mapping[str, Any], flat: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """(``given`` sections with the flat keywords among ``flat`` merged on top, the other keywords); one
        ``FutureWarning`` naming the flat keywords and their nested spelling when there were any."""
        nested, rest = self.nest(flat)
        if not nested:
            return dict(given), rest
        _warn_flat([k for k in flat if k not in rest], nested)
        return self.merge(given, nested), rest

    def create(self, builder: Callable[..., Any], cfg: ModelCfg, **kwargs: Any) -> Any:
        """A registered variant: ``builder`` on its ``DEFAULT_CFGS`` entry with the caller's sections merged on top."""
        merged = self.merge(cfg.kwargs, {k: v for k, v in kwargs.items() if k in self.classes})
        given = {k: v for k, v in kwargs.items() if k not in self.classes}
        try:
            return build_model(builder, dataclasses.replace(cfg, kwargs=merged), **given)
        except TypeError as e:
            # the model class refuses it deep down, naming its own injected parts; the caller writes sections
            refused = re.search(r"unexpected keyword argument '(\w+)'", str(e))
            if refused is None or refused.group(1) not in given:
                raise
            bad = refused.group(1)
            close = difflib.get_close_matches(bad, list(self.classes), n=1, cutoff=0.6)
            hint = f"; did you mean the section {close[0]!r}?" if close else "."
            raise TypeError(f"{bad!r} is not a keyword argument of this model{hint} Its sections: "
                            f"{', '.join(self.classes)}") from e


def typed_fields(kind: type, value: Mapping[str, Any], where: str) -> dict[str, Any]:
    """A section's given fields as their declared types (a count an int, a list of counts a tuple), or one
    ``ValueError`` naming ``where.field``, the value and the type: before, a string where a number belongs failed
    deep in the build (``'<' not supported between 'str' and 'int'``)."""
    hints = typing.get_type_hints(kind)
    typed = {}
    for key, given in value.items():
        try:
            typed[key] = as_declared(given, hints.get(key, Any))
        except NotOfType as e:
            raise ValueError(f"{where}.{key}: {e}") from None
    return typed


def _as_mapping(value: Any) -> Any:
    """A section as a mapping of its fields (a dataclass's fields); a backbone name as ``{name: ...}``."""
    if isinstance(value, str):
        return {"name": value}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    return value


def _merge_backbone(old: Mapping[str, Any], new: Mapping[str, Any]) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    """Another backbone name keeps none of the old backbone's own ``kwargs`` or ``stages`` (feature numbers in the old
    backbone's numbering: a ConvNeXt has no feature 4); the same one merges them."""
    if new.get("name", old.get("name")) != old.get("name"):
        return {k: v for k, v in old.items() if k not in ("kwargs", "stages")}, new
    if isinstance(old.get("kwargs"), Mapping) and isinstance(new.get("kwargs"), Mapping):
        return old, {**new, "kwargs": {**old["kwargs"], **new["kwargs"]}}
    return old, new


def _warn_flat(names: Sequence[str], nested: Mapping[str, Mapping[str, Any]]) -> None:
    spelt = "; ".join(f"{s}: {{{', '.join(f'{k}: {v!r}' for k, v in fields.items())}}}" for s, fields in nested.items())
    warnings.warn(f"flat model keywords ({', '.join(sorted(names))}) are read into their sections; write them nested "
                  f"(model_kwargs: {{{spelt}}}): the flat spelling will be removed", FutureWarning, stacklevel=4)
