"""A detector's backbone as one typed config section: :class:`BackboneSpec` (``backbone:`` in a config).

    backbone: {name: resnet50, pretrained: true, channels_last: true}
    backbone: {name: "timm:convnext_tiny", kwargs: {drop_path_rate: 0.1}}

It replaces ``backbone: str`` and the loose keywords that came with it (``backbone_pretrained``,
``train_backbone``, ``frozen_bn``, ``freeze_stem``, ``backbone_stages``, ``backbone_kwargs``,
``channels_last``); :data:`FLAT_BACKBONE_KEYWORDS` maps those old names to the fields, by name.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from visiontf.models.backbones.backbone import Backbone
from visiontf.models.backbones.build import build_backbone

__all__ = ["FLAT_BACKBONE_KEYWORDS", "BackboneSpec"]

#: the flat keywords of before the section -> the field of :class:`BackboneSpec` each one is now
FLAT_BACKBONE_KEYWORDS = {"backbone_pretrained": "pretrained", "train_backbone": "train", "channels_last": "channels_last",
                          "frozen_bn": "frozen_bn", "freeze_stem": "freeze_stem", "backbone_stages": "stages",
                          "backbone_kwargs": "kwargs", "dilation": "dilation"}


@dataclass(frozen=True)
class BackboneSpec:
    """Which backbone a detector builds and how (:func:`~visiontf.models.backbones.build.build_backbone`).

    Args:
        name: a registered backbone name (``"resnet50"``, ``"resnet50vd"``, ``"hgnetv2_b4"``, ``"swin_T_224_1k"``,
            a visiontf ViT, ``"simplefpn:<ViT>"``) or ``"timm:<name>"``.
        pretrained: a local ImageNet file, or True for the published weights.
        train: False freezes every backbone parameter.
        frozen_bn: FrozenBatchNorm2d (the papers'); False for a backbone trained from scratch.
        freeze_stem: the stem and first stage stay frozen (the DETR papers').
        channels_last: run the backbone in channels-last memory format.
        stages: the backbone features the detector reads (the backbone's numbering); None: the detector's default.
        dilation: DC5, the last stage dilated instead of strided (bottleneck ResNets; timm CNNs: output stride 16).
        kwargs: the kind's own keywords (``frozen_stages``, timm's ``create_model`` keywords, the pyramid's).
    """

    name: str = "resnet50"
    pretrained: bool | str | Path | None = None
    train: bool = True
    frozen_bn: bool = True
    freeze_stem: bool = True
    channels_last: bool = False
    stages: tuple[int, ...] | None = None
    dilation: bool = False
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise TypeError(f"backbone.name must be a backbone name such as 'resnet50' or 'timm:convnext_tiny', got {self.name!r}")
        if self.stages is not None:
            object.__setattr__(self, "stages", tuple(int(i) for i in self.stages))
        object.__setattr__(self, "kwargs", dict(self.kwargs or {}))

    @classmethod
    def coerce(cls, value: BackboneSpec | Mapping[str, Any] | str | None, base: BackboneSpec | None = None,
               where: str = "backbone") -> BackboneSpec:
        """``value`` as a spec: a name (``base`` with that name), a config's mapping (on top of ``base``), or a spec."""
        base = base or cls()
        if value is None:
            return base
        if isinstance(value, BackboneSpec):
            return value
        if isinstance(value, str):
            return dataclasses.replace(base, name=value)
        if not isinstance(value, Mapping):
            raise TypeError(f"{where}: expected a backbone name, a mapping of BackboneSpec fields or a BackboneSpec, "
                            f"got {type(value).__name__}")
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(value) - set(names))
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {unknown}; a backbone section takes {', '.join(names)}")
        return dataclasses.replace(base, **value)

    def build(self, num_levels: int = 1, min_stride: int = 8, stages: Sequence[int] | None = None) -> Backbone:
        """The :class:`Backbone`: ``stages`` (or this spec's), else the last ``num_levels`` maps of stride >= ``min_stride``."""
        if isinstance(self.pretrained, (str, Path)) and not Path(self.pretrained).is_file():
            # the recipes name the originals' ImageNet files where their authors keep them: say which field to change
            raise FileNotFoundError(
                f"model_kwargs.backbone.pretrained: weights file not found: {self.pretrained}; give the path of the "
                f"{self.name} backbone's ImageNet file, or set model_kwargs: {{backbone: {{pretrained: null}}}} to train "
                "the backbone from scratch")
        return build_backbone(self.name, out_indices=self.stages if stages is None else stages, num_levels=num_levels,
                              min_stride=min_stride, pretrained=self.pretrained, train_backbone=self.train,
                              channels_last=self.channels_last, frozen_bn=self.frozen_bn, freeze_stem=self.freeze_stem,
                              dilation=self.dilation, **self.kwargs)

    def to_dict(self) -> dict[str, Any]:
        """The fields that differ from the defaults, as a config's mapping (plain data)."""
        default = BackboneSpec()
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) != getattr(default, f.name)}
        if "stages" in out:
            out["stages"] = list(out["stages"])
        if "pretrained" in out and isinstance(out["pretrained"], Path):
            out["pretrained"] = str(out["pretrained"])
        return out
