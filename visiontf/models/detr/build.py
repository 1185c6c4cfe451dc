"""DETR from typed sections: the torchvision-style builder of the family.

:class:`~visiontf.models.detr.detr.DETR` takes its parts (a backbone, a position embedding, the input
projection, the transformer), as the original's ``DETR(backbone, transformer, num_classes, ...)``.
:func:`build_detr` makes them from two sections, the config's object graph::

    model_kwargs:
      backbone: {name: resnet50, dilation: true, pretrained: true}   # BackboneSpec (DC5)
      arch: {num_queries: 100, dropout: 0.0}                          # DetrArchOptions

read field by field (:class:`visiontf.models.sections.Sections`); the flat keywords of before the sections
(``hidden_dim=...``, ``backbone_pretrained=...``, ``dilation=...``) still build the same model, with one
``FutureWarning``.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypeVar

from torch import nn

from visiontf.models.backbones.backbone import Backbone
from visiontf.models.backbones.spec import BackboneSpec
from visiontf.models.contract import PretrainedCfg
from visiontf.models.detr.detr_arch_options import DetrArchOptions
from visiontf.models.detr.detr_transformer import DetrTransformer
from visiontf.models.sections import Sections
from visiontf.nn import PositionEmbeddingLearned2d, PositionEmbeddingSine2d

__all__ = ["DETR_SECTIONS", "build_detr"]

#: DETR or a subclass (bound loosely: the model module imports this one)
M = TypeVar("M", bound=nn.Module)

#: the builder's typed sections
DETR_SECTIONS = Sections.with_backbone({"arch": DetrArchOptions}, {"arch": DetrArchOptions()})


def build_detr(
    model_cls: type[M],
    /,
    num_classes: int = 91,
    backbone: BackboneSpec | Mapping[str, Any] | str | Backbone | None = None,
    arch: DetrArchOptions | Mapping[str, Any] | None = None,
    pretrained_cfg: PretrainedCfg | Mapping[str, Any] | None = None,
    **model_kwargs: Any,
) -> M:
    """``model_cls`` (:class:`~visiontf.models.detr.detr.DETR` or a subclass) from its sections.

    Args:
        num_classes: object classes, without "no object".
        backbone: a :class:`~visiontf.models.backbones.spec.BackboneSpec` (or its mapping, or a backbone name;
            ``dilation``: DC5), or an injected :class:`Backbone`. A model class that reads several stages (the
            mask head's FPN: ``backbone_stages``) gets those unless the spec names its own.
        arch: :class:`~visiontf.models.detr.detr_arch_options.DetrArchOptions`.
        pretrained_cfg, model_kwargs: to ``model_cls`` (a subclass's own, e.g. the mask head's). The flat keywords
            of before the sections are read into them by name, with one ``FutureWarning``.

    The parts are made in the order the original makes them (backbone, position embedding, projection,
    transformer; the model then its queries and heads), so a seed gives the same weights.
    """
    S = DETR_SECTIONS
    given, model_kwargs = S.migrate({"backbone": backbone, "arch": arch}, model_kwargs)
    arch = S.section("arch", given["arch"])
    if num_classes < 1:
        raise ValueError(f"num_classes must be >= 1 (object classes, without 'no object'), got {num_classes}")
    if isinstance(given["backbone"], Backbone):
        body = given["backbone"]
    else:
        spec = S.section("backbone", given["backbone"])
        own = dict(spec.kwargs)
        stages = spec.stages if spec.stages is not None else own.pop("out_indices", None)  # old backbone_kwargs spelling
        if stages is None:
            stages = model_cls.backbone_stages  # a mask head's FPN reads the finer stages too
        body = dataclasses.replace(spec, kwargs=own, stages=stages).build()
    if arch.position_embedding in ("sine", "v2"):
        pos: nn.Module = PositionEmbeddingSine2d(arch.hidden_dim // 2, normalize=True)
    else:
        pos = PositionEmbeddingLearned2d(arch.hidden_dim // 2)
    input_proj = nn.Conv2d(body.num_channels, arch.hidden_dim, kernel_size=1)
    transformer = DetrTransformer(d_model=arch.hidden_dim, nhead=arch.nheads, num_encoder_layers=arch.enc_layers,
                                  num_decoder_layers=arch.dec_layers, dim_feedforward=arch.dim_feedforward,
                                  dropout=arch.dropout)
    return model_cls(body, pos, input_proj, transformer, num_classes=num_classes, num_queries=arch.num_queries,
                     aux_loss=arch.aux_loss, pretrained_cfg=pretrained_cfg, **model_kwargs)
