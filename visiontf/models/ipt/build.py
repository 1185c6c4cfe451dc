"""IPT from a variant's data: the torchvision-style builder of the family.

:class:`~visiontf.models.ipt.ipt.IPT` takes the original's ``option.py`` settings as a handful of plain typed
keywords (``tasks``, ``n_feats``, ``patch_dim``, ``num_heads``, ``num_layers``, ``tile_size``, ...), so the family
needs no sections: a variant is data (a :class:`~visiontf.models.contract.ModelCfg`) and a registered function
of three lines calling :func:`build_ipt`. A config's ``model_kwargs`` go on top of the variant's, with one
shorthand: ``scale`` names the single task of that scale when ``tasks`` is not given::

    model_name: ipt_tiny
    model_kwargs: {scale: 2, input_skip: bicubic, n_feats: 16, num_layers: 1}
"""
from __future__ import annotations

from typing import Any, TypeVar

from torch import nn

from visiontf.models.contract import ModelCfg, build_model

__all__ = ["build_ipt", "tasks_of_scale"]

#: IPT or a subclass (bound loosely: the model module imports this one)
M = TypeVar("M", bound=nn.Module)


def tasks_of_scale(scale: int) -> tuple[str, ...]:
    """The one task of ``scale``: ``sr_x{scale}``, or for 1 a restoration task named ``"restore"``."""
    if int(scale) < 1:
        raise ValueError(f"scale must be >= 1 (1: restoration at the input size), got {scale}")
    return (f"sr_x{int(scale)}",) if int(scale) > 1 else ("restore",)


def build_ipt(model_cls: type[M], cfg: ModelCfg, /, scale: int | None = None, **kwargs: Any) -> M:
    """``model_cls`` (:class:`~visiontf.models.ipt.ipt.IPT`) with the variant ``cfg``'s keywords and the caller's on top.

    Args:
        scale: shorthand for ``tasks=(f"sr_x{scale}",)`` (1: ``("restore",)``); ignored when ``tasks`` is given.
        kwargs: :class:`~visiontf.models.ipt.ipt.IPT`'s keywords; ``pretrained_cfg`` over the variant's.
    """
    if scale is not None and "tasks" not in kwargs:
        kwargs["tasks"] = tasks_of_scale(scale)
    return build_model(model_cls, cfg, **kwargs)
