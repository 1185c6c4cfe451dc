"""``create_model(name, features_only=True, out_indices=...)``: a model as a list of feature maps, as timm.

The model is wrapped in timm's own ``FeatureGetterNet`` (what timm's ViTs get from
``timm.create_model(..., features_only=True)``): blocks after the last index are pruned, so are the
classifier and the final norm; ``forward(x)`` returns the maps of ``out_indices`` (NCHW, or NLC
tokens with ``output_fmt="NLC"``); ``feature_info.channels()`` / ``.reduction()`` describe them. The
wrapper's state dict is timm's (``model.`` + the ViT's names), so the weights of a timm
``features_only`` model load into it unchanged; weights given to ``create_model`` load into the
whole model before it is wrapped, as in timm.
"""
from __future__ import annotations

from collections.abc import Sequence

from timm.models._features import FeatureGetterNet
from torch import nn

from visiontf.models.contract import VisionModel
from visiontf.models.vit.timm_api import TimmViTApi, take_indices

#: timm's default for its ViTs (``feature_cfg=dict(out_indices=3)``): the last three blocks
DEFAULT_OUT_INDICES = 3


class ViTFeatures(FeatureGetterNet, VisionModel):
    """timm's feature wrapper, declaring what visiontf's loaders read of a model (``save_model`` /
    ``load_model`` round trips: the config records ``features_only`` and ``out_indices``)."""


def features_only(model: nn.Module, out_indices: int | Sequence[int] | None = None, output_fmt: str = "NCHW",
                  name: str = "") -> nn.Module:
    """``model`` as timm's ``FeatureGetterNet`` over ``out_indices`` (timm's meaning: an int n is the
    last n blocks, negative indices count from the end)."""
    if not isinstance(model, TimmViTApi):
        raise ValueError(f"{name or type(model).__name__} has no features_only form (only the ViTs and DeiTs have); "
                         "for a detector backbone use visiontf.models.backbones.build.build_backbone")
    indices = DEFAULT_OUT_INDICES if out_indices is None else out_indices
    indices = indices if isinstance(indices, int) else [int(i) for i in indices]
    take_indices(len(model.blocks), indices)  # one line naming the valid indices, before timm's assert
    features = ViTFeatures(model, out_indices=indices, output_fmt=output_fmt)
    features.pretrained_cfg = model.pretrained_cfg
    return features
