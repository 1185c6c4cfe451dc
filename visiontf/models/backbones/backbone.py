"""The backbone a detector (DETR, Deformable DETR, DINO) or SETR receives: one interface, several makers.

A :class:`Backbone` is an ``nn.Module`` that declares what the model built on it reads:

* ``channels`` / ``strides``: of each map it returns, finest first (``num_channels``: the last map's);
* :meth:`Backbone.forward_maps`: images (B, 3, H, W) -> those maps, NCHW;
* :meth:`Backbone.forward_features`: the maps and the padding mask resized to each (nearest, as
  DETR); ``forward`` the last of them (single-scale DETR);
* :meth:`Backbone.param_group` / :meth:`Backbone.layer_depth`: which learning-rate group each of its
  parameters is in (``"backbone"``, or ``"default"`` for a neck trained from scratch) and its depth
  for layer-wise learning-rate decay.

Makers: :func:`visiontf.models.backbones.build.build_backbone` (a name -> a :class:`Backbone`).
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from visiontf.io.weights import WeightsError
from visiontf.models._registry import key_mismatch

#: prefix selecting a timm model, e.g. ``"timm:convnext_tiny"``
TIMM_PREFIX = "timm:"
#: prefix selecting ViTDet's simple feature pyramid on a ViT, e.g. ``"simplefpn:vit_small_patch16_224"``
SIMPLEFPN_PREFIX = "simplefpn:"


def resize_mask(mask: Tensor, size: Sequence[int]) -> Tensor:
    """The (B, H, W) padding mask at a map's ``size``: nearest, exactly as the original DETR (no align)."""
    return F.interpolate(mask[None].float(), size=tuple(size)).to(torch.bool)[0]


def pad_to_multiple(x: Tensor, multiple: int, value: float | bool = 0) -> Tensor:
    """``x`` (..., H, W) padded bottom/right to a multiple of ``multiple`` with ``value``."""
    if multiple <= 1:
        return x
    H, W = x.shape[-2:]
    return F.pad(x, (0, -W % multiple, 0, -H % multiple), value=value)


class Backbone(nn.Module):
    """Images -> feature maps, with the channels and strides of each declared (see the module doc).

    Subclasses set ``channels`` and ``strides`` (one entry per returned map, finest first) and
    implement :meth:`forward_maps`.
    """

    channels: list[int]
    strides: list[int]
    #: the backbone runs its images channels-last in training too (built so); the detectors lay out their own
    #: convolutions alike (:meth:`share_layout`)
    channels_last: bool = False
    #: images are zero-padded bottom/right to a multiple of this before the maps are computed (a patch,
    #: a window grid); the padding mask is padded alike (True), so the padded pixels are padding
    pad_multiple: int = 1
    #: and to at least this many pixels a side (the coarsest map of a pyramid that pools needs one cell)
    min_size: int = 1

    def share_layout(self, *modules: nn.Module) -> None:
        """Put the convolution weights of ``modules`` (the parts the backbone's maps flow into) in the backbone's
        layout: channels-last when it runs so. A convolution's weight gradient comes back in its input's layout, and
        DDP's gradient buckets are views in the parameters' strides, which for a 1 x 1 weight differ between the two
        layouts: DDP then copied every such gradient at every step (and warned that it may impair performance)."""
        if self.channels_last:
            for module in modules:
                module.to(memory_format=torch.channels_last)

    def pad(self, x: Tensor, value: float | bool = 0) -> Tensor:
        """``x`` (..., H, W) padded bottom/right with ``value`` as the maps need: to a multiple of
        :attr:`pad_multiple`, and to at least :attr:`min_size` pixels a side."""
        x = pad_to_multiple(x, self.pad_multiple, value=value)
        H, W = x.shape[-2:]
        if self.min_size > 1 and (H < self.min_size or W < self.min_size):
            x = F.pad(x, (0, max(self.min_size - W, 0), 0, max(self.min_size - H, 0)), value=value)
        return x

    @property
    def num_channels(self) -> int:
        """Channels of the last (coarsest) map: what single-scale DETR projects."""
        return self.channels[-1]

    def forward_maps(self, images: Tensor) -> list[Tensor]:
        """(B, 3, H, W) -> one (B, C_i, h_i, w_i) map per entry of ``channels``, finest first."""
        raise NotImplementedError

    def forward_features(self, images: Tensor, mask: Tensor) -> tuple[list[Tensor], list[Tensor]]:
        """Every map, and the padding mask (B, H, W, True on padding) resized to each."""
        maps = self.forward_maps(images)
        mask = self.pad(mask, value=True)
        return maps, [resize_mask(mask, x.shape[-2:]) for x in maps]

    def forward(self, images: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        """images (B, 3, H, W), mask (B, H, W) True on padding -> the last map (B, C, h, w) and its mask."""
        maps, masks = self.forward_features(images, mask)
        return maps[-1], masks[-1]

    def param_group(self, name: str) -> str:
        """The learning-rate group of parameter ``name`` (relative to the backbone): ``"backbone"``."""
        return "backbone"

    def layer_depth(self, name: str) -> tuple[int, int] | None:
        """(layer id, number of layers) of parameter ``name`` for layer-wise lr decay (ViTDet's
        ``get_vit_lr_decay_rate``: the stem 0, block i i + 1); None: not in a layer stack (no decay)."""
        return None


def _resizable_vits(model: nn.Module) -> list[nn.Module]:
    """The ViTs in ``model`` whose position table is resampled per input (visiontf's, timm's with dynamic_img_size)."""
    from visiontf.models.vit.timm_api import TimmViTApi

    found = []
    for m in model.modules():
        ours = isinstance(m, TimmViTApi) and m.dynamic_img_size
        timm_vit = not isinstance(m, TimmViTApi) and getattr(m, "dynamic_img_size", False) and hasattr(m, "set_input_size")
        if (ours or timm_vit) and isinstance(getattr(m, "pos_embed", None), nn.Parameter):
            found.append(m)
    return found


@contextmanager
def fixed_position_tables(model: nn.Module, image_size: Sequence[int]) -> Iterator[nn.Module]:
    """Every resizable ViT in ``model`` with its position table resampled, in eager mode, to the grid of
    ``image_size`` (padded to the patch), restored afterwards.

    Traced for ONNX, a table resampled per input would be timm's antialiased bicubic interpolation,
    which has no ONNX operator; resampled beforehand, the graph holds the table for that grid, so a
    graph with a ViT backbone takes images of the export size (another size fails in onnxruntime).
    """
    saved = []
    for vit in _resizable_vits(model):
        p = vit.patch_embed.patch_size
        ph, pw = (p, p) if isinstance(p, int) else p
        size = (-(-int(image_size[0]) // ph) * ph, -(-int(image_size[1]) // pw) * pw)
        saved.append((vit, vit.pos_embed, tuple(vit.patch_embed.img_size), vit.pretrained_cfg))
        vit.set_input_size(img_size=size)
    try:
        yield model
    finally:
        for vit, table, img_size, cfg in saved:
            vit.patch_embed.set_input_size(img_size=img_size)
            vit.pos_embed = table
            vit.pretrained_cfg = cfg


def select_levels(reductions: Sequence[int], num_levels: int, min_stride: int = 8) -> list[int]:
    """Feature indices for ``num_levels`` maps by default: the last feature of each distinct stride,
    strides of ``min_stride`` (8) and more, the coarsest ``num_levels`` of them (ResNet: layer2-4 =
    strides 8/16/32; ConvNeXt, Swin: stages 1-3; a plain ViT, all stride 16: its last block)."""
    last_of_stride: dict[int, int] = {}
    for i, r in enumerate(reductions):
        last_of_stride[int(r)] = i
    candidates = [i for r, i in sorted(last_of_stride.items()) if r >= min_stride] or [len(reductions) - 1]
    return candidates[-num_levels:]


def check_indices(out_indices: Sequence[int], reductions: Sequence[int], what: str) -> list[int]:
    """``out_indices`` as increasing absolute feature indices, or one line naming the features there are."""
    n = len(reductions)
    indices = [n + int(i) if int(i) < 0 else int(i) for i in out_indices]
    if not indices or any(not 0 <= i < n for i in indices) or indices != sorted(set(indices)):
        listing = ", ".join(f"{i} (stride {r})" for i, r in enumerate(reductions))
        raise ValueError(f"out_indices={tuple(out_indices)} do not fit {what}: use increasing feature indices among {listing}")
    return indices


class BackboneLayerDepth:
    """Mixed into a detector whose ``backbone`` is a :class:`Backbone`: the depth the backbone gives a
    ``backbone.*`` parameter (a ViT's blocks) for layer-wise lr decay; None for the rest (the detection
    head trains without decay, as ViTDet's)."""

    def layer_depth(self, name: str) -> tuple[int, int] | None:
        backbone = self._modules.get("backbone")
        if isinstance(backbone, Backbone) and name.startswith("backbone."):
            return backbone.layer_depth(name[len("backbone."):])
        return None


def load_fitting_imagenet(body: nn.Module, state: dict[str, Tensor], path: object, family: str, target: str,
                          expected: str) -> int:
    """Load ``state`` (an ImageNet file already in ``body``'s names, the classifier dropped) into ``body`` strictly.

    A file of another layout or width is refused in one line naming ``path``, the ``family`` and ``target`` backbone,
    and what was ``expected``, never loaded in part. Returns the number of tensors loaded.
    """
    own = body.state_dict()
    missing = [k for k in own if k not in state and not k.endswith("num_batches_tracked")]
    unexpected = [k for k in state if k not in own]
    if missing or unexpected:
        raise WeightsError(f"{path}: {family} weights do not fit the {target} backbone: {key_mismatch(missing, unexpected)}; "
                           f"expected {expected}")
    wrong = [f"{k} {tuple(state[k].shape)} -> {tuple(own[k].shape)}" for k in state if state[k].shape != own[k].shape]
    if wrong:
        raise WeightsError(f"{path}: {family} weights of another width: {'; '.join(wrong[:4])}")
    body.load_state_dict(state, strict=False)
    return len(state)
