"""VQGAN and its GPT from a variant's data: the torchvision-style builders of the family.

:class:`~visiontf.models.vqgan.vqgan.VQModel` takes taming's ``ddconfig`` fields and the code book's
(``n_embed``, ``embed_dim``, ``ch``, ``ch_mult``, ...) as a handful of plain typed keywords: a variant is data
(a :class:`~visiontf.models.contract.ModelCfg`) and a registered function of three lines calling
:func:`build_vqgan`. The second stage, :class:`~visiontf.models.vqgan.gpt.Net2NetTransformer`, takes its first
stage as a built tokenizer; :func:`build_vqgan_transformer` builds that from a registered name (and its
keywords) first, then the GPT, in the order taming does::

    model_name: vqgan_transformer_tiny
    model_kwargs: {first_stage: vqgan_tiny, first_stage_kwargs: {ch_mult: [1, 2, 2]}, n_layer: 4, n_classes: 10}
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from torch import nn

from visiontf.models._registry import get_entry
from visiontf.models.contract import ModelCfg, Tokenizer, build_model

__all__ = ["build_first_stage", "build_vqgan", "build_vqgan_transformer"]

#: the model class (bound loosely: the model modules import this one)
M = TypeVar("M", bound=nn.Module)


def build_vqgan(model_cls: type[M], cfg: ModelCfg, /, **kwargs: Any) -> M:
    """``model_cls`` (:class:`~visiontf.models.vqgan.vqgan.VQModel`) with the variant ``cfg``'s keywords and the
    caller's on top (taming's names); ``pretrained_cfg`` over the variant's."""
    return build_model(model_cls, cfg, **kwargs)


def build_first_stage(first_stage: str | nn.Module, first_stage_kwargs: Mapping[str, Any] | None = None) -> nn.Module:
    """A transformer's first stage: a registered tokenizer's name (``"vqgan_tiny"``) built with ``first_stage_kwargs``
    on top of its variant's, or a built one (then ``first_stage_kwargs`` must be empty)."""
    if not isinstance(first_stage, str):
        if first_stage_kwargs:
            raise ValueError("first_stage_kwargs go with a first stage given by name; a built first stage takes none")
        return first_stage
    model = get_entry(first_stage).fn(**dict(first_stage_kwargs or {}))
    if not isinstance(model, Tokenizer):
        raise ValueError(f"first_stage={first_stage!r} is not a registered tokenizer (a VQGAN such as 'vqgan_tiny')")
    return model


def build_vqgan_transformer(model_cls: type[M], cfg: ModelCfg, /, **kwargs: Any) -> M:
    """``model_cls`` (:class:`~visiontf.models.vqgan.gpt.Net2NetTransformer`) from the variant ``cfg``'s keywords and
    the caller's on top: ``first_stage`` (a registered name or a built tokenizer) and ``first_stage_kwargs`` make the
    first stage, built before the GPT (the seed's draws in taming's order); the rest are the model's
    (``n_classes``, ``sos_token``, ``pkeep``) and :class:`~visiontf.models.vqgan.gpt.GPT`'s (``n_layer``, ...)."""
    merged = {**cfg.kwargs, **kwargs}
    first = build_first_stage(merged.pop("first_stage", "vqgan_tiny"), merged.pop("first_stage_kwargs", None))
    return model_cls(first_stage=first, **merged)
