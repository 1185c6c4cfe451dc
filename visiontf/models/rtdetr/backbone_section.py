"""The real-time DETRs' backbone section: one :class:`~visiontf.models.backbones.spec.BackboneSpec`, as the DETR line's.

RT-DETR, D-FINE and DEIM take ``backbone:`` as every other detector does, a registered backbone name and its
settings::

    backbone: {name: resnet18vd, frozen_bn: false, freeze_stem: false}          # RT-DETR R18-vd
    backbone: {name: hgnetv2_b0, frozen_bn: false, freeze_stem: false, stages: [3, 4]}   # D-FINE N
    backbone: {name: resnet50vd, kwargs: {frozen_stages: 0}}                      # R50-vd: the stem frozen

Before, each family had its own section (``ResNetVdOptions``: ``{depth: 18, freeze_at: -1, ...}``; ``HGNetV2Options``:
``{arch: B0, use_lab: true, ...}``). A section in that spelling (old configs, checkpoints' saved hyper-parameters) is
still read: on top of the variant's backbone put in those terms, then turned into the spec that builds the same
network, with one ``FutureWarning`` that shows the new spelling (:class:`FormerBackbone`).
"""
from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from visiontf.models.backbones.backbone import Backbone
from visiontf.models.backbones.spec import BackboneSpec
from visiontf.models.rtdetr.rtdetr_options import section
from visiontf.models.sections import Sections

__all__ = ["FormerBackbone", "backbone_section"]

#: how a config's backbone merges over a variant's: field by field; another name keeps none of the variant's kwargs
#: or stages
_MERGE = Sections({"backbone": BackboneSpec}, {"backbone": BackboneSpec()})


@dataclass(frozen=True)
class FormerBackbone:
    """A family's backbone section of before :class:`BackboneSpec`: its dataclass, the keys that only it has (how a
    config's mapping is told apart), and the conversions each way, field by field."""

    options: type
    only: frozenset[str]
    to_spec: Callable[[Any], BackboneSpec]
    from_spec: Callable[[BackboneSpec], Any]
    #: keys both spellings have whose value tells them apart (HGNetv2's ``stages`` rows against the spec's stage numbers)
    is_former_value: Callable[[str, Any], bool] = lambda key, value: False

    def describes(self, value: Any) -> bool:
        """Whether ``value`` is in the former spelling (its dataclass, or a mapping with one of its own keys)."""
        if isinstance(value, self.options):
            return True
        return isinstance(value, Mapping) and any(k in self.only or self.is_former_value(k, v) for k, v in value.items())


def backbone_section(value: Any, base: Any, default: BackboneSpec, former: FormerBackbone) -> BackboneSpec | Backbone:
    """The backbone a config asks for: a built :class:`Backbone` as it is; a :class:`BackboneSpec`, its mapping or a name
    over the variant's ``base`` (over ``default``); the former spelling converted, with one ``FutureWarning``."""
    if isinstance(value, Backbone):
        return value
    if former.describes(base):
        base = former.to_spec(section(former.options, base, where="backbone"))
    base_spec = _over(default, base)
    if former.describes(value):
        spec = former.to_spec(section(former.options, value, former.from_spec(base_spec), "backbone"))
        given = value if isinstance(value, Mapping) else {"": type(value).__name__}
        warnings.warn(f"backbone: the {former.options.__name__} spelling ({', '.join(sorted(given))}) is read as a BackboneSpec; "
                      f"write it as backbone: {_spelt(spec)} (the former spelling will be removed)", FutureWarning, stacklevel=3)
        return spec
    return _over(base_spec, value)


def _over(spec: BackboneSpec, value: Any) -> BackboneSpec:
    """``value`` (a spec, its mapping or a name) on top of ``spec`` (:meth:`~visiontf.models.sections.Sections.merge`)."""
    if value is None:
        return spec
    if isinstance(value, BackboneSpec):
        return value
    return _MERGE.section("backbone", _MERGE.merge({"backbone": spec}, {"backbone": value})["backbone"])


def _spelt(spec: BackboneSpec) -> str:
    """A spec as a config's flow mapping."""
    def show(v: Any) -> str:
        if isinstance(v, Mapping):
            return "{" + ", ".join(f"{k}: {show(x)}" for k, x in v.items()) + "}"
        if isinstance(v, Sequence) and not isinstance(v, str):
            return "[" + ", ".join(show(x) for x in v) + "]"
        return {True: "true", False: "false", None: "null"}.get(v, str(v)) if isinstance(v, (bool, type(None))) else str(v)
    return show({"name": spec.name, **{k: v for k, v in spec.to_dict().items() if k != "name"}})
