"""A plain baseline of VQGAN's original design (CompVis/taming-transformers), for ``benchmarks/vqgan.py``.

What visiontf computes is checked against the original's own outputs (``tests/fixtures/vqgan``, written by
``scripts/fixtures/make_vqgan.py`` from a checkout); this module is the speed baseline: the same module tree
and key layout, computed the way the original does it where that costs time or memory:

* :class:`OriginalVQModel`: encoder / quantiser / decoder with the published key layout (``encoder.down.{i}``,
  ``decoder.up.{i}`` indexed by resolution level, ``mid.{block_1, attn_1, block_2}``), single-head attention
  over the HW positions with the full attention matrix (no fused kernel), nearest-code search by the
  expanded squared distance, ``legacy`` placement of beta;
* :class:`GPT`: minGPT's layout (``tok_emb``, ``pos_emb``, ``blocks.{i}.{ln1, ln2, attn.{key, query, value,
  proj, mask}, mlp}``, ``ln_f``, ``head``), attention through an explicit masked softmax, and
  ``forward_with_past`` whose key/value cache grows by concatenation every step;
* :func:`sample_with_past` (cached) and :func:`sample` (reruns the whole sequence every step), drawing one
  ``torch.multinomial`` sample per step from the global generator, as taming's samplers do.

Written for this project from the published architecture; no code of the original is in it.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def _swish(x: Tensor) -> Tensor:
    return x * torch.sigmoid(x)


def _group_norm(channels: int) -> nn.GroupNorm:
    """taming normalises with 32 groups, eps 1e-6, affine."""
    return nn.GroupNorm(32, channels, eps=1e-6)


def _conv3(cin: int, cout: int, stride: int = 1, padding: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, 3, stride, padding)


class ResnetBlock(nn.Module):
    """norm1 -> swish -> conv1 -> norm2 -> swish -> conv2, plus the input (a 1x1 ``nin_shortcut`` when widths differ)."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.norm1, self.conv1 = _group_norm(cin), _conv3(cin, cout)
        self.norm2, self.conv2 = _group_norm(cout), _conv3(cout, cout)
        if cin != cout:
            self.nin_shortcut = nn.Conv2d(cin, cout, 1)

    def forward(self, x: Tensor) -> Tensor:
        residual = self.conv2(_swish(self.norm2(self.conv1(_swish(self.norm1(x))))))
        skip = self.nin_shortcut(x) if hasattr(self, "nin_shortcut") else x
        return skip + residual


class AttnBlock(nn.Module):
    """Single-head self-attention over the feature map with 1x1 convs, the HW x HW weights materialised."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.norm = _group_norm(channels)
        self.q, self.k, self.v, self.proj_out = (nn.Conv2d(channels, channels, 1) for _ in range(4))

    def forward(self, x: Tensor) -> Tensor:
        n, c, height, width = x.shape
        normed = self.norm(x)
        queries, keys, values = (conv(normed).flatten(2) for conv in (self.q, self.k, self.v))  # (n, c, hw)
        scores = torch.einsum("nci,ncj->nij", queries, keys) / math.sqrt(c)
        mixed = torch.einsum("nij,ncj->nci", scores.softmax(dim=-1), values)
        return x + self.proj_out(mixed.reshape(n, c, height, width))


class Downsample(nn.Module):
    """Zero padding on the right and bottom only, then a stride-2 3x3 conv without padding."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = _conv3(channels, channels, stride=2, padding=0)

    def forward(self, x: Tensor) -> Tensor:
        return self.conv(F.pad(x, (0, 1, 0, 1)))


class Upsample(nn.Module):
    """Nearest-neighbour x2, then a 3x3 conv."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = _conv3(channels, channels)

    def forward(self, x: Tensor) -> Tensor:
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


def _level(widths: list[tuple[int, int]], with_attn: bool) -> nn.Module:
    """One resolution level: ``block`` (ResNet blocks over ``widths``) and ``attn`` (one per block, or none)."""
    level = nn.Module()
    level.block = nn.ModuleList(ResnetBlock(a, b) for a, b in widths)
    level.attn = nn.ModuleList(AttnBlock(b) for _, b in widths) if with_attn else nn.ModuleList()
    return level


def _middle(channels: int) -> nn.Module:
    mid = nn.Module()
    mid.block_1, mid.attn_1, mid.block_2 = ResnetBlock(channels, channels), AttnBlock(channels), ResnetBlock(channels, channels)
    return mid


def _run_level(level: nn.Module, h: Tensor) -> Tensor:
    for i, block in enumerate(level.block):
        h = block(h)
        if len(level.attn):
            h = level.attn[i](h)
    return h


def _run_middle(mid: nn.Module, h: Tensor) -> Tensor:
    return mid.block_2(mid.attn_1(mid.block_1(h)))


class Encoder(nn.Module):
    def __init__(self, ch: int, ch_mult, num_res_blocks: int, attn_resolutions, resolution: int, z_channels: int,
                 in_channels: int = 3, double_z: bool = False, **_unused) -> None:
        super().__init__()
        widths = [ch * m for m in ch_mult]
        self.conv_in = _conv3(in_channels, ch)
        self.down = nn.ModuleList()
        side, cin = resolution, ch
        for i, cout in enumerate(widths):
            level = _level([(cin if j == 0 else cout, cout) for j in range(num_res_blocks)], side in attn_resolutions)
            if i < len(widths) - 1:
                level.downsample = Downsample(cout)
                side //= 2
            self.down.append(level)
            cin = cout
        self.mid = _middle(cin)
        self.norm_out = _group_norm(cin)
        self.conv_out = _conv3(cin, z_channels * (2 if double_z else 1))

    def forward(self, x: Tensor) -> Tensor:
        h = self.conv_in(x)
        for level in self.down:
            h = _run_level(level, h)
            if hasattr(level, "downsample"):
                h = level.downsample(h)
        return self.conv_out(_swish(self.norm_out(_run_middle(self.mid, h))))


class Decoder(nn.Module):
    def __init__(self, ch: int, ch_mult, num_res_blocks: int, attn_resolutions, resolution: int, z_channels: int,
                 out_ch: int = 3, **_unused) -> None:
        super().__init__()
        widths = [ch * m for m in ch_mult]
        top = len(widths) - 1
        cin = widths[top]
        self.conv_in = _conv3(z_channels, cin)
        self.mid = _middle(cin)
        levels: dict[int, nn.Module] = {}
        side = resolution // 2**top
        for i in range(top, -1, -1):  # built from the lowest resolution up, stored by level index
            cout = widths[i]
            level = _level([(cin if j == 0 else cout, cout) for j in range(num_res_blocks + 1)], side in attn_resolutions)
            if i > 0:
                level.upsample = Upsample(cout)
                side *= 2
            levels[i] = level
            cin = cout
        self.up = nn.ModuleList(levels[i] for i in range(len(widths)))
        self.norm_out = _group_norm(cin)
        self.conv_out = _conv3(cin, out_ch)

    def forward(self, z: Tensor) -> Tensor:
        h = _run_middle(self.mid, self.conv_in(z))
        for level in reversed(self.up):
            h = _run_level(level, h)
            if hasattr(level, "upsample"):
                h = level.upsample(h)
        return self.conv_out(_swish(self.norm_out(h)))


class VectorQuantizer2(nn.Module):
    """Nearest code by |z|^2 + |e|^2 - 2 z.e, straight-through, ``legacy`` loss |sg[zq] - z|^2 + beta |zq - sg[z]|^2."""

    def __init__(self, n_e: int, e_dim: int, beta: float = 0.25) -> None:
        super().__init__()
        self.beta = beta
        self.embedding = nn.Embedding(n_e, e_dim)
        nn.init.uniform_(self.embedding.weight, -1.0 / n_e, 1.0 / n_e)

    def forward(self, z: Tensor):
        book = self.embedding.weight
        flat = z.movedim(1, -1).reshape(-1, book.shape[1])
        dist = flat.pow(2).sum(1, keepdim=True) + book.pow(2).sum(1) - 2 * flat @ book.T
        idx = dist.argmin(dim=1)
        picked = book[idx].view(z.shape[0], z.shape[2], z.shape[3], -1).movedim(-1, 1)
        loss = F.mse_loss(picked.detach(), z) + self.beta * F.mse_loss(picked, z.detach())
        return z + (picked - z).detach(), loss, (None, None, idx)


class OriginalVQModel(nn.Module):
    """The first stage: ``encode`` -> (quantised latent, codebook loss, (None, None, indices)), ``forward`` ->
    (reconstruction, codebook loss). ``with_loss=True`` adds a few ``loss.*`` tensors, as training checkpoints hold."""

    def __init__(self, ddconfig: dict, n_embed: int, embed_dim: int, with_loss: bool = False) -> None:
        super().__init__()
        self.encoder = Encoder(**ddconfig)
        self.decoder = Decoder(**ddconfig)
        if with_loss:
            self.loss = nn.Module()
            self.loss.discriminator = nn.Sequential(nn.Conv2d(3, 8, 4, 2, 1), nn.BatchNorm2d(8))
        self.quantize = VectorQuantizer2(n_embed, embed_dim)
        self.quant_conv = nn.Conv2d(ddconfig["z_channels"], embed_dim, 1)
        self.post_quant_conv = nn.Conv2d(embed_dim, ddconfig["z_channels"], 1)

    def encode(self, x: Tensor):
        return self.quantize(self.quant_conv(self.encoder(x)))

    def decode(self, quant: Tensor) -> Tensor:
        return self.decoder(self.post_quant_conv(quant))

    def forward(self, x: Tensor):
        quant, loss, _ = self.encode(x)
        return self.decode(quant), loss


# --------------------------------------------------------------------------------------------- minGPT
class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int, block_size: int, n_unmasked: int = 0) -> None:
        super().__init__()
        self.n_head = n_head
        self.key, self.query, self.value, self.proj = (nn.Linear(n_embd, n_embd) for _ in range(4))
        allowed = torch.ones(block_size, block_size).tril()
        allowed[:n_unmasked, :n_unmasked] = 1
        self.register_buffer("mask", allowed[None, None])

    def _heads(self, t: Tensor) -> Tensor:
        b, n, d = t.shape
        return t.view(b, n, self.n_head, d // self.n_head).permute(0, 2, 1, 3)

    def forward(self, x: Tensor, layer_past: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """(B, T, C) -> (B, T, C) and this call's keys/values stacked (2, B, heads, T, head_dim) for the cache.
        With ``layer_past`` the new positions attend to all cached ones (one step at a time: no mask needed)."""
        b, n, d = x.shape
        q, k, v = self._heads(self.query(x)), self._heads(self.key(x)), self._heads(self.value(x))
        present = torch.stack((k, v))
        if layer_past is not None:
            k, v = torch.cat((layer_past[0], k), dim=2), torch.cat((layer_past[1], v), dim=2)
        scores = q @ k.transpose(2, 3) / math.sqrt(k.shape[-1])
        if layer_past is None:
            scores = scores.masked_fill(self.mask[..., :n, :n] == 0, float("-inf"))
        out = (scores.softmax(dim=-1) @ v).permute(0, 2, 1, 3).reshape(b, n, d)
        return self.proj(out), present


class Block(nn.Module):
    def __init__(self, n_embd: int, n_head: int, block_size: int, n_unmasked: int = 0) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, block_size, n_unmasked)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd), nn.Dropout(0.0))

    def forward(self, x: Tensor, layer_past: Tensor | None = None) -> tuple[Tensor, Tensor]:
        attended, present = self.attn(self.ln1(x), layer_past)
        x = x + attended
        return x + self.mlp(self.ln2(x)), present


class GPT(nn.Module):
    def __init__(self, vocab_size: int, block_size: int, n_layer: int = 12, n_head: int = 8, n_embd: int = 256,
                 n_unmasked: int = 0) -> None:
        super().__init__()
        self.block_size = block_size
        self.tok_emb = nn.Embedding(vocab_size, n_embd)
        self.pos_emb = nn.Parameter(torch.zeros(1, block_size, n_embd))
        self.blocks = nn.Sequential(*(Block(n_embd, n_head, block_size, n_unmasked) for _ in range(n_layer)))
        self.ln_f = nn.LayerNorm(n_embd)
        self.head = nn.Linear(n_embd, vocab_size, bias=False)

    def _logits(self, h: Tensor) -> Tensor:
        return self.head(self.ln_f(h))

    def forward(self, idx: Tensor, embeddings: Tensor | None = None):
        h = self.tok_emb(idx)
        if embeddings is not None:
            h = torch.cat((embeddings, h), dim=1)
        if h.shape[1] > self.block_size:
            raise ValueError(f"{h.shape[1]} positions exceed the block size {self.block_size}")
        h = h + self.pos_emb[:, : h.shape[1]]
        for block in self.blocks:
            h = block(h)[0]
        return self._logits(h), None

    def forward_with_past(self, idx: Tensor, past: list[Tensor] | None = None, past_length: int | None = None):
        """Logits of ``idx`` given the cache ``past`` (a list of earlier ``presents``, each (layers, 2, B, heads, T, d));
        returns (logits, None, this call's presents). A cached call takes one new position, at ``past_length``."""
        h = self.tok_emb(idx)
        if past is None:
            h = h + self.pos_emb[:, : h.shape[1]]
            cached = [None] * len(self.blocks)
        else:
            h = h + self.pos_emb[:, past_length]
            cached = torch.cat(past, dim=-2)
        presents = []
        for block, layer_past in zip(self.blocks, cached):
            h, present = block(h, layer_past)
            presents.append(present)
        return self._logits(h), None, torch.stack(presents)


def _keep_top(logits: Tensor, top_k: int | None, top_p: float | None) -> Tensor:
    """Logits outside the ``top_k`` largest, then outside the smallest most-likely set reaching ``top_p``, to -inf."""
    out = logits
    if top_k:
        threshold = out.topk(min(top_k, out.shape[-1]), dim=-1).values[..., -1:]
        out = out.masked_fill(out < threshold, float("-inf"))
    if top_p is not None and top_p < 1.0:
        ranked, order = out.sort(dim=-1, descending=True)
        mass = ranked.softmax(dim=-1).cumsum(dim=-1)
        drop_ranked = torch.zeros_like(mass, dtype=torch.bool)
        drop_ranked[..., 1:] = mass[..., :-1] > top_p  # a token goes once the more likely ones already exceed top_p
        drop_ranked[..., 0] = False
        out = out.masked_fill(torch.zeros_like(drop_ranked).scatter(-1, order, drop_ranked), float("-inf"))
    return out


def _next_token(logits: Tensor, temperature: float, top_k: int | None, top_p: float | None, draw: bool) -> Tensor:
    """(B, V) last-position logits -> (B, 1): one multinomial draw on the global generator, or the argmax."""
    probs = _keep_top(logits / temperature, top_k, top_p).softmax(dim=-1)
    return torch.multinomial(probs, 1) if draw else probs.argmax(dim=-1, keepdim=True)


@torch.no_grad()
def sample_with_past(x: Tensor, model: GPT, steps: int, temperature: float = 1.0, sample_logits: bool = True,
                     top_k: int | None = None, top_p: float | None = None) -> Tensor:
    """The cached sampler: conditioning ``x`` (B, n) -> (B, steps) tokens; the cache grows by concatenation."""
    prompt_len, past, tokens, step_in = x.shape[1], None, [], x
    for step in range(steps):
        logits, _, present = model.forward_with_past(step_in, past=past, past_length=prompt_len + step - 1)
        past = [present] if past is None else [*past, present]
        step_in = _next_token(logits[:, -1], temperature, top_k, top_p, sample_logits)
        tokens.append(step_in)
    return torch.cat(tokens, dim=1)


@torch.no_grad()
def sample(x: Tensor, c: Tensor, steps: int, model: GPT, temperature: float = 1.0, sample: bool = False,
           top_k: int | None = None) -> Tensor:
    """The uncached sampler: codes so far ``x`` (B, m) after conditioning ``c`` (B, n) -> (B, m + steps) codes;
    every step reruns the transformer over the whole sequence (top-k only, as taming's ``Net2NetTransformer.sample``)."""
    seq = torch.cat((c, x), dim=1)
    for _ in range(steps):
        logits, _ = model(seq)
        seq = torch.cat((seq, _next_token(logits[:, -1], temperature, top_k, None, sample)), dim=1)
    return seq[:, c.shape[1]:]
