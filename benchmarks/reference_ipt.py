"""The ORIGINAL IPT design (huawei-noah/Pretrained-IPT), re-implemented as the parity baseline.

The original repository cannot be imported here (it parses its command line at import), so this
module re-creates, from reading it, what visiontf's IPT must reproduce:

* :class:`OriginalIPT`: ``model/ipt.py`` with ``option.py``'s defaults: the module tree and its
  parameter names (``head.0.0.weight``, ``body.encoder.layers.0.self_attn.in_proj_weight``,
  ``body.position_encoding.position_ids``, ``tail.0.0.0.weight``, ...), so its ``state_dict()`` has
  the released files' key layout; sequence-first tensors and ``nn.MultiheadAttention(bias=False)``
  as the original calls it; inputs and outputs in 0-255.
* :func:`forward_chop` / :func:`forward_x8`: ``model/__init__.py``'s tiled inference (tiles of
  ``patch_size``, unfold stride ``patch_size // 4``, border strips ``cut_h`` / ``cut_w``, inner
  region averaged with a fold-of-ones divisor, ``crop_batch_size`` tiles per call) and its x8
  self-ensemble, for one image (batch 1, as the original's test loader).
* :func:`calc_psnr` / :func:`quantize`: ``utility.py``'s scoring.

``tests/test_ipt_model.py``, ``tests/test_ipt_tiling.py`` and ``tests/test_restoration_metrics.py``
compare visiontf against it.
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


# --------------------------------------------------------------------------- model/__init__.py
def _run(model: nn.Module, tiles: Tensor, batchsize: int) -> Tensor:
    n = tiles.size(0) // batchsize + (tiles.size(0) % batchsize != 0)
    return torch.cat([model(tiles[i * batchsize:(i + 1) * batchsize]) for i in range(n)], dim=0)


def _tiles(x: Tensor, kernel, stride: int) -> tuple[Tensor, int]:
    """unfold -> (L, C*k*k, 1) -> (L, C, k, k), as the original (batch 1)."""
    u = F.unfold(x, kernel, stride=stride).transpose(0, 2).contiguous()
    return u, u.size(0)


def _fold(y: Tensor, size, kernel, stride: int) -> Tensor:
    return F.fold(y.view(y.size(0), -1, 1).transpose(0, 2).contiguous(), size, kernel, stride=stride)


def _cut_h(model, x_h, w, w_cut, padsize, shave, scale, batchsize) -> Tensor:
    u, n = _tiles(x_h, padsize, int(shave / 2))
    y_u = _run(model, u.view(n, -1, padsize, padsize), batchsize)
    st = int(shave / 2 * scale)
    y = _fold(y_u, (padsize * scale, (w - w_cut) * scale), padsize * scale, st)
    y_u = y_u[..., :, st:padsize * scale - st].contiguous()
    k = (padsize * scale, padsize * scale - shave * scale)
    size = (padsize * scale, (w - w_cut - shave) * scale)
    inter = _fold(y_u, size, k, st)
    ones = torch.ones(inter.shape, dtype=inter.dtype)
    inter = inter / F.fold(F.unfold(ones, k, stride=st), size, k, stride=st)
    y[..., :, st:(w - w_cut) * scale - st] = inter
    return y


def _cut_w(model, x_w, h, h_cut, padsize, shave, scale, batchsize) -> Tensor:
    u, n = _tiles(x_w, padsize, int(shave / 2))
    y_u = _run(model, u.view(n, -1, padsize, padsize), batchsize)
    st = int(shave / 2 * scale)
    y = _fold(y_u, ((h - h_cut) * scale, padsize * scale), padsize * scale, st)
    y_u = y_u[..., st:padsize * scale - st, :].contiguous()
    k = (padsize * scale - shave * scale, padsize * scale)
    size = ((h - h_cut - shave) * scale, padsize * scale)
    inter = _fold(y_u, size, k, st)
    ones = torch.ones(inter.shape, dtype=inter.dtype)
    inter = inter / F.fold(F.unfold(ones, k, stride=st), size, k, stride=st)
    y[..., st:(h - h_cut) * scale - st, :] = inter
    return y


@torch.no_grad()
def forward_chop(model: OriginalIPT, x: Tensor, crop_batch_size: int = 64) -> Tensor:
    """``Model.forward_chop`` for one image (1, 3, h, w) in 0-255, h and w >= ``patch_size``."""
    batchsize = crop_batch_size
    h, w = x.size()[-2:]
    padsize = int(model.patch_size)
    shave = int(model.patch_size / 2)
    scale = model.scale[model.scale_idx]
    h_cut = (h - padsize) % int(shave / 2)
    w_cut = (w - padsize) % int(shave / 2)
    u, n = _tiles(x, padsize, int(shave / 2))
    y_hw_cut = model(x[..., h - padsize:, w - padsize:])
    y_h_cut = _cut_h(model, x[..., h - padsize:, :], w, w_cut, padsize, shave, scale, batchsize)
    y_w_cut = _cut_w(model, x[..., :, w - padsize:], h, h_cut, padsize, shave, scale, batchsize)
    y_h_top = _cut_h(model, x[..., :padsize, :], w, w_cut, padsize, shave, scale, batchsize)
    y_w_top = _cut_w(model, x[..., :, :padsize], h, h_cut, padsize, shave, scale, batchsize)
    y_u = _run(model, u.view(n, -1, padsize, padsize), batchsize)
    st = int(shave / 2 * scale)
    y = _fold(y_u, ((h - h_cut) * scale, (w - w_cut) * scale), padsize * scale, st)
    y[..., :padsize * scale, :] = y_h_top
    y[..., :, :padsize * scale] = y_w_top
    y_u = y_u[..., st:padsize * scale - st, st:padsize * scale - st].contiguous()
    k = padsize * scale - shave * scale
    size = ((h - h_cut - shave) * scale, (w - w_cut - shave) * scale)
    inter = _fold(y_u, size, k, st)
    ones = torch.ones(inter.shape, dtype=inter.dtype)
    inter = inter / F.fold(F.unfold(ones, k, stride=st), size, k, stride=st)
    y[..., st:(h - h_cut) * scale - st, st:(w - w_cut) * scale - st] = inter
    dh, dw = (padsize - h_cut) / 2 * scale, (padsize - w_cut) / 2 * scale
    y = torch.cat([y[..., :y.size(2) - int(dh), :], y_h_cut[..., int(dh + 0.5):, :]], dim=2)
    y_w_cat = torch.cat([y_w_cut[..., :y_w_cut.size(2) - int(dh), :], y_hw_cut[..., int(dh + 0.5):, :]], dim=2)
    return torch.cat([y[..., :, :y.size(3) - int(dw)], y_w_cat[..., :, int(dw + 0.5):]], dim=3)


@torch.no_grad()
def forward_x8(fn, x: Tensor) -> Tensor:
    """``Model.forward_x8``: 8 flips/transposes through ``fn``, undone, averaged (batch 1)."""

    def tf(v: Tensor, op: str) -> Tensor:
        a = v.cpu().numpy()
        if op == "v":
            a = a[:, :, :, ::-1].copy()
        elif op == "h":
            a = a[:, :, ::-1, :].copy()
        else:
            a = a.transpose((0, 1, 3, 2)).copy()
        return torch.tensor(a)

    xs = [x]
    for op in ("v", "h", "t"):
        xs.extend([tf(v, op) for v in xs])
    ys = [fn(v) for v in xs]
    for i in range(len(ys)):
        if i > 3:
            ys[i] = tf(ys[i], "t")
        if i % 4 > 1:
            ys[i] = tf(ys[i], "h")
        if (i % 4) % 2 == 1:
            ys[i] = tf(ys[i], "v")
    return torch.cat(ys, dim=0).mean(dim=0, keepdim=True)


# --------------------------------------------------------------------------- utility.py
def quantize(img: Tensor, rgb_range: float) -> Tensor:
    pixel_range = 255 / rgb_range
    return img.mul(pixel_range).clamp(0, 255).round().div(pixel_range)


def calc_psnr(sr: Tensor, hr: Tensor, scale: int, rgb_range: float, cal_type: str = "y") -> float:
    if hr.nelement() == 1:
        return 0
    diff = (sr - hr) / rgb_range
    if cal_type == "y":
        convert = diff.new_tensor([65.738, 129.057, 25.064]).view(1, 3, 1, 1) / 256
        diff = diff.mul(convert).sum(dim=1)
    valid = diff if scale == 1 else diff[..., scale:-scale, scale:-scale]
    mse = valid.pow(2).mean()
    return -10 * math.log10(mse)
