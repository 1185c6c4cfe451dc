"""Inference-time folding of BatchNorm into the convolution before it.

In evaluation a BatchNorm (``nn.BatchNorm2d`` on its running statistics, or a frozen one) is a per-channel affine
map ``y = x * s + t`` with ``s = weight / sqrt(running_var + eps)`` and ``t = bias - running_mean * s``. When its
input is a convolution's output, ``bn(conv(x))`` equals one convolution with weight ``w * s`` (per output channel)
and bias ``b * s + t``: the elementwise pass over every activation disappears. :func:`fold_conv_bn` builds that
convolution; :func:`fold_batchnorms` finds the pairs in a module tree and swaps them for it and an ``nn.Identity``.

Only pairs whose order is known are folded: consecutive (convolution, BatchNorm) children of an ``nn.Sequential``,
and named pairs that a caller vouches for per module type (timm's ResNet blocks apply ``bn1`` to ``conv1``'s output,
its HGNet ``ConvBNAct`` applies ``bn`` to ``conv``'s). The result is an inference model: the BatchNorms are gone, so
training it would train the folded convolutions and keep no statistics (the detectors refuse ``train()`` after
folding). The outputs equal the unfolded model's up to float rounding (``tests/nn/test_fold_bn.py`` and the
detectors' tests).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch
from torch import Tensor, nn
from torchvision.ops import FrozenBatchNorm2d

from visiontf.nn.cpu_convolution import OneDNNConv2d

__all__ = ["fold_batchnorms", "fold_conv_bn", "is_foldable_norm"]


def is_foldable_norm(module: nn.Module) -> bool:
    """A BatchNorm that is an affine map in evaluation: torchvision's frozen one, or ``nn.BatchNorm2d`` with running
    statistics (an ``nn.BatchNorm2d`` in training mode normalises by the batch's and is not)."""
    if isinstance(module, FrozenBatchNorm2d):
        return True
    return type(module) is nn.BatchNorm2d and module.track_running_stats and module.running_var is not None


def _scale_shift(bn: nn.Module) -> tuple[Tensor, Tensor]:
    var, mean = bn.running_var, bn.running_mean
    weight = bn.weight if bn.weight is not None else torch.ones_like(var)
    bias = bn.bias if bn.bias is not None else torch.zeros_like(mean)
    scale = weight * (var + bn.eps).rsqrt()
    return scale, bias - mean * scale


def _frozen_partner(conv: nn.Module) -> nn.Module | None:
    """The frozen BatchNorm a :class:`~visiontf.models.backbones.frozen_bn.ConvFrozenBN2d` applies itself, if any."""
    return conv.__dict__.get("_frozen_bn")


def _plain_conv(conv: nn.Module) -> bool:
    """An ``nn.Conv2d`` whose forward is the plain one (or oneDNN's in inference, or a frozen-BN-riding one): subclasses
    with other paddings or weight transforms are left alone."""
    return isinstance(conv, nn.Conv2d) and (type(conv) in (nn.Conv2d, OneDNNConv2d) or _frozen_partner(conv) is not None)


@torch.no_grad()
def fold_conv_bn(conv: nn.Conv2d, bn: nn.Module | None = None) -> nn.Conv2d:
    """One ``nn.Conv2d`` (with a bias) computing ``bn(conv(x))`` in evaluation; ``bn`` None: the frozen BatchNorm that
    ``conv`` already applies (a ``ConvFrozenBN2d``), baked into its weight once instead of at every call.

    The new convolution has ``conv``'s geometry, dtype, device and memory format; its tensors are plain parameters
    (no gradient is wanted: it is an inference module)."""
    inner = _frozen_partner(conv)
    if bn is None and inner is None:
        raise ValueError("fold_conv_bn: give the BatchNorm that follows the convolution")
    weight, bias = conv.weight, conv.bias
    for norm in (inner, bn):
        if norm is None:
            continue
        if norm.running_var.numel() != weight.shape[0]:
            raise ValueError(f"fold_conv_bn: a convolution of {weight.shape[0]} outputs before a BatchNorm of {norm.running_var.numel()}")
        scale, shift = _scale_shift(norm)
        weight = weight * scale.reshape(-1, 1, 1, 1).to(weight.dtype)
        bias = shift.to(weight.dtype) if bias is None else bias * scale.to(bias.dtype) + shift.to(bias.dtype)
    fused = nn.Conv2d(conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride, conv.padding, conv.dilation, conv.groups,
                      True, conv.padding_mode, device=weight.device, dtype=weight.dtype)
    memory_format = torch.channels_last if conv.weight.is_contiguous(memory_format=torch.channels_last) and \
        not conv.weight.is_contiguous() else torch.contiguous_format
    fused.weight = nn.Parameter(weight.detach().clone().contiguous(memory_format=memory_format), requires_grad=False)
    fused.bias = nn.Parameter((bias if bias is not None else torch.zeros(weight.shape[0], dtype=weight.dtype,
                                                                         device=weight.device)).detach().clone(), requires_grad=False)
    return fused


def _last_conv(module: nn.Module) -> tuple[nn.Module, str] | None:
    """(parent, name) of the convolution that ends ``module``: itself, or the last child of an ``nn.Sequential`` (timm's
    deep ResNet stem is a Sequential ending in a convolution, followed by the block's ``bn1``)."""
    if isinstance(module, nn.Sequential) and len(module) and _plain_conv(module[-1]):
        return module, str(len(module) - 1)
    return None


def fold_batchnorms(root: nn.Module, named_pairs: Mapping[type, Iterable[tuple[str, str]]] | None = None) -> int:
    """Fold every known (convolution, BatchNorm) pair under ``root`` in place; returns how many were folded.

    Args:
        root: the module tree (in evaluation: the BatchNorms' running statistics are what is folded).
        named_pairs: module type -> the (convolution child, BatchNorm child) names that its forward applies one after
            the other (nothing in between). ``nn.Sequential`` children are paired by position without being named.

    Convolutions that apply a frozen BatchNorm themselves (the backbones' ``ConvFrozenBN2d``) are baked into plain
    ones. Folding again finds nothing left and returns 0.
    """
    named_pairs = dict(named_pairs or {})
    folded = 0
    for module in list(root.modules()):
        pairs: list[tuple[str, str]] = []
        if isinstance(module, nn.Sequential):
            names = [n for n, _ in module.named_children()]
            pairs += [(a, b) for a, b in zip(names, names[1:])]
        pairs += [p for cls, ps in named_pairs.items() if type(module) is cls for p in ps]
        for conv_name, bn_name in pairs:
            conv, bn = getattr(module, conv_name, None), getattr(module, bn_name, None)
            # a frozen BN already riding on its convolution is the identity here: the pass below bakes it
            if conv is None or bn is None or not is_foldable_norm(bn) or type(bn).__name__ == "FoldedFrozenBatchNorm2d":
                continue
            owner, name = (module, conv_name) if _plain_conv(conv) else (_last_conv(conv) or (None, None))
            if owner is None:
                continue
            setattr(owner, name, fold_conv_bn(getattr(owner, name), bn))
            setattr(module, bn_name, nn.Identity())
            folded += 1
    # convolutions that apply a frozen BatchNorm at every call (the backbones' ConvFrozenBN2d): baked once, and the
    # BatchNorm they applied (the identity in its own slot) removed
    for module in list(root.modules()):
        for name, child in list(module.named_children()):
            if type(child).__name__ == "FoldedFrozenBatchNorm2d":
                setattr(module, name, nn.Identity())
            elif _frozen_partner(child) is not None:
                setattr(module, name, fold_conv_bn(child))
                folded += 1
    return folded
