"""The architecture settings a DETR-family state dict was trained with, read from its tensors.

Fine-tuning published weights on other classes may change only the class-dependent tensors
(``head_prefixes``); every other tensor must fit the model as built. When it does not, PyTorch's
``size mismatch for transformer.level_embed`` says which tensor but not which setting: these
functions read the settings back (``num_queries`` from the query table, ``num_feature_levels``
from the level embedding, the layer counts from the layer keys) so that
:func:`visiontf.models.load_pretrained` can name them and the value to build the model with.

Each function reads a state dict in visiontf's names (after the family's converter) and returns
only the settings it finds; the loader compares the weights' settings with the model's own
state dict read the same way, so a setting that leaves no trace (a two-stage model's
``num_queries``: proposals, not a table) is never compared.
"""
from __future__ import annotations

import re
from collections.abc import Mapping

from torch import Tensor


def _count_layers(state: Mapping[str, Tensor], prefix: str) -> int | None:
    indices = {int(m.group(1)) for k in state if (m := re.match(re.escape(prefix) + r"(\d+)\.", k))}
    return max(indices) + 1 if indices else None


def _put(settings: dict[str, int], name: str, value: int | None) -> None:
    if value is not None:
        settings[name] = int(value)


def detr_settings(state: Mapping[str, Tensor]) -> dict[str, int]:
    """``num_queries``, ``hidden_dim``, ``enc_layers``, ``dec_layers`` of a DETR state dict."""
    settings: dict[str, int] = {}
    table = state.get("query_embed.weight")
    if table is not None and table.dim() == 2:
        _put(settings, "num_queries", table.shape[0])
        _put(settings, "hidden_dim", table.shape[1])
    _put(settings, "enc_layers", _count_layers(state, "transformer.encoder.layers."))
    _put(settings, "dec_layers", _count_layers(state, "transformer.decoder.layers."))
    return settings


def deformable_detr_settings(state: Mapping[str, Tensor], num_query_groups: int = 1) -> dict[str, int]:
    """``num_feature_levels``, ``hidden_dim``, ``num_queries``, ``enc_layers``, ``dec_layers`` of a
    Deformable DETR / DINO state dict.

    ``num_queries`` comes from the learned query table (``query_embed``, or DINO's content queries
    ``tgt_embed``), which holds ``num_queries * num_query_groups`` rows (Group DETR); a two-stage model
    without mixed query selection has neither, and its ``num_queries`` is not compared.
    """
    settings: dict[str, int] = {}
    levels = state.get("transformer.level_embed")
    if levels is not None and levels.dim() == 2:
        _put(settings, "num_feature_levels", levels.shape[0])
        _put(settings, "hidden_dim", levels.shape[1])
    for name in ("query_embed.weight", "tgt_embed.weight"):
        table = state.get(name)
        if table is not None and table.dim() == 2:
            rows = table.shape[0]
            _put(settings, "num_queries", rows // num_query_groups if rows % num_query_groups == 0 else rows)
            break
    _put(settings, "enc_layers", _count_layers(state, "transformer.encoder.layers."))
    _put(settings, "dec_layers", _count_layers(state, "transformer.decoder.layers."))
    return settings


class DeformableWeightsSettings:
    """Gives :class:`~visiontf.models.deformable_detr.deformable_detr.DeformableDETR` its ``weights_settings`` (read by the loader)."""

    #: every setting weights_settings reads is a field of the arch section (DeformableArchOptions)
    weights_settings_section = "arch"

    def weights_settings(self, state: Mapping[str, Tensor]) -> dict[str, int]:
        """Levels, queries and sizes of weights in this model's names, compared with the model's own when loading."""
        return deformable_detr_settings(state, self.dino_options.num_query_groups)
