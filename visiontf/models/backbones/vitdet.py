"""A plain ViT as a multi-scale detection backbone: ViTDet's simple feature pyramid (Li et al., ECCV 2022).

detectron2's ``modeling/backbone/vit.py`` (``SimpleFeaturePyramid``): the ViT's last map (stride = the
patch, p) becomes one map per scale factor, each followed by a 1x1 and a 3x3 convolution without bias,
each with a channels-first LayerNorm:

======  ==========================================================================  ========
scale   layers before the two convolutions                                          stride
======  ==========================================================================  ========
4       ConvTranspose 2x2/2 (C -> C/2), LayerNorm, GELU, ConvTranspose 2x2/2 (-> C/4)  p / 4
2       ConvTranspose 2x2/2 (C -> C/2)                                              p / 2
1       none                                                                        p
0.5     max-pool 2x2/2                                                              2p
======  ==========================================================================  ========

plus, with ``top_block``, detectron2's ``LastLevelMaxPool`` (max-pool 1x1/2 of the last map: 4p).
The default, scales (2, 1, 0.5) and the top block, gives strides 8/16/32/64 at patch 16: the four
levels of DINO-4scale (detrex's DINO-ViTDet). A patch-14 ViT (DINOv2) gives 7/14/28/56, declared as
such in ``strides`` (no resampling to powers of two).

The ViT is visiontf's (``"vit_small_patch16_224"``) or timm's (``"timm:vit_small_patch14_dinov2"``),
built with ``dynamic_img_size`` and ``dynamic_img_pad``: the position table is resampled
(bicubic, antialiased, timm's) to every input's grid and the image is padded to a patch multiple.
With ``window_size`` > 0 the blocks not in ``global_blocks`` attend within windows of that many
tokens (ViTDet: 14, global blocks 2, 5, 8, 11 of ViT-B): the grid is zero-padded to window
multiples and the padded tokens are masked out of attention; prefix (class, register) tokens are
dropped then, as ViTDet's backbone has none. ViTDet's relative position biases are not built (the
pretrained ViTs here have none). Without windows the ViT runs exactly as timm's
``forward_intermediates`` (prefix tokens kept), so its map equals timm's ``features_only`` map.

Learning rates: the pyramid is in the ``"default"`` group (trained from scratch), the ViT in
``"backbone"``; :meth:`SimpleFeaturePyramidBackbone.layer_depth` gives ViTDet's layer ids for
layer-wise decay (patch embedding and position table 0, block i i + 1).
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from visiontf.models.backbones.backbone import SIMPLEFPN_PREFIX, TIMM_PREFIX, Backbone
from visiontf.models.backbones.registry import register_backbone
from visiontf.models.vit.vit import visiontf_vits

#: what a ViT's embedding holds besides its blocks: layer 0 of layer-wise decay
_STEM = ("patch_embed.", "pos_embed", "cls_token", "dist_token", "reg_token")


def _conv_ln(cin: int, cout: int, kernel: int) -> list[nn.Module]:
    from timm.layers import LayerNorm2d

    return [nn.Conv2d(cin, cout, kernel, padding=kernel // 2, bias=False), LayerNorm2d(cout, eps=1e-6)]


def pyramid_level(dim: int, scale: float, out_channels: int) -> nn.Sequential:
    """One level of the simple feature pyramid (detectron2's layers for ``scale``)."""
    from timm.layers import LayerNorm2d

    if scale == 4.0:
        layers = [nn.ConvTranspose2d(dim, dim // 2, 2, 2), LayerNorm2d(dim // 2, eps=1e-6), nn.GELU(),
                  nn.ConvTranspose2d(dim // 2, dim // 4, 2, 2)]
        width = dim // 4
    elif scale == 2.0:
        layers, width = [nn.ConvTranspose2d(dim, dim // 2, 2, 2)], dim // 2
    elif scale == 1.0:
        layers, width = [], dim
    elif scale == 0.5:
        layers, width = [nn.MaxPool2d(2, 2)], dim
    else:
        raise ValueError(f"scale factor {scale} is not one of ViTDet's 4, 2, 1, 0.5")
    return nn.Sequential(*layers, *_conv_ln(width, out_channels, 1), *_conv_ln(out_channels, out_channels, 3))


def _build_vit(name: str, pretrained: bool | str | Path | None, kwargs: dict[str, Any]) -> nn.Module:
    """A visiontf or timm ViT (classifier dropped) that takes any image size."""
    size = {"dynamic_img_size": True, "dynamic_img_pad": True, "num_classes": 0}
    if name.startswith(TIMM_PREFIX):
        import timm

        timm_name = name[len(TIMM_PREFIX):]
        extra: dict[str, Any] = {}
        if pretrained and pretrained is not True:
            from visiontf.io.weights import load_state_dict_file

            extra["pretrained_cfg_overlay"] = dict(state_dict=load_state_dict_file(pretrained))
        try:
            vit = timm.create_model(timm_name, pretrained=bool(pretrained), **size, **extra, **kwargs)
        except TypeError as e:
            raise ValueError(f"timm model {timm_name!r} is not a plain ViT (it takes no dynamic_img_size): {e}") from e
        if not hasattr(vit, "blocks") or not hasattr(vit, "_pos_embed"):
            raise ValueError(f"timm model {timm_name!r} is not a plain ViT with blocks (ViT, DeiT, DINOv2, EVA)")
        return vit
    from visiontf.models._registry import create_model

    vits = visiontf_vits()
    if name not in vits:
        raise ValueError(f"simplefpn:{name}: not a ViT; use a visiontf ViT ({', '.join(vits[:4])}, ...) or 'timm:<ViT name>'")
    return create_model(name, pretrained=pretrained or None, **size, **kwargs)


class SimpleFeaturePyramidBackbone(Backbone):
    """ViTDet's simple feature pyramid on a plain ViT (see the module doc); ``net`` is the ViT.

    Args:
        vit: a visiontf ViT / DeiT name or ``"timm:<ViT name>"`` (DINOv2: ``timm:vit_small_patch14_dinov2``).
        out_channels: channels of every pyramid map (256).
        scale_factors: ViTDet's scales of the ViT's map (4, 2, 1, 0.5 and any subset).
        top_block: one more map, max-pooled from the last (detectron2's ``LastLevelMaxPool``).
        window_size: tokens per window side for the windowed blocks; 0: every block global.
        global_blocks: blocks that attend globally with windows on (ViTDet ViT-B: 2, 5, 8, 11).
        pretrained: the ViT's weights: a file (timm's / visiontf's names) or True (published).
        train_backbone: False freezes the ViT (the pyramid, new, still trains).
        freeze_stem: freeze the patch embedding and position table (ViTDet: False).
        frozen_stages: freeze them and blocks 0..k.
        vit_kwargs: to the ViT's constructor (``drop_path_rate``, sizes for tests).
    """

    def __init__(self, vit: str, out_channels: int = 256, scale_factors: Sequence[float] = (2.0, 1.0, 0.5),
                 top_block: bool = True, window_size: int = 0, global_blocks: Sequence[int] = (),
                 pretrained: bool | str | Path | None = None, train_backbone: bool = True, freeze_stem: bool = False,
                 frozen_stages: int | None = None, **vit_kwargs: Any) -> None:
        super().__init__()
        self.net = _build_vit(vit, pretrained, vit_kwargs)
        self.timm_vit = vit.startswith(TIMM_PREFIX)
        self.net.norm = nn.Identity()  # ViTDet reads the last block's output, un-normalised (as features_only)
        depth = len(self.net.blocks)
        bad = [i for i in global_blocks if not 0 <= int(i) < depth]
        if bad:
            raise ValueError(f"global_blocks {tuple(global_blocks)} do not fit a ViT of {depth} blocks (0..{depth - 1})")
        if window_size < 0:
            raise ValueError(f"window_size={window_size}: 0 (global attention everywhere) or a window side in tokens")
        self.window_size = int(window_size)
        self.global_blocks = tuple(int(i) for i in global_blocks)
        patch = self.net.patch_embed.patch_size
        patch = max(patch) if isinstance(patch, (tuple, list)) else int(patch)
        self.pad_multiple = patch  # images (and their mask) padded to the patch here, as the ViT would pad them
        dim = self.net.embed_dim
        self.scale_factors = tuple(float(s) for s in scale_factors)
        if list(self.scale_factors) != sorted(set(self.scale_factors), reverse=True) or not self.scale_factors:
            raise ValueError(f"scale_factors={tuple(scale_factors)} must be decreasing, among 4, 2, 1, 0.5")
        self.pyramid = nn.ModuleList(pyramid_level(dim, s, out_channels) for s in self.scale_factors)
        # the 0.5 level max-pools the patch grid by 2: an image smaller than two patches would leave it no cell
        self.min_size = int(patch / min(1.0, self.scale_factors[-1]))
        self.top_block = bool(top_block)
        self.strides = [patch / s for s in self.scale_factors] + ([2 * patch / self.scale_factors[-1]] if top_block else [])
        self.strides = [int(s) if float(s).is_integer() else s for s in self.strides]
        self.channels = [out_channels] * len(self.strides)
        self._freeze(train_backbone, freeze_stem, frozen_stages)

    def _freeze(self, train_backbone: bool, freeze_stem: bool, frozen_stages: int | None) -> None:
        last = frozen_stages if frozen_stages is not None else (-1 if freeze_stem else None)
        for name, p in self.net.named_parameters():
            block = int(name.split(".")[1]) if name.startswith("blocks.") else (-1 if name.startswith(_STEM) else None)
            p.requires_grad_(train_backbone and not (last is not None and block is not None and block <= last))

    # ------------------------------------------------------------------ optimiser knowledge
    def param_group(self, name: str) -> str:
        """The ViT at the backbone's learning rate; the pyramid, new, at the detector's."""
        return "backbone" if name.startswith("net.") else "default"

    def layer_depth(self, name: str) -> tuple[int, int] | None:
        """ViTDet's ``get_vit_lr_decay_rate`` ids: embedding 0, block i i + 1, the rest of the ViT L + 1."""
        if not name.startswith("net."):
            return None
        depth, rest = len(self.net.blocks), name[len("net."):]
        if rest.startswith(_STEM):
            return 0, depth
        if rest.startswith("blocks."):
            return int(rest.split(".")[1]) + 1, depth
        return depth + 1, depth

    # ------------------------------------------------------------------ forward
    def _tokens(self, images: Tensor) -> tuple[Tensor, tuple[int, int], int]:
        """Embedded tokens (B, prefix + h * w, C), the grid (h, w) and the prefix length."""
        net = self.net
        if not self.timm_vit:
            x, grid = net._embed(images)
            return x, grid, net.num_prefix_tokens
        x = net.patch_embed(images)  # (B, h, w, C): timm's ViT with dynamic_img_size
        grid = (x.shape[1], x.shape[2])
        x = net.norm_pre(net.patch_drop(net._pos_embed(x)))
        return x, grid, net.num_prefix_tokens

    def _block(self, block: nn.Module, x: Tensor, attn_mask: Tensor | None = None) -> Tensor:
        out = block(x, attn_mask=attn_mask)
        return out[0] if isinstance(out, tuple) else out

    def _windowed(self, block: nn.Module, x: Tensor, grid: tuple[int, int]) -> Tensor:
        """``block`` on windows of the (B, h * w, C) tokens; padded positions masked out of attention."""
        B, _, C = x.shape
        (h, w), s = grid, self.window_size
        ph, pw = -h % s, -w % s
        y = F.pad(x.view(B, h, w, C), (0, 0, 0, pw, 0, ph))
        Hp, Wp = h + ph, w + pw
        y = y.view(B, Hp // s, s, Wp // s, s, C).permute(0, 1, 3, 2, 4, 5).reshape(-1, s * s, C)
        mask = None
        if ph or pw:
            valid = F.pad(x.new_ones(1, h, w), (0, pw, 0, ph)).view(1, Hp // s, s, Wp // s, s).permute(0, 1, 3, 2, 4)
            valid = valid.reshape(-1, 1, 1, s * s).repeat(B, 1, 1, 1)  # per window, its keys
            mask = torch.zeros_like(valid).masked_fill(valid == 0, float("-inf"))
        y = self._block(block, y, mask)
        y = y.view(B, Hp // s, Wp // s, s, s, C).permute(0, 1, 3, 2, 4, 5).reshape(B, Hp, Wp, C)
        return y[:, :h, :w].reshape(B, h * w, C)

    def forward_vit(self, images: Tensor) -> Tensor:
        """The ViT's last block as a (B, C, h, w) map."""
        x, grid, prefix = self._tokens(images)
        if self.window_size:
            x = x[:, prefix:]
            prefix = 0
        for i, block in enumerate(self.net.blocks):
            windowed = self.window_size and i not in self.global_blocks
            x = self._windowed(block, x, grid) if windowed else self._block(block, x)
        B, _, C = x.shape
        return x[:, prefix:].transpose(1, 2).reshape(B, C, *grid)

    def forward_maps(self, images: Tensor) -> list[Tensor]:
        x = self.forward_vit(self.pad(images))
        maps = [level(x) for level in self.pyramid]
        if self.top_block:
            maps.append(F.max_pool2d(maps[-1], kernel_size=1, stride=2))
        return maps


_TINY_VIT = dict(depth=2, embed_dim=64, num_heads=2)


@register_backbone("simplefpn", prefix=SIMPLEFPN_PREFIX, summary="ViTDet's simple feature pyramid on a visiontf or timm: ViT",
                   examples={"simplefpn:vit_tiny_patch16_224": dict(_TINY_VIT, window_size=2, global_blocks=(1,), out_channels=32),
                             "simplefpn:timm:vit_small_patch14_dinov2": dict(_TINY_VIT, img_size=56, out_channels=32)})
def simplefpn_backbone(name: str, *, out_indices: Sequence[int] | None = None, num_levels: int = 1, min_stride: int = 8,
                       pretrained: bool | str | Path | None = None, train_backbone: bool = True, freeze_stem: bool = True,
                       frozen_stages: int | None = None, frozen_bn: bool = True, channels_last: bool = False,
                       dilation: bool = False, **kwargs: Any) -> SimpleFeaturePyramidBackbone:
    """The registry's builder of ``"simplefpn:<ViT>"``: the pyramid's own keywords (``window_size``,
    ``global_blocks``, ``out_channels``, ...) and the ViT's in ``kwargs``. The levels are the pyramid's
    (``out_indices``, ``num_levels`` and ``min_stride`` are not read), the stem trains unless ``frozen_stages`` says
    otherwise (ViTDet), and a ViT has no BatchNorm to freeze."""
    if dilation:
        raise ValueError(f"dilation (DC5) is for CNNs; {name} is a ViT pyramid")
    return SimpleFeaturePyramidBackbone(name[len(SIMPLEFPN_PREFIX):], pretrained=pretrained, train_backbone=train_backbone,
                                        frozen_stages=frozen_stages, **kwargs)
