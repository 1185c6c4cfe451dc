"""The backbone registry: a backbone kind is one file that registers its builder with :func:`register_backbone`.

    from visiontf.models.backbones.registry import register_backbone

    @register_backbone("mynet", names=("mynet_s", "mynet_m"), examples={"mynet_s": dict(width=8)})
    def mynet_backbone(name, *, out_indices=None, num_levels=1, min_stride=8, pretrained=None, train_backbone=True,
                       freeze_stem=True, frozen_stages=None, frozen_bn=True, channels_last=False, dilation=False,
                       **kwargs) -> Backbone:
        ...

A kind answers exact ``names`` (a collection, or a function returning one when the names live elsewhere, as
visiontf's registered ViTs do) and/or every name starting with its ``prefix`` (``"timm:"``, ``"simplefpn:"``).
Exact names are looked up before prefixes. Every module of :mod:`visiontf.models.backbones` is imported the first
time the registry is read, so a new file registers itself with no list to edit anywhere. ``examples`` are the
kind's smallest settings (backbone name -> its keywords): the backbone x detector matrix test
(``tests/models/backbones/test_backbone_matrix.py``) builds every example in every detector family.
"""
from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["BackboneEntry", "backbone_examples", "find_backbone", "list_backbones", "register_backbone"]

#: the builder of a kind: ``(name, *, out_indices, num_levels, min_stride, pretrained, train_backbone, freeze_stem,
#: frozen_stages, frozen_bn, channels_last, dilation, **kwargs) -> Backbone``
BackboneBuilder = Callable[..., Any]


@dataclass(frozen=True)
class BackboneEntry:
    """One registered kind of backbone: what it is called, which names it answers, its builder and examples."""

    kind: str
    build: BackboneBuilder
    names: Collection[str] | Callable[[], Collection[str]] = ()
    prefix: str | None = None
    examples: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    #: what the kind is, for the unknown-name error and docs/backbones.md
    summary: str = ""

    def exact_names(self) -> Collection[str]:
        return self.names() if callable(self.names) else self.names

    def answers(self, name: str) -> bool:
        return name in self.exact_names() or (self.prefix is not None and name.startswith(self.prefix))


_BACKBONES: dict[str, BackboneEntry] = {}
_DISCOVERED = False


def register_backbone(kind: str, *, names: Collection[str] | Callable[[], Collection[str]] = (), prefix: str | None = None,
                      examples: Mapping[str, Mapping[str, Any]] | None = None,
                      summary: str = "") -> Callable[[BackboneBuilder], BackboneBuilder]:
    """Register the decorated builder as the backbone kind ``kind`` (module doc); returns the builder unchanged."""
    if not names and prefix is None:
        raise ValueError(f"register_backbone({kind!r}): give the names it answers, a prefix, or both")

    def add(build: BackboneBuilder) -> BackboneBuilder:
        old = _BACKBONES.get(kind)
        if old is not None and (old.build.__module__, old.build.__qualname__) != (build.__module__, build.__qualname__):
            raise ValueError(f"backbone kind {kind!r} is registered twice ({old.build.__module__} and {build.__module__}); "
                             "give the new one another name")
        _BACKBONES[kind] = BackboneEntry(kind, build, names, prefix, dict(examples or {}), summary)
        return build

    return add


def _discover() -> None:
    """Import every module of the backbones package once, so that each registers its kinds."""
    global _DISCOVERED
    if _DISCOVERED:
        return
    package = importlib.import_module("visiontf.models.backbones")
    for info in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"{package.__name__}.{info.name}")
    _DISCOVERED = True


def list_backbones() -> list[str]:
    """The registered kinds, sorted."""
    _discover()
    return sorted(_BACKBONES)


def find_backbone(name: str) -> BackboneEntry:
    """The kind that builds ``name``: exact names first, then the longest matching prefix; one-line error otherwise."""
    _discover()
    for entry in _BACKBONES.values():
        if name in entry.exact_names():
            return entry
    prefixed = [e for e in _BACKBONES.values() if e.prefix is not None and name.startswith(e.prefix)]
    if prefixed:
        return max(prefixed, key=lambda e: len(e.prefix or ""))
    kinds = "; ".join(f"{e.kind}: {_spelling(e)}" for e in sorted(_BACKBONES.values(), key=lambda e: e.kind))
    raise ValueError(f"unknown backbone {name!r}: the registered kinds are {kinds} "
                     "(a new kind: register_backbone in a file of visiontf/models/backbones/)")


def _spelling(entry: BackboneEntry) -> str:
    names = sorted(entry.exact_names())
    shown = ", ".join(repr(n) for n in names[:4]) + (", ..." if len(names) > 4 else "")
    prefix = f"'{entry.prefix}<name>'" if entry.prefix else ""
    return " or ".join(s for s in (shown, prefix) if s)


def backbone_examples() -> dict[str, dict[str, Any]]:
    """Every registered kind's examples (backbone name -> smallest keywords), the matrix test's rows."""
    _discover()
    rows: dict[str, dict[str, Any]] = {}
    for kind in sorted(_BACKBONES):
        for name, kwargs in _BACKBONES[kind].examples.items():
            rows[name] = dict(kwargs)
    return rows
