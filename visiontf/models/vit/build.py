"""ViT / DeiT from a variant's data: the torchvision-style builder of the family.

:class:`~visiontf.models.vit.vit.VisionTransformer` takes timm's keywords (``embed_dim``, ``depth``,
``num_heads``, ``patch_size``, ``img_size``, ``drop_path_rate``, ...), a handful of plain typed arguments, so
the family needs no sections: a variant is data (a :class:`ViTSize` row, its patch and image size, its
published :class:`~visiontf.models.contract.PretrainedCfg`: :func:`vit_variant`) and a registered function
of three lines calling :func:`build_vit`, timm's style. A config's ``model_kwargs`` are timm's spelling,
given on top of the variant's::

    model_name: vit_tiny_patch16_224
    model_kwargs: {img_size: 64, patch_size: 8, depth: 6, drop_path_rate: 0.1}
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, TypeVar

from torch import nn

from visiontf.models.contract import ModelCfg, PretrainedCfg, build_model

__all__ = ["VIT_SIZES", "ViTSize", "build_vit", "vit_variant"]

#: VisionTransformer or a subclass (bound loosely: the model module imports this one)
M = TypeVar("M", bound=nn.Module)


@dataclass(frozen=True)
class ViTSize:
    """A ViT size (the ViT and DeiT papers' tiny / small / base / large): width, blocks, heads."""

    embed_dim: int
    depth: int
    num_heads: int


#: the sizes of the registered variants
VIT_SIZES: dict[str, ViTSize] = {
    "tiny": ViTSize(embed_dim=192, depth=12, num_heads=3),
    "small": ViTSize(embed_dim=384, depth=12, num_heads=6),
    "base": ViTSize(embed_dim=768, depth=12, num_heads=12),
    "large": ViTSize(embed_dim=1024, depth=24, num_heads=16),
}


def vit_variant(hf_hub_id: str, size: str, patch_size: int, img_size: int, distilled: bool = False, **pretrained: Any) -> ModelCfg:
    """A registered variant as data: its size row read by field name, patch and image size (a distillation token for
    the distilled DeiTs), and its published settings (``hf_hub_id``: timm's weight name; ``pretrained``: the
    :class:`~visiontf.models.contract.PretrainedCfg` fields that differ from the class's)."""
    row = VIT_SIZES[size]
    kwargs: dict[str, Any] = {f.name: getattr(row, f.name) for f in dataclasses.fields(row)}
    kwargs.update(patch_size=patch_size, img_size=img_size)
    if distilled:
        kwargs["distilled"] = True
    return ModelCfg(kwargs, PretrainedCfg(hf_hub_id=hf_hub_id, **pretrained))


def build_vit(model_cls: type[M], cfg: ModelCfg, /, **kwargs: Any) -> M:
    """``model_cls`` (:class:`~visiontf.models.vit.vit.VisionTransformer`) with the variant ``cfg``'s keywords and the
    caller's on top (timm's names, e.g. ``drop_path_rate``, ``num_classes``); ``pretrained_cfg`` over the variant's."""
    return build_model(model_cls, cfg, **kwargs)
