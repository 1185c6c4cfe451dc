"""IPT's original design (huawei-noah/Pretrained-IPT), written again in plain torch as a baseline and oracle.

The module tree, key layout and per-op maths of the original, in this project's own code:

* :class:`OriginalIPT`: ``model/ipt.py`` with ``option.py``'s defaults: the module tree and its
  parameter names (``head.0.0.weight``, ``body.encoder.layers.0.self_attn.in_proj_weight``,
  ``body.position_encoding.position_ids``, ``tail.0.0.0.weight``, ...), so its ``state_dict()`` has
  the released files' key layout; sequence-first tensors and ``nn.MultiheadAttention(bias=False)``
  as the original calls it; inputs and outputs in 0-255.
* :func:`forward_chop`: ``model/__init__.py``'s tiled inference (tiles of ``patch_size``, unfold
  stride ``patch_size // 4``, border strips ``cut_h`` / ``cut_w``, inner region averaged with a
  fold-of-ones divisor, ``crop_batch_size`` tiles per call), for one image (batch 1, as the
  original's test loader).

The original's own outputs are recorded at toy width in ``tests/fixtures/ipt`` (``scripts/fixtures/make_ipt.py``)
and are what the tests compare visiontf with; this module is the speed baseline of ``benchmarks/ipt.py`` and the
oracle of ``tests/models/ipt/test_ipt_tiling.py``'s sweep of sizes and scales at the published 48-pixel window.
"""
from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


# --------------------------------------------------------------------------- model/common.py
def _conv(cin: int, cout: int, k: int, bias: bool = True) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, k, padding=k // 2, bias=bias)


class MeanShift(nn.Conv2d):
    """1x1 conv, identity weight, bias ``sign * rgb_range * mean`` (std 1); frozen parameters."""

    def __init__(self, rgb_range: float, mean=(0.4488, 0.4371, 0.4040), sign: int = -1) -> None:
        super().__init__(3, 3, kernel_size=1)
        self.weight.data = torch.eye(3).view(3, 3, 1, 1)
        self.bias.data = sign * rgb_range * torch.tensor(mean)
        for p in self.parameters():
            p.requires_grad = False


class ResBlock(nn.Module):
    def __init__(self, n_feats: int, kernel_size: int) -> None:
        super().__init__()
        self.body = nn.Sequential(_conv(n_feats, n_feats, kernel_size), nn.ReLU(True), _conv(n_feats, n_feats, kernel_size))

    def forward(self, x: Tensor) -> Tensor:
        return self.body(x) + x


class Upsampler(nn.Sequential):
    def __init__(self, scale: int, n_feats: int) -> None:
        layers: list[nn.Module] = []
        if scale & (scale - 1) == 0:  # 1, 2, 4, 8: log2(scale) steps of x2 (none for 1)
            for _ in range(int(math.log(scale, 2))):
                layers += [_conv(n_feats, 4 * n_feats, 3), nn.PixelShuffle(2)]
        elif scale == 3:
            layers += [_conv(n_feats, 9 * n_feats, 3), nn.PixelShuffle(3)]
        else:
            raise NotImplementedError(scale)
        super().__init__(*layers)


# --------------------------------------------------------------------------- model/ipt.py
class EncoderLayer(nn.Module):
    def __init__(self, d: int, nhead: int, ffn: int) -> None:
        super().__init__()
        self.self_attn = nn.MultiheadAttention(d, nhead, dropout=0.0, bias=False)
        self.linear1 = nn.Linear(d, ffn)
        self.dropout = nn.Dropout(0.0)
        self.linear2 = nn.Linear(ffn, d)
        self.norm1 = nn.LayerNorm(d)
        self.norm2 = nn.LayerNorm(d)
        nn.init.kaiming_uniform_(self.self_attn.in_proj_weight, a=math.sqrt(5))

    def forward(self, src: Tensor, pos: Tensor | None = None) -> Tensor:
        h = self.norm1(src)
        qk = h if pos is None else h + pos
        src = src + self.self_attn(qk, qk, h)[0]
        return src + self.linear2(F.relu(self.linear1(self.norm2(src))))


class DecoderLayer(nn.Module):
    def __init__(self, d: int, nhead: int, ffn: int) -> None:
        super().__init__()
        self.self_attn = nn.MultiheadAttention(d, nhead, dropout=0.0, bias=False)
        self.multihead_attn = nn.MultiheadAttention(d, nhead, dropout=0.0, bias=False)
        self.linear1 = nn.Linear(d, ffn)
        self.dropout = nn.Dropout(0.0)
        self.linear2 = nn.Linear(ffn, d)
        self.norm1 = nn.LayerNorm(d)
        self.norm2 = nn.LayerNorm(d)
        self.norm3 = nn.LayerNorm(d)

    def forward(self, tgt: Tensor, memory: Tensor, pos: Tensor | None = None, query_pos: Tensor | None = None) -> Tensor:
        h = self.norm1(tgt)
        qk = h if query_pos is None else h + query_pos
        tgt = tgt + self.self_attn(qk, qk, value=h)[0]
        h = self.norm2(tgt)
        # the task query goes to the query only; the keys are memory (+ pos, None by default)
        q = h if query_pos is None else h + query_pos
        k = memory if pos is None else memory + pos
        tgt = tgt + self.multihead_attn(query=q, key=k, value=memory)[0]
        return tgt + self.linear2(F.relu(self.linear1(self.norm3(tgt))))


class _Stack(nn.Module):
    def __init__(self, layer: nn.Module, n: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(copy.deepcopy(layer) for _ in range(n))


class LearnedPositionalEncoding(nn.Module):
    def __init__(self, n: int, d: int) -> None:
        super().__init__()
        self.pe = nn.Embedding(n, d)
        self.seq_length = n
        self.register_buffer("position_ids", torch.arange(n).expand((1, -1)))

    def forward(self) -> Tensor:
        return self.pe(self.position_ids[:, : self.seq_length])  # (1, N, D)


class VisionTransformer(nn.Module):
    """The body: 3x3 patches of the 48x48 feature map as 256 tokens, 12+12 pre-norm layers."""

    def __init__(self, img_dim: int, patch_dim: int, num_channels: int, num_heads: int, num_layers: int, num_queries: int) -> None:
        super().__init__()
        self.img_dim, self.patch_dim = img_dim, patch_dim
        self.embedding_dim = d = num_channels * patch_dim * patch_dim
        self.flatten_dim = d
        self.seq_length = n = (img_dim // patch_dim) ** 2
        hidden = 4 * d
        self.linear_encoding = nn.Linear(d, d)
        self.mlp_head = nn.Sequential(nn.Linear(d, hidden), nn.Dropout(0.0), nn.ReLU(), nn.Linear(hidden, d), nn.Dropout(0.0))
        self.query_embed = nn.Embedding(num_queries, d * n)
        self.encoder = _Stack(EncoderLayer(d, num_heads, hidden), num_layers)
        self.decoder = _Stack(DecoderLayer(d, num_heads, hidden), num_layers)
        self.position_encoding = LearnedPositionalEncoding(n, d)
        self.dropout_layer1 = nn.Dropout(0.0)

    def forward(self, x: Tensor, query_idx: int) -> Tensor:
        p = self.patch_dim
        x = F.unfold(x, p, stride=p).transpose(1, 2).transpose(0, 1).contiguous()  # (N, B, D)
        x = self.dropout_layer1(self.linear_encoding(x)) + x
        query = self.query_embed.weight[query_idx].view(-1, 1, self.embedding_dim).repeat(1, x.size(1), 1)
        pos = self.position_encoding().transpose(0, 1)  # (N, 1, D)
        x = x + pos  # once, before the encoder (pos_every False)
        for layer in self.encoder.layers:
            x = layer(x)
        memory = x  # decoder(x, x): tgt and memory are the encoder's output; memory stays fixed
        for layer in self.decoder.layers:
            x = layer(x, memory, query_pos=query)
        x = self.mlp_head(x) + x
        x = x.transpose(0, 1).contiguous().view(x.size(1), -1, self.flatten_dim)
        return F.fold(x.transpose(1, 2).contiguous(), self.img_dim, p, stride=p)


class OriginalIPT(nn.Module):
    """``ipt(args)``: one head/tail per entry of ``scales``, ``num_queries`` task queries; 0-255 in and out."""

    def __init__(self, scales=(2,), n_feats: int = 64, patch_size: int = 48, patch_dim: int = 3, num_heads: int = 12,
                 num_layers: int = 12, num_queries: int = 1, rgb_range: float = 255) -> None:
        super().__init__()
        self.scale = list(scales)
        self.patch_size = patch_size
        self.scale_idx = 0
        self.sub_mean = MeanShift(rgb_range)
        self.add_mean = MeanShift(rgb_range, sign=1)
        self.head = nn.ModuleList(
            nn.Sequential(_conv(3, n_feats, 3), ResBlock(n_feats, 5), ResBlock(n_feats, 5)) for _ in scales
        )
        self.body = VisionTransformer(patch_size, patch_dim, n_feats, num_heads, num_layers, num_queries)
        self.tail = nn.ModuleList(nn.Sequential(Upsampler(s, n_feats), _conv(n_feats, 3, 3)) for s in scales)

    def set_scale(self, idx: int) -> None:
        self.scale_idx = idx

    def forward(self, x: Tensor) -> Tensor:
        x = self.head[self.scale_idx](self.sub_mean(x))
        res = self.body(x, self.scale_idx) + x
        return self.add_mean(self.tail[self.scale_idx](res))


# --------------------------------------------------------------------------- model/__init__.py (tiling)
def _windows(model: nn.Module, x: Tensor, corners: list[tuple[int, int]], tile: int, per_call: int) -> list[Tensor]:
    """The network's output for the ``tile`` x ``tile`` window of ``x`` at each (top, left), ``per_call`` at a time."""
    crops = torch.cat([x[..., top : top + tile, left : left + tile] for top, left in corners])
    return list(torch.cat([model(part) for part in crops.split(per_call)]))


def _compose(outs: list[Tensor], tops: list[int], lefts: list[int], scale: int, margin: int) -> Tensor:
    """Windows laid out row by row (``tops`` x ``lefts``, input pixels) into one output map: each window keeps
    its centre, ``margin`` output pixels cut on every side that is not the map's own edge, and where kept parts
    overlap their mean is taken."""
    size = outs[0].shape[-1]
    height, width = (tops[-1] * scale + size), (lefts[-1] * scale + size)
    total = outs[0].new_zeros((outs[0].shape[0], height, width))
    count = outs[0].new_zeros((1, height, width))
    for n, out in enumerate(outs):
        i, j = divmod(n, len(lefts))
        y0, x0 = tops[i] * scale, lefts[j] * scale
        a = 0 if i == 0 else margin
        b = size if i == len(tops) - 1 else size - margin
        c = 0 if j == 0 else margin
        d = size if j == len(lefts) - 1 else size - margin
        total[:, y0 + a : y0 + b, x0 + c : x0 + d] += out[:, a:b, c:d]
        count[:, y0 + a : y0 + b, x0 + c : x0 + d] += 1
    return total / count


@torch.no_grad()
def forward_chop(model: OriginalIPT, x: Tensor, crop_batch_size: int = 64) -> Tensor:
    """The original ``Model.forward_chop`` for one image (1, 3, h, w) in 0-255, h and w >= ``patch_size`` (a multiple
    of 4), in this module's own terms:

    * windows of ``patch_size`` every quarter window from the top-left (the grid stops short of the bottom and
      right edges by ``(h - tile) % step`` pixels), laid out by :func:`_compose`; its top-left band of
      ``margin`` rows over the first ``tile`` columns comes from the first window alone;
    * a row of windows flush with the bottom edge, a column flush with the right edge and the corner window,
      each laid out the same way, replace the grid's output from ``(tile - cut) / 2 * scale`` pixels before
      the edge (the part before rounded down, the strip's start rounded up);
    * the first row and column of windows are run a second time, as the original computes them for its top
      and left strips (same values: only the cost of this speed baseline is the original's).
    """
    tile, scale = int(model.patch_size), model.scale[model.scale_idx]
    step = tile // 4
    margin, out_tile = step * scale, tile * scale
    h, w = x.shape[-2:]
    tops, lefts = list(range(0, h - tile + 1, step)), list(range(0, w - tile + 1, step))
    outs = _windows(model, x, [(t, c) for t in tops for c in lefts], tile, crop_batch_size)
    grid = _compose(outs, tops, lefts, scale, margin)
    grid[:, :margin, :out_tile] = outs[0][:, :margin, :]
    _windows(model, x, [(0, c) for c in lefts], tile, crop_batch_size)
    _windows(model, x, [(t, 0) for t in tops], tile, crop_batch_size)
    bottom = _compose(_windows(model, x, [(h - tile, c) for c in lefts], tile, crop_batch_size), [0], lefts, scale, margin)
    right = _compose(_windows(model, x, [(t, w - tile) for t in tops], tile, crop_batch_size), tops, [0], scale, margin)
    corner = model(x[..., h - tile :, w - tile :])[0]
    cut_rows = (tile - (h - tile) % step) * scale / 2
    cut_cols = (tile - (w - tile) % step) * scale / 2
    split_y, split_x = grid.shape[-2] - int(cut_rows), grid.shape[-1] - int(cut_cols)
    skip_y, skip_x = int(cut_rows + 0.5), int(cut_cols + 0.5)
    out = x.new_zeros((1, grid.shape[0], h * scale, w * scale))
    out[0, :, :split_y, :split_x] = grid[:, :split_y, :split_x]
    out[0, :, split_y:, :split_x] = bottom[:, skip_y:, :split_x]
    out[0, :, :split_y, split_x:] = right[:, :split_y, skip_x:]
    out[0, :, split_y:, split_x:] = corner[:, skip_y:, skip_x:]
    return out
