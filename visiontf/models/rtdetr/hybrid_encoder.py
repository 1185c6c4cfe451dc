"""RT-DETR's hybrid encoder (Zhao et al., CVPR 2024, sec. 4.2): AIFI and CCFM.

* The backbone's maps (strides 8, 16, 32) are projected to ``hidden_dim`` channels (1x1 convolution, BatchNorm).
* AIFI (attention-based intra-scale feature interaction): a post-norm transformer encoder (visiontf's
  :class:`~visiontf.nn.TransformerEncoderLayer`, GELU) over the positions of the coarsest map only, with a
  fixed 2-d sine-cosine position embedding (:func:`sincos_position_embedding`).
* CCFM (CNN-based cross-scale feature fusion): a top-down pass (a 1x1 lateral convolution of the coarser
  map, nearest 2x upsampling, concatenation with the finer map, a CSPRep block) and a bottom-up pass (a
  3x3 stride-2 convolution of the finer result, concatenation with the top-down map, a CSPRep block). A
  CSPRep block (:class:`CSPRepLayer`) is two 1x1 branches, one through RepVGG blocks (a 3x3 and a 1x1
  convolution with BatchNorm, summed, SiLU), added, and a 1x1 projection back when the hidden width
  differs. Every convolution has no bias and is followed by BatchNorm.

D-FINE (Peterande/D-FINE, ``src/zoo/dfine/hybrid_encoder.py``) keeps AIFI and the two passes and changes three parts,
each an option of :class:`~visiontf.models.rtdetr.rtdetr_options.EncoderOptions` here:

* ``fusion_block="elan"``: the fusion blocks are CSP-ELAN blocks (:class:`CSPELANLayer`, its ``RepNCSPELAN4``: a 1x1
  convolution to twice the width, split in halves; the second half goes through two branches in a chain, each a
  CSPRep block and a 3x3 convolution at a narrower branch width; both halves and both branch outputs are
  concatenated and projected back by a 1x1 convolution);
* ``lateral_act=False``: the lateral 1x1 convolutions are linear (convolution and BatchNorm only);
* ``downsample="scdown"``: the bottom-up downsampling is YOLOv10's SCDown (:class:`SCDown`: a 1x1 convolution, then
  a depthwise 3x3 stride-2 one, both linear) instead of a 3x3 stride-2 convolution with SiLU.

Names follow the original's key layout where the structure is the same (``lateral_convs``, ``fpn_blocks``,
``downsample_convs``, ``pan_blocks``, each convolution a ``conv`` / ``norm`` pair; D-FINE's blocks' ``cv1``..``cv4``),
so that its checkpoints map onto them one to one (:mod:`visiontf.models.rtdetr.convert`,
:mod:`visiontf.models.dfine.convert`).
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from visiontf.models.rtdetr.rtdetr_options import EncoderOptions
from visiontf.nn import TransformerEncoderLayer
from visiontf.nn.ms_deform_tables import tracing_shapes

__all__ = ["CSPELANLayer", "CSPRepLayer", "ConvNormAct", "HybridEncoder", "RepVggBlock", "SCDown", "activation",
           "original_table_dtype", "sincos_position_embedding"]


def activation(name: str | None) -> nn.Module:
    """``"relu"``, ``"gelu"``, ``"silu"`` or None (identity)."""
    if name is None:
        return nn.Identity()
    table = {"relu": nn.ReLU, "gelu": nn.GELU, "silu": nn.SiLU}
    if name not in table:
        raise ValueError(f"activation must be one of {sorted(table)} or None, got {name!r}")
    return table[name]()


class ConvNormAct(nn.Sequential):
    """A bias-free convolution ("same" padding for odd kernels; ``groups`` as nn.Conv2d's), BatchNorm and an optional
    activation."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1, act: str | None = None,
                 groups: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, stride, padding=(kernel_size - 1) // 2, groups=groups, bias=False)
        self.norm = nn.BatchNorm2d(out_channels)
        if act is not None:
            self.act = activation(act)


class RepVggBlock(nn.Module):
    """``act(conv3x3_bn(x) + conv1x1_bn(x))`` (RepVGG's training form; :meth:`fuse` folds it into one 3x3 convolution)."""

    def __init__(self, channels: int, act: str = "silu") -> None:
        super().__init__()
        self.conv1 = ConvNormAct(channels, channels, 3)
        self.conv2 = ConvNormAct(channels, channels, 1)
        self.act = activation(act)
        self.fused: nn.Conv2d | None = None

    def forward(self, x: Tensor) -> Tensor:
        if self.fused is not None:
            return self.act(self.fused(x))
        return self.act(self.conv1(x) + self.conv2(x))

    @torch.no_grad()
    def fuse(self) -> None:
        """Fold both branches and their BatchNorms (running statistics) into one 3x3 convolution with a bias,
        for inference; training afterwards would train the fused one (call it on a model in eval mode)."""
        if self.conv1 is None:  # already fused, its branches dropped (HybridEncoder.fuse_for_inference)
            return
        weight, bias = 0, 0
        for branch in (self.conv1, self.conv2):
            norm = branch.norm
            scale = norm.weight / (norm.running_var + norm.eps).sqrt()
            kernel = branch.conv.weight * scale.view(-1, 1, 1, 1)
            pad = (3 - kernel.shape[-1]) // 2
            weight = weight + F.pad(kernel, (pad, pad, pad, pad))
            bias = bias + norm.bias - norm.running_mean * scale
        conv = self.conv1.conv
        self.fused = nn.Conv2d(conv.in_channels, conv.out_channels, 3, padding=1).to(conv.weight)
        self.fused.weight.copy_(weight)
        self.fused.bias.copy_(bias)


class CSPRepLayer(nn.Module):
    """Cross-stage partial block of RepVGG blocks: ``conv3(blocks(conv1(x)) + conv2(x))``."""

    def __init__(self, in_channels: int, out_channels: int, num_blocks: int = 3, expansion: float = 1.0, act: str = "silu") -> None:
        super().__init__()
        hidden = int(out_channels * expansion)
        self.conv1 = ConvNormAct(in_channels, hidden, 1, act=act)
        self.conv2 = ConvNormAct(in_channels, hidden, 1, act=act)
        self.bottlenecks = nn.Sequential(*[RepVggBlock(hidden, act) for _ in range(num_blocks)])
        self.conv3 = ConvNormAct(hidden, out_channels, 1, act=act) if hidden != out_channels else nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        return self.conv3(self.bottlenecks(self.conv1(x)) + self.conv2(x))


class CSPELANLayer(nn.Module):
    """D-FINE's fusion block (its ``RepNCSPELAN4``): ``cv4(cat[a, b, c, d])`` with ``a, b`` the halves of ``cv1(x)``,
    ``c = cv2(b)`` and ``d = cv3(c)``; ``cv2`` and ``cv3`` are each a CSPRep block and a 3x3 convolution at
    ``branch`` channels.

    Args:
        in_channels, out_channels: of the block.
        hidden: ``cv1``'s width (twice the encoder's width in D-FINE), split in two halves.
        branch: the branches' width (D-FINE: ``round(expansion * hidden_dim // 2)``).
        num_blocks: RepVGG blocks in each branch's CSPRep block.
        act: every convolution's activation.
    """

    def __init__(self, in_channels: int, out_channels: int, hidden: int, branch: int, num_blocks: int, act: str = "silu") -> None:
        super().__init__()
        if hidden % 2:
            raise ValueError(f"CSPELANLayer splits its hidden width in halves: give an even width, got {hidden}")
        self.cv1 = ConvNormAct(in_channels, hidden, 1, act=act)
        self.cv2 = nn.Sequential(CSPRepLayer(hidden // 2, branch, num_blocks, 1.0, act), ConvNormAct(branch, branch, 3, act=act))
        self.cv3 = nn.Sequential(CSPRepLayer(branch, branch, num_blocks, 1.0, act), ConvNormAct(branch, branch, 3, act=act))
        self.cv4 = ConvNormAct(hidden + 2 * branch, out_channels, 1, act=act)

    def forward(self, x: Tensor) -> Tensor:
        first, second = self.cv1(x).chunk(2, 1)
        one = self.cv2(second)
        return self.cv4(torch.cat([first, second, one, self.cv3(one)], 1))


class SCDown(nn.Module):
    """YOLOv10's spatial-channel decoupled downsampling, as D-FINE uses it: a linear 1x1 convolution, then a linear
    depthwise ``kernel_size`` convolution of stride ``stride`` (each with BatchNorm)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int = 3, stride: int = 2) -> None:
        super().__init__()
        self.cv1 = ConvNormAct(in_channels, out_channels, 1)
        self.cv2 = ConvNormAct(out_channels, out_channels, kernel_size, stride, groups=out_channels)

    def forward(self, x: Tensor) -> Tensor:
        return self.cv2(self.cv1(x))


def _sincos_values(height, width, dim: int, temperature: float, layout: str, dtype: torch.dtype) -> Tensor:
    """The table of :func:`sincos_position_embedding`; ``height`` and ``width`` are ints, or traced 0-dim tensors
    while a graph is exported (the table then follows the input's size)."""
    quarter = dim // 4
    t = torch.arange(height * width)
    if layout == "original":
        # RT-DETR's build_2d_sincos_position_embedding, float32: its meshgrid of (w, h) with "ij" indexing flattens
        # column-major, so token t (row-major: y * W + x) gets the coordinates (t // H, t % H) - on a square map
        # (the published training size) the embedding of (y, x)
        omega = 1.0 / temperature ** (torch.arange(quarter, dtype=torch.float32) / quarter)
        first, second = (t // height).float(), (t % height).float()
    else:
        # transformers' build_2d_sinusoidal_position_embedding: row-major (y, x), computed in float64
        omega = 1.0 / temperature ** (torch.arange(quarter, dtype=torch.float64) / quarter)
        first, second = (t // width).double(), (t % width).double()
    a, b = first[:, None] * omega[None], second[:, None] * omega[None]
    table = torch.cat([a.sin(), a.cos(), b.sin(), b.cos()], dim=1)[None]
    return table if layout == "original" else table.to(dtype)


@functools.lru_cache(maxsize=32)
def _sincos_table(height: int, width: int, dim: int, temperature: float, layout: str, dtype: torch.dtype) -> Tensor:
    return _sincos_values(height, width, dim, temperature, layout, dtype)


def sincos_position_embedding(height: int, width: int, dim: int, temperature: float = 10000.0, layout: str = "original",
                              dtype: torch.dtype = torch.float32, device: torch.device | None = None) -> Tensor:
    """(1, H * W, dim) fixed 2-d sine-cosine embedding of a row-major flattened H x W map: per token, the sines and
    cosines of two coordinates at ``dim / 4`` frequencies ``temperature^(-i / (dim / 4))``.

    ``layout="original"`` is RT-DETR's (float32; its coordinates are the token's row and column only on square
    maps, see :func:`_sincos_table`); ``"transformers"`` is transformers' row-major (y, x) in float64, cast to
    ``dtype``. The two agree on square maps up to float32 rounding.
    """
    if dim % 4:
        raise ValueError(f"the 2-d sine-cosine embedding needs a hidden_dim divisible by 4, got {dim}")
    key_dtype = torch.float32 if layout == "original" else dtype
    if tracing_shapes():  # ONNX export: computed in the graph from the traced size, not a constant of the export size
        table = _sincos_values(height, width, int(dim), float(temperature), layout, key_dtype).to(device)
    else:
        table = _sincos_table(int(height), int(width), int(dim), float(temperature), layout, key_dtype).to(device)
    return table.to(dtype) if layout == "original" and original_table_dtype(dtype, table.device) != torch.float32 else table


def original_table_dtype(dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The dtype of the originals' fixed tables (position embedding, anchors) for a model running in ``dtype``:
    float32, as the originals compute them, but in a model cast to bf16 or fp16 without autocast, where a float32
    table would promote the tokens to float32 before the model's half-precision layers (under autocast, and for
    float64 tokens, the float32 values are kept)."""
    half = dtype.is_floating_point and torch.finfo(dtype).bits < 32
    return dtype if half and not torch.is_autocast_enabled(device.type) else torch.float32


class HybridEncoder(nn.Module):
    """AIFI on ``aifi_levels`` and CCFM over all levels; (B, C_l, H_l, W_l) maps -> ``hidden_dim``-channel maps.

    Args:
        in_channels: channels of the backbone's maps, finest first.
        options: :class:`~visiontf.models.rtdetr.rtdetr_options.EncoderOptions`.
        tables: ``"original"`` or ``"transformers"``: the position embedding's layout and precision (see
            :func:`sincos_position_embedding`).
    """

    def __init__(self, in_channels: list[int], options: EncoderOptions, tables: str = "original") -> None:
        super().__init__()
        d = options.hidden_dim
        levels = len(in_channels)
        if any(not 0 <= i < levels for i in options.aifi_levels):
            one = ("; a backbone of one map (a plain ViT) gives the encoder nothing to fuse: use its simple feature pyramid, "
                   "backbone: {name: 'simplefpn:<the ViT>', kwargs: {top_block: false}} (strides 8, 16, 32)") if levels == 1 else ""
            fix = "" if levels == 1 else (f" (0..{levels - 1}, finest first: the originals' AIFI on the coarsest level is "
                                          f"encoder.aifi_levels: [{levels - 1}])")
            raise ValueError(f"encoder aifi_levels {options.aifi_levels} must index the {levels} backbone levels{fix}{one}")
        self.options, self.tables = options, tables
        self.input_proj = nn.ModuleList(ConvNormAct(c, d, 1) for c in in_channels)
        self.aifi = nn.ModuleList(
            nn.ModuleList(TransformerEncoderLayer(d, options.nhead, options.dim_feedforward, dropout=options.dropout,
                                                  attn_drop=options.dropout, norm_first=False, act_layer=type(activation(options.activation)),
                                                  norm_eps=1e-5)
                          for _ in range(options.num_layers))
            for _ in options.aifi_levels)
        blocks = round(3 * options.depth_mult)
        act = options.fusion_act
        self.lateral_convs = nn.ModuleList(ConvNormAct(d, d, 1, act=act if options.lateral_act else None) for _ in range(levels - 1))
        self.fpn_blocks = nn.ModuleList(self._fusion_block(d, blocks) for _ in range(levels - 1))
        self.downsample_convs = nn.ModuleList(SCDown(d, d, 3, 2) if options.downsample == "scdown" else ConvNormAct(d, d, 3, 2, act=act)
                                              for _ in range(levels - 1))
        self.pan_blocks = nn.ModuleList(self._fusion_block(d, blocks) for _ in range(levels - 1))

    def _fusion_block(self, d: int, blocks: int) -> nn.Module:
        """A block fusing two concatenated ``d``-channel maps into one: RT-DETR's CSPRep or D-FINE's CSP-ELAN."""
        options = self.options
        if options.fusion_block == "elan":
            return CSPELANLayer(2 * d, d, 2 * d, round(options.expansion * d // 2), blocks, options.fusion_act)
        return CSPRepLayer(2 * d, d, blocks, options.expansion, options.fusion_act)

    def forward(self, maps: list[Tensor]) -> list[Tensor]:
        feats = [proj(x) for proj, x in zip(self.input_proj, maps)]
        for layers, level in zip(self.aifi, self.options.aifi_levels):
            x = feats[level]
            B, C, H, W = x.shape
            tokens = x.flatten(2).transpose(1, 2)
            pos = sincos_position_embedding(H, W, C, self.options.pe_temperature, self.tables, tokens.dtype, tokens.device)
            for layer in layers:
                tokens = layer(tokens, pos)[0]
            feats[level] = tokens.transpose(1, 2).reshape(B, C, H, W).contiguous()
        # top-down: the coarsest map, laterally projected, upsampled and fused with each finer one
        top_down = [feats[-1]]
        for i, level in enumerate(range(len(feats) - 1, 0, -1)):
            coarse = self.lateral_convs[i](top_down[0])
            top_down[0] = coarse
            fused = self.fpn_blocks[i](torch.cat([F.interpolate(coarse, scale_factor=2.0, mode="nearest"), feats[level - 1]], 1))
            top_down.insert(0, fused)
        # bottom-up: each result downsampled and fused with the next coarser top-down map
        outs = [top_down[0]]
        for i in range(len(feats) - 1):
            down = self.downsample_convs[i](outs[-1])
            outs.append(self.pan_blocks[i](torch.cat([down, top_down[i + 1]], 1)))
        return outs

    def fuse_repvgg(self) -> int:
        """Fold every RepVGG block into one convolution (inference); returns how many."""
        blocks = [m for m in self.modules() if isinstance(m, RepVggBlock) and m.conv1 is not None]
        for block in blocks:
            block.fuse()
        return len(blocks)

    def fuse_for_inference(self) -> int:
        """Inference form: every RepVGG block one 3x3 convolution (its two branches dropped) and every other BatchNorm
        folded into its convolution (:func:`~visiontf.nn.fold_bn.fold_batchnorms`); returns the folds made (0 when
        called again). The outputs equal the unfused encoder's up to float rounding; training it is not meant."""
        from visiontf.nn.fold_bn import fold_batchnorms

        folded = self.fuse_repvgg()
        for block in self.modules():
            if isinstance(block, RepVggBlock) and block.fused is not None:
                block.conv1 = block.conv2 = None  # the fused convolution replaces both branches
        return folded + fold_batchnorms(self)
