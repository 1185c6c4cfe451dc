"""IPT, the Image Processing Transformer (Chen et al., CVPR 2021), exact to huawei-noah/Pretrained-IPT.

The architecture is the original ``model/ipt.py`` with ``option.py``'s defaults: per task a head
(conv3x3 3->64, two ResBlocks with 5x5 convs) and a tail (EDSR upsampler, conv 64->3) around one
shared body; the body cuts the 48x48 feature map into 3x3 patches (256 tokens of 576 dims),
``linear_encoding(x) + x``, adds a learned position table once, runs 12 pre-norm encoder layers
and 12 pre-norm decoder layers (tgt = memory = the encoder's output; the task's query table is added
to the queries and keys of the decoder's self-attention and to the queries of its cross-attention),
then ``mlp_head(x) + x`` and folds back. Attention has no biases (``nn.MultiheadAttention(bias=False)``),
the FFN is 4x ReLU, there is no final norm and no dropout by default.

The layers are visiontf's shared blocks (:mod:`visiontf.nn`), so the transformer's parameters have
their names (``attn.qkv``, ``mlp.fc1``, ``cross_attn``); heads, tails, the mean shift and the body's
own tables keep the original names. The released raw state dicts (``IPT_sr2.pt`` ...
``IPT_pretrain.pt``) load through :mod:`visiontf.models.ipt.convert`
(``create_model("ipt_sr_x2", pretrained="IPT_sr2.pt")``).

``model(x)`` takes and returns images in [0, 1] (the original works in 0-255; the model multiplies
and divides inside). One ``tile_size`` window goes straight through; any other size is tiled with
the original ``forward_chop`` (:mod:`visiontf.models.ipt.tiling`).
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from visiontf.models._registry import register_model
from visiontf.models.contract import ModelCfg, PretrainedCfg, Restorer
from visiontf.models.ipt.build import build_ipt
from visiontf.models.ipt.convert import convert_state_dict
from visiontf.models.ipt.task_names import PRETRAIN_TASKS, task_scale
from visiontf.models.ipt.tiling import forward_chop, forward_x8
from visiontf.nn import TransformerDecoder, TransformerDecoderLayer, TransformerEncoder, TransformerEncoderLayer

#: the original ``MeanShift`` mean (DIV2K's RGB mean), std 1
RGB_MEAN = (0.4488, 0.4371, 0.4040)

def _conv(cin: int, cout: int, k: int) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, k, padding=k // 2)


class MeanShift(nn.Module):
    """``x * 1 + sign * rgb_range * mean`` per channel, as the original's frozen 1x1 conv.

    Its ``weight`` (3, 3, 1, 1) and ``bias`` (3,) are buffers: in the state dict under the original
    names, never trained, and a file's own values (another ``rgb_range``) are honoured.
    """

    def __init__(self, rgb_range: float, mean=RGB_MEAN, sign: int = -1) -> None:
        super().__init__()
        self.register_buffer("weight", torch.eye(3).view(3, 3, 1, 1))
        self.register_buffer("bias", sign * rgb_range * torch.tensor(mean, dtype=torch.float32))

    def forward(self, x: Tensor) -> Tensor:
        return F.conv2d(x, self.weight.to(x.dtype), self.bias.to(x.dtype))


class ResBlock(nn.Module):
    """EDSR's residual block without BatchNorm: conv, ReLU, conv, + input (``body.0`` / ``body.2``)."""

    def __init__(self, n_feats: int, kernel_size: int = 5) -> None:
        super().__init__()
        self.body = nn.Sequential(_conv(n_feats, n_feats, kernel_size), nn.ReLU(True), _conv(n_feats, n_feats, kernel_size))

    def forward(self, x: Tensor) -> Tensor:
        return self.body(x) + x


class Upsampler(nn.Sequential):
    """EDSR's upsampler: log2(scale) steps of conv -> PixelShuffle(2), or one x3 step; empty for scale 1."""

    def __init__(self, scale: int, n_feats: int) -> None:
        layers: list[nn.Module] = []
        if scale >= 1 and scale & (scale - 1) == 0:
            for _ in range(int(math.log2(scale))):
                layers += [_conv(n_feats, 4 * n_feats, 3), nn.PixelShuffle(2)]
        elif scale == 3:
            layers += [_conv(n_feats, 9 * n_feats, 3), nn.PixelShuffle(3)]
        else:
            raise ValueError(f"IPT's upsampler supports scales 1, 2, 3, 4, 8, ..., got {scale}")
        super().__init__(*layers)


class PositionTable(nn.Module):
    """The learned position table (``pe``: one row per token), added once before the encoder."""

    def __init__(self, num_tokens: int, dim: int) -> None:
        super().__init__()
        self.pe = nn.Embedding(num_tokens, dim)


class IPTBody(nn.Module):
    """The shared transformer: (B, C, S, S) features -> (B, C, S, S) features for task ``task``."""

    def __init__(self, img_size: int, patch_dim: int, channels: int, num_heads: int, num_layers: int,
                 num_queries: int, dropout: float = 0.0) -> None:
        super().__init__()
        if img_size % patch_dim:
            raise ValueError(f"tile_size {img_size} is not a multiple of patch_dim {patch_dim}")
        self.img_size, self.patch_dim = img_size, patch_dim
        self.dim = dim = channels * patch_dim * patch_dim
        if dim % num_heads:
            raise ValueError(f"embedding dim {dim} (n_feats * patch_dim**2) is not divisible by num_heads {num_heads}")
        self.num_tokens = n = (img_size // patch_dim) ** 2
        hidden = 4 * dim
        self.linear_encoding = nn.Linear(dim, dim)
        self.mlp_head = nn.Sequential(nn.Linear(dim, hidden), nn.Dropout(dropout), nn.ReLU(), nn.Linear(hidden, dim), nn.Dropout(dropout))
        self.query_embed = nn.Embedding(num_queries, dim * n)
        common = dict(mlp_dim=hidden, dropout=dropout, attn_drop=dropout, norm_first=True, qkv_bias=False,
                      proj_bias=False, act_layer=nn.ReLU, norm_eps=1e-5)
        self.encoder = TransformerEncoder(TransformerEncoderLayer(dim, num_heads, **common), num_layers)
        self.decoder = TransformerDecoder(TransformerDecoderLayer(dim, num_heads, **common), num_layers)
        self.position_encoding = PositionTable(n, dim)
        self.dropout_layer1 = nn.Dropout(dropout)
        # nn.MultiheadAttention's in_proj init in the decoder (xavier); the encoder's is re-drawn
        # kaiming-uniform(a=sqrt(5)) in the original, which is nn.Linear's default here
        for layer in self.decoder.layers:
            nn.init.xavier_uniform_(layer.self_attn.qkv.weight)
            nn.init.xavier_uniform_(layer.cross_attn.qkv.weight)

    def forward(self, x: Tensor, task: int) -> Tensor:
        p = self.patch_dim
        tokens = F.unfold(x, p, stride=p).transpose(1, 2)  # (B, N, C*p*p)
        tokens = self.dropout_layer1(self.linear_encoding(tokens)) + tokens
        query = self.query_embed.weight[task].view(1, self.num_tokens, self.dim).to(tokens.dtype)
        pos = self.position_encoding.pe.weight.unsqueeze(0).to(tokens.dtype)
        memory = self.encoder(tokens + pos)["output"]
        tokens = self.decoder(memory, memory, query_pos=query)["output"]
        tokens = self.mlp_head(tokens) + tokens
        return F.fold(tokens.transpose(1, 2), self.img_size, p, stride=p)


class IPT(Restorer):
    """Image Processing Transformer: one head, tail and query per task around a shared body.

    Args:
        tasks: task names, one head/tail/query each (``"sr_x2"``, ``"denoise_sigma30"``, ``"derain"``...).
        scales: upscaling factor per task; default from the names (``sr_xN`` -> N, others 1).
        n_feats: channels of the heads and tails (the body's tokens have ``n_feats * patch_dim**2`` dims).
        tile_size: the body's window (the original ``--patch_size``, 48); larger images are tiled.
        patch_dim: token patch size on the feature map (3).
        num_heads, num_layers: attention heads; encoder layers (= decoder layers).
        num_queries: rows of the task-query table; default one per task.
        dropout: the original ``--dropout_rate`` (0).
        rgb_range: the value range the original network works in (255); inputs are in [0, 1].
        crop_batch_size: windows per call when tiling (64).
        self_ensemble: average the x8 flips/transposes at inference (the original ``--self_ensemble``).
        input_skip: ``"bicubic"`` adds the bicubic upscaled (scale 1: the unchanged) input to the output,
            and the tails' last convolutions start at zero, so the network starts as bicubic
            interpolation and learns the residual (VDSR's global skip). Not in the original IPT (None);
            visiontf's CPU recipe uses it to train ``ipt_tiny`` in minutes.
        pretrained_cfg: eval settings over those the arguments above give.
    """

    #: no class head: never drop mis-shaped head/tail tensors on load (they mean another task)
    head_prefixes: tuple[str, ...] = ()

    def __init__(self, tasks=("sr_x2",), scales=None, n_feats: int = 64, tile_size: int = 48, patch_dim: int = 3,
                 num_heads: int = 12, num_layers: int = 12, num_queries: int | None = None, dropout: float = 0.0,
                 rgb_range: float = 255.0, crop_batch_size: int = 64, self_ensemble: bool = False,
                 input_skip: str | None = None, pretrained_cfg: PretrainedCfg | Mapping[str, Any] | None = None) -> None:
        super().__init__()
        self.tasks = tuple(tasks)
        if not self.tasks:
            raise ValueError("IPT needs at least one task")
        self.scales = tuple(int(s) for s in (scales if scales is not None else [task_scale(t) for t in self.tasks]))
        if len(self.scales) != len(self.tasks):
            raise ValueError(f"{len(self.tasks)} tasks but {len(self.scales)} scales")
        if tile_size % 4:
            raise ValueError(f"tile_size must be a multiple of 4 (tiles overlap by tile_size // 4), got {tile_size}")
        num_queries = len(self.tasks) if num_queries is None else num_queries
        if num_queries < len(self.tasks):
            raise ValueError(f"num_queries {num_queries} < {len(self.tasks)} tasks")
        self.tile_size = tile_size
        self.rgb_range = float(rgb_range)
        self.crop_batch_size = crop_batch_size
        self.self_ensemble = self_ensemble
        if input_skip not in (None, "bicubic"):
            raise ValueError(f"input_skip={input_skip!r}; use None (the original) or 'bicubic'")
        self.input_skip = input_skip
        self.sub_mean = MeanShift(rgb_range, sign=-1)
        self.add_mean = MeanShift(rgb_range, sign=1)
        self.head = nn.ModuleList(
            nn.Sequential(_conv(3, n_feats, 3), ResBlock(n_feats, 5), ResBlock(n_feats, 5)) for _ in self.tasks
        )
        self.body = IPTBody(img_size=tile_size, patch_dim=patch_dim, channels=n_feats, num_heads=num_heads, num_layers=num_layers,
                            num_queries=num_queries, dropout=dropout)
        self.tail = nn.ModuleList(nn.Sequential(Upsampler(s, n_feats), _conv(n_feats, 3, 3)) for s in self.scales)
        self.pretrained_cfg = PretrainedCfg(
            rgb_range=self.rgb_range, input_range=(0.0, 1.0), mean=RGB_MEAN, tasks=self.tasks,
            scale=self.scales[0] if len(self.scales) == 1 else self.scales, tile_size=tile_size, tile_stride=tile_size // 4,
            shave=tile_size // 2, crop_batch_size=crop_batch_size, self_ensemble=self_ensemble,
            psnr="y",  # scored on Y, `scale` pixels cropped at each border (visiontf.tasks.restoration.restoration_measures)
        ).merged(pretrained_cfg)
        if input_skip:
            for tail in self.tail:
                nn.init.zeros_(tail[-1].weight)
                nn.init.zeros_(tail[-1].bias)

    # ------------------------------------------------------------------ optimiser knowledge (timm style)
    # no_weight_decay and param_group: the base's (none; one group): the original trains with weight decay 0
    # and one learning rate

    # ------------------------------------------------------------------ forward
    def task_index(self, task: int | str | None = None) -> int:
        """The index of ``task`` (an index or a name of :attr:`tasks`); None means the only task."""
        if task is None:
            if len(self.tasks) > 1:
                raise ValueError(f"this IPT has {len(self.tasks)} tasks; pass task= one of {list(self.tasks)} or its index")
            return 0
        if isinstance(task, str):
            if task not in self.tasks:
                raise ValueError(f"unknown task {task!r}; this IPT has {list(self.tasks)}")
            return self.tasks.index(task)
        idx = int(task)
        if not 0 <= idx < len(self.tasks):
            raise ValueError(f"task index {idx} out of range: this IPT has {len(self.tasks)} tasks {list(self.tasks)}")
        return idx

    def forward_window(self, x: Tensor, task: int = 0) -> Tensor:
        """The original network on whole windows: (N, 3, tile, tile) in 0-``rgb_range`` -> (N, 3, tile*s, tile*s)."""
        inp = x
        x = self.head[task](self.sub_mean(x))
        res = self.body(x, task) + x
        out = self.tail[task](res)
        if not self.input_skip:
            return self.add_mean(out)
        s = self.scales[task]  # the tail predicts the residual over the interpolated input
        return out + (inp if s == 1 else F.interpolate(inp, scale_factor=s, mode="bicubic", align_corners=False))

    def forward(self, x: Tensor, task: int | str | None = None) -> Tensor:
        """Restore / upscale images.

        Args:
            x: (B, 3, H, W) in [0, 1], any size. Exactly ``tile_size`` square goes through the network
                once; anything else is tiled (``forward_chop``); smaller than a tile, it is
                reflect-padded at the bottom and right to one tile (replicate when too small to
                reflect) and the result cropped back.
            task: which head/tail/query (index or name); may be omitted for a single-task model.

        Returns:
            (B, 3, H * scale, W * scale) in [0, 1] up to the network's overshoot (not clamped;
            :func:`visiontf.tasks.restoration.restoration_measures.quantize` is the original's 8-bit rounding).
        """
        idx = self.task_index(task)
        _check_images(x)
        run = partial(self._any_size, task=idx, scale=self.scales[idx])
        x = x * self.rgb_range
        y = forward_x8(run, x) if self.self_ensemble and not self.training else run(x)
        return y / self.rgb_range

    def _any_size(self, x: Tensor, task: int, scale: int) -> Tensor:
        t = self.tile_size
        H, W = x.shape[-2:]
        if (H, W) == (t, t):
            return self.forward_window(x, task)
        pad_h, pad_w = max(0, t - H), max(0, t - W)
        if pad_h or pad_w:
            mode = "reflect" if pad_h < H and pad_w < W else "replicate"
            x = F.pad(x, (0, pad_w, 0, pad_h), mode=mode)
        y = forward_chop(partial(self.forward_window, task=task), x, t, scale, self.crop_batch_size)
        return y[..., : H * scale, : W * scale]


def _check_images(x: Tensor) -> None:
    if not isinstance(x, Tensor) or x.dim() != 4 or x.shape[1] != 3:
        shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(f"IPT expects RGB images of shape (B, 3, H, W) in [0, 1], got {shape}")
    if not x.is_floating_point():
        raise ValueError(f"IPT expects float images in [0, 1], got dtype {x.dtype} (divide 8-bit images by 255)")
    if x.numel() and not bool(torch.isfinite(x).all()):
        raise ValueError("IPT input contains NaN or infinite values")


# --------------------------------------------------------------------------- registered variants
_TAGS = ("restoration", "ipt")

#: settings of every registered IPT: the released files' layouts (option.py defaults) and a CPU-sized one
DEFAULT_CFGS: dict[str, ModelCfg] = {
    "ipt_sr_x2": ModelCfg(dict(tasks=("sr_x2",))),
    "ipt_sr_x3": ModelCfg(dict(tasks=("sr_x3",))),
    "ipt_sr_x4": ModelCfg(dict(tasks=("sr_x4",))),
    "ipt_denoise_sigma30": ModelCfg(dict(tasks=("denoise_sigma30",))),
    "ipt_denoise_sigma50": ModelCfg(dict(tasks=("denoise_sigma50",))),
    "ipt_derain": ModelCfg(dict(tasks=("derain",))),
    "ipt_pretrain": ModelCfg(dict(tasks=PRETRAIN_TASKS)),
    # 8 features x 4x4 patches = 128-dim tokens, 144 per 48x48 window, 2+2 layers: small enough for a
    # training step on one CPU core (cheaper than 16 features x 3x3 patches, 144-dim tokens; docs/record/speed.md)
    "ipt_tiny": ModelCfg(dict(tasks=("sr_x2",), n_feats=8, patch_dim=4, num_heads=4, num_layers=2)),
}


#: the registry-wide test's settings: 8 features (72-dim tokens of 3x3 patches), one layer each way, 2 heads
_TEST = dict(test_kwargs=dict(n_feats=8, num_layers=1, num_heads=2), test_image_size=(48, 48))


def _create(name: str, **kwargs) -> IPT:
    return build_ipt(IPT, DEFAULT_CFGS[name], **kwargs)


@register_model(filter_fn=convert_state_dict, tags=_TAGS, **_TEST)
def ipt_sr_x2(**kwargs) -> IPT:
    """IPT x2 super-resolution (IPT_sr2.pt; Set5 38.37 dB), 115.46 M parameters."""
    return _create("ipt_sr_x2", **kwargs)


@register_model(filter_fn=convert_state_dict, tags=_TAGS, **_TEST)
def ipt_sr_x3(**kwargs) -> IPT:
    """IPT x3 super-resolution (IPT_sr3.pt; Set5 34.81 dB), 115.65 M parameters."""
    return _create("ipt_sr_x3", **kwargs)


@register_model(filter_fn=convert_state_dict, tags=_TAGS, **_TEST)
def ipt_sr_x4(**kwargs) -> IPT:
    """IPT x4 super-resolution (IPT_sr4.pt; Set5 32.64 dB), 115.61 M parameters."""
    return _create("ipt_sr_x4", **kwargs)


@register_model(filter_fn=convert_state_dict, tags=_TAGS, **_TEST)
def ipt_denoise_sigma30(**kwargs) -> IPT:
    """IPT colour denoising, Gaussian sigma 30 (IPT_denoise30.pt), 115.31 M parameters."""
    return _create("ipt_denoise_sigma30", **kwargs)


@register_model(filter_fn=convert_state_dict, tags=_TAGS, **_TEST)
def ipt_denoise_sigma50(**kwargs) -> IPT:
    """IPT colour denoising, Gaussian sigma 50 (IPT_denoise50.pt; CBSD68 29.88 dB), 115.31 M parameters."""
    return _create("ipt_denoise_sigma50", **kwargs)


@register_model(filter_fn=convert_state_dict, tags=_TAGS, **_TEST)
def ipt_derain(**kwargs) -> IPT:
    """IPT deraining (IPT_derain.pt), 115.31 M parameters."""
    return _create("ipt_derain", **kwargs)


@register_model(filter_fn=convert_state_dict, tags=_TAGS, **_TEST)
def ipt_pretrain(**kwargs) -> IPT:
    """The pre-trained multi-task IPT (IPT_pretrain.pt): 6 heads/tails/queries, tasks :data:`PRETRAIN_TASKS`."""
    return _create("ipt_pretrain", **kwargs)


@register_model(filter_fn=convert_state_dict, tags=_TAGS, **_TEST)
def ipt_tiny(scale: int = 2, **kwargs) -> IPT:
    """A CPU-sized IPT (8 features, 4x4 patches: 144 tokens of 128 dims, 2+2 layers, 4 heads), 1.1 M
    parameters, for ``scale`` (1: a restoration task named ``"restore"``)."""
    return _create("ipt_tiny", scale=scale, **kwargs)
