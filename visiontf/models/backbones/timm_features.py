"""timm models as detection backbones: ``timm.create_model(name, features_only=True, ...)`` with what a
detector needs on top (used by :class:`~visiontf.models.backbones.detr_backbone.DetrBackbone`).

* Any input size: ViTs are built with ``dynamic_img_size`` and ``dynamic_img_pad`` (position table
  resampled per input, image padded to a patch multiple), Swin with ``strict_img_size=False`` (its
  windows padded by timm). Images are zero-padded bottom/right to the smallest multiple the model
  needs (:func:`size_multiple`, found by running it on the meta device: Swin's patch, HRNet's 32,
  MaxViT's 256); the padded pixels are part of the padding mask.
* Channels-last (NHWC) maps (Swin: the wrapper's ``output_fmt``) are returned as NCHW.
* The features are chosen by index of the model's own ``feature_info`` (checked, one-line error
  listing each index's stride), or by stride (:func:`~visiontf.models.backbones.backbone.select_levels`).
* Pretrained weights load through timm's own code: a file is read with visiontf's safe loader and
  handed to timm as ``pretrained_cfg_overlay=dict(state_dict=...)`` (timm's key filter, position
  resampling and classifier handling apply); ``True`` is timm's hub download.
"""
from __future__ import annotations

import contextlib
import difflib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from visiontf.models.backbones.backbone import check_indices, select_levels

#: what lets each kind of timm model take any image size, tried in this order (the first that the
#: model's constructor accepts is kept): ViT-like, Swin-like, fixed-size-free CNNs
_SIZE_KWARGS: tuple[dict[str, Any], ...] = (
    {"dynamic_img_size": True, "dynamic_img_pad": True},
    {"strict_img_size": False},
    {},
)


def _create(name: str, **kwargs: Any) -> nn.Module:
    import timm

    return timm.create_model(name, features_only=True, **kwargs)


def _create_small(name: str, kwargs: dict[str, Any]) -> nn.Module:
    """The features model without weights: on the meta device, or on the CPU for a model whose
    constructor reads tensor values (which meta tensors do not have)."""
    try:
        with torch.device("meta"):
            return _create(name, pretrained=False, **kwargs)
    except (NotImplementedError, RuntimeError) as e:
        if "meta" not in str(e).lower():
            raise
    return _create(name, pretrained=False, **kwargs)


def _probe(name: str, kwargs: dict[str, Any]) -> tuple[nn.Module, dict[str, Any]]:
    """The features model on the meta device (cheap) and the size keywords its constructor took."""
    import timm

    if not timm.is_model(name):
        close = difflib.get_close_matches(name, timm.list_models(), n=5, cutoff=0.6)
        hint = f" Did you mean: {', '.join('timm:' + c for c in close)}?" if close else ""
        raise ValueError(f"unknown timm model {name!r}.{hint} timm.list_models('pattern*') lists the names")
    last: Exception | None = None
    for size_kwargs in _SIZE_KWARGS:
        try:
            # the last feature only: enough to read the whole feature_info, and valid at any depth
            return _create_small(name, dict(kwargs, **size_kwargs, out_indices=(-1,))), size_kwargs
        except TypeError as e:  # the constructor does not take these keywords: try the next kind
            if "unexpected keyword argument" not in str(e):
                raise
            last = e
        except RuntimeError as e:
            if "features_only not implemented" in str(e):
                raise ValueError(f"timm model {name!r} has no features_only form ({e}); pick a CNN, Swin or ViT") from e
            raise
    raise ValueError(f"timm model {name!r} does not take the keywords given: {last}")


def timm_features(
    name: str, out_indices: Sequence[int] | None, levels: tuple[int, int], pretrained: bool | str | Path | None = None,
    dilation: bool = False, **kwargs: Any,
) -> tuple[nn.Module, int]:
    """``timm.create_model(name, features_only=True, ...)`` for a detector, and the multiple the image
    must be padded to (1: none). ``levels``: (num_levels, min_stride) of the default choice."""
    if dilation:
        kwargs["output_stride"] = 16
    meta, size_kwargs = _probe(name, kwargs)
    info = meta.feature_info.info  # every feature of the model, not only the default selection
    reductions = [int(i["reduction"]) for i in info]
    indices = select_levels(reductions, *levels) if out_indices is None else check_indices(out_indices, reductions, f"timm:{name}")
    kwargs = {**size_kwargs, **kwargs, "out_indices": tuple(indices)}
    if pretrained:
        from visiontf.io.downloads import network_problem

        kwargs["pretrained"] = True
        if pretrained is not True:
            from visiontf.io.weights import load_state_dict_file

            kwargs["pretrained_cfg_overlay"] = dict(state_dict=load_state_dict_file(pretrained))
        source = f"timm:{name} weights from {pretrained}" if pretrained is not True else f"timm:{name} ImageNet weights"
        problem = network_problem("https://huggingface.co") if pretrained is True else None
        try:
            from visiontf.io.downloads import hf_hub_offline

            with hf_hub_offline() if problem else contextlib.nullcontext():
                body = _create(name, **kwargs)
        except Exception as e:
            fix = (f"Without network, save timm.create_model('{name}', pretrained=True).state_dict() elsewhere and pass its path"
                   if pretrained is True else "pass the weights of this architecture (timm's or the original release's names)")
            raise RuntimeError(f"could not load {source} ({type(e).__name__}: {str(e)[:300]}). {fix}") from e
    else:
        body = _create(name, pretrained=False, **kwargs)
    if "dynamic_img_pad" in size_kwargs:  # a ViT: padded here to its patch (timm would pad it alike), with the mask
        return body, max(body.model.patch_embed.patch_size)
    return body, size_multiple(meta, name)


#: odd image sizes a detector's batches have; the multiples images may be padded to, smallest first
_ODD_SIZES = ((97, 130), (161, 200))
_MULTIPLES = (1, 2, 4, 8, 14, 16, 32, 64, 128, 256)


def size_multiple(meta: nn.Module, name: str) -> int:
    """The smallest multiple images must be padded to for ``meta`` (the model on the meta device, where a
    forward only checks shapes) to take odd sizes: 1 for CNNs and ViTs with ``dynamic_img_pad``, the
    patch for Swin, 32 for HRNet's fusions, 256 for MaxViT's grids. A model that takes no size but its
    own (Hiera) is refused: a detector's images vary in size."""
    device = next(iter(meta.parameters())).device  # the CPU where the constructor needed values

    def runs(multiple: int) -> bool:
        for h, w in _ODD_SIZES:
            try:
                with torch.no_grad():
                    meta.eval()(torch.zeros(1, 3, -(-h // multiple) * multiple, -(-w // multiple) * multiple, device=device))
            except NotImplementedError:  # an operator without a meta kernel: nothing learnt, take the size as it is
                return True
            except (RuntimeError, AssertionError, ValueError):
                return False
        return True

    for multiple in _MULTIPLES:
        if runs(multiple):
            return multiple
    raise ValueError(f"timm:{name} takes no image size but its own (padding to a multiple of up to {_MULTIPLES[-1]} does not help); "
                     "a detector's images vary in size: pick a CNN, Swin or ViT")


def is_nhwc(body: nn.Module) -> bool:
    """Whether timm's feature wrapper returns channels-last maps (Swin and other NHWC models)."""
    return str(getattr(body, "output_fmt", "NCHW")).endswith("NHWC")


def to_nchw(maps: Sequence[Tensor], nhwc: bool) -> list[Tensor]:
    return [m.permute(0, 3, 1, 2) for m in maps] if nhwc else list(maps)


def parameter_root(body: nn.Module) -> tuple[nn.Module, str]:
    """The module whose names timm's ``feature_info`` uses, and its prefix in ``body`` (ViT wrappers: ``model.``)."""
    from timm.models._features import FeatureGetterNet

    return (body.model, "model.") if isinstance(body, FeatureGetterNet) else (body, "")


def first_trained_module(body: nn.Module, min_stride: int = 8) -> str | None:
    """The module of the first feature at ``min_stride`` or coarser: what freeze_stem trains from (the
    stem and first stage before it stay frozen); a ViT's first block."""
    _, prefix = parameter_root(body)
    for info in body.feature_info.info:
        if info["reduction"] >= min_stride:
            return prefix + info["module"]
    return None


def module_after_feature(body: nn.Module, index: int) -> str | None:
    """The module of feature ``index + 1``: everything before it is frozen by ``frozen_stages=index``
    (None: past the last feature, freeze all)."""
    _, prefix = parameter_root(body)
    info = body.feature_info.info
    return prefix + info[index + 1]["module"] if index + 1 < len(info) else None
