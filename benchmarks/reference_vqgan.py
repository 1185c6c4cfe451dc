"""The ORIGINAL VQGAN design (CompVis/taming-transformers), re-implemented as a baseline for parity.

The original repository cannot be imported here (Lightning 1.0 pin, ``transformers``'
``top_k_top_p_filtering`` since removed), so this module re-creates, from reading it, the module
tree and the per-op maths of ``taming/modules/diffusionmodules/model.py`` (``Encoder``,
``Decoder``: anonymous ``nn.Module()`` containers, the decoder's ``up.insert(0, ...)``, attention by
``torch.bmm`` and an explicit softmax, swish as ``x * sigmoid(x)``), ``VectorQuantizer2``
(distances by ``einsum``, ``legacy`` loss), ``VQModel.encode/decode/forward`` and the minGPT of
``taming/modules/transformer/mingpt.py`` (``forward``, ``forward_with_past``,
``sample_with_past``, with the top-k/top-p filter of ``transformers`` 4.x). Its ``state_dict()``
has the published checkpoints' key layout; tests build random checkpoints from it.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def nonlinearity(x: Tensor) -> Tensor:
    return x * torch.sigmoid(x)


def Normalize(c: int) -> nn.GroupNorm:  # noqa: N802  (the original's name)
    return nn.GroupNorm(num_groups=32, num_channels=c, eps=1e-6, affine=True)


class Upsample(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c, c, kernel_size=3, stride=1, padding=1)

    def forward(self, x):
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


class Downsample(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c, c, kernel_size=3, stride=2, padding=0)

    def forward(self, x):
        return self.conv(F.pad(x, (0, 1, 0, 1), mode="constant", value=0))


class ResnetBlock(nn.Module):
    def __init__(self, *, in_channels, out_channels=None, dropout=0.0) -> None:
        super().__init__()
        self.in_channels = in_channels
        self.out_channels = in_channels if out_channels is None else out_channels
        self.norm1 = Normalize(in_channels)
        self.conv1 = nn.Conv2d(in_channels, self.out_channels, 3, 1, 1)
        self.norm2 = Normalize(self.out_channels)
        self.dropout = nn.Dropout(dropout)
        self.conv2 = nn.Conv2d(self.out_channels, self.out_channels, 3, 1, 1)
        if self.in_channels != self.out_channels:
            self.nin_shortcut = nn.Conv2d(in_channels, self.out_channels, 1, 1, 0)

    def forward(self, x, temb=None):
        h = self.conv1(nonlinearity(self.norm1(x)))
        h = self.conv2(self.dropout(nonlinearity(self.norm2(h))))
        if self.in_channels != self.out_channels:
            x = self.nin_shortcut(x)
        return x + h


class AttnBlock(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.norm = Normalize(c)
        self.q = nn.Conv2d(c, c, 1, 1, 0)
        self.k = nn.Conv2d(c, c, 1, 1, 0)
        self.v = nn.Conv2d(c, c, 1, 1, 0)
        self.proj_out = nn.Conv2d(c, c, 1, 1, 0)

    def forward(self, x):
        h_ = self.norm(x)
        q, k, v = self.q(h_), self.k(h_), self.v(h_)
        b, c, h, w = q.shape
        q = q.reshape(b, c, h * w).permute(0, 2, 1)       # b, hw, c
        k = k.reshape(b, c, h * w)                        # b, c, hw
        w_ = torch.bmm(q, k) * (int(c) ** (-0.5))         # b, hw(q), hw(k)
        w_ = F.softmax(w_, dim=2)
        v = v.reshape(b, c, h * w)
        h_ = torch.bmm(v, w_.permute(0, 2, 1)).reshape(b, c, h, w)
        return x + self.proj_out(h_)


class Encoder(nn.Module):
    def __init__(self, *, ch, ch_mult, num_res_blocks, attn_resolutions, in_channels, resolution, z_channels,
                 double_z=False, dropout=0.0, **ignored) -> None:
        super().__init__()
        self.num_resolutions = len(ch_mult)
        self.num_res_blocks = num_res_blocks
        self.conv_in = nn.Conv2d(in_channels, ch, 3, 1, 1)
        curr_res = resolution
        in_ch_mult = (1,) + tuple(ch_mult)
        self.down = nn.ModuleList()
        for i_level in range(self.num_resolutions):
            block, attn = nn.ModuleList(), nn.ModuleList()
            block_in, block_out = ch * in_ch_mult[i_level], ch * ch_mult[i_level]
            for _ in range(num_res_blocks):
                block.append(ResnetBlock(in_channels=block_in, out_channels=block_out, dropout=dropout))
                block_in = block_out
                if curr_res in attn_resolutions:
                    attn.append(AttnBlock(block_in))
            down = nn.Module()
            down.block, down.attn = block, attn
            if i_level != self.num_resolutions - 1:
                down.downsample = Downsample(block_in)
                curr_res //= 2
            self.down.append(down)
        self.mid = nn.Module()
        self.mid.block_1 = ResnetBlock(in_channels=block_in, out_channels=block_in, dropout=dropout)
        self.mid.attn_1 = AttnBlock(block_in)
        self.mid.block_2 = ResnetBlock(in_channels=block_in, out_channels=block_in, dropout=dropout)
        self.norm_out = Normalize(block_in)
        self.conv_out = nn.Conv2d(block_in, 2 * z_channels if double_z else z_channels, 3, 1, 1)

    def forward(self, x):
        hs = [self.conv_in(x)]
        for i_level in range(self.num_resolutions):
            for i_block in range(self.num_res_blocks):
                h = self.down[i_level].block[i_block](hs[-1], None)
                if len(self.down[i_level].attn) > 0:
                    h = self.down[i_level].attn[i_block](h)
                hs.append(h)
            if i_level != self.num_resolutions - 1:
                hs.append(self.down[i_level].downsample(hs[-1]))
        h = self.mid.block_2(self.mid.attn_1(self.mid.block_1(hs[-1], None)), None)
        return self.conv_out(nonlinearity(self.norm_out(h)))


class Decoder(nn.Module):
    def __init__(self, *, ch, out_ch, ch_mult, num_res_blocks, attn_resolutions, resolution, z_channels,
                 dropout=0.0, **ignored) -> None:
        super().__init__()
        self.num_resolutions = len(ch_mult)
        self.num_res_blocks = num_res_blocks
        block_in = ch * ch_mult[self.num_resolutions - 1]
        curr_res = resolution // 2 ** (self.num_resolutions - 1)
        self.conv_in = nn.Conv2d(z_channels, block_in, 3, 1, 1)
        self.mid = nn.Module()
        self.mid.block_1 = ResnetBlock(in_channels=block_in, out_channels=block_in, dropout=dropout)
        self.mid.attn_1 = AttnBlock(block_in)
        self.mid.block_2 = ResnetBlock(in_channels=block_in, out_channels=block_in, dropout=dropout)
        self.up = nn.ModuleList()
        for i_level in reversed(range(self.num_resolutions)):
            block, attn = nn.ModuleList(), nn.ModuleList()
            block_out = ch * ch_mult[i_level]
            for _ in range(num_res_blocks + 1):
                block.append(ResnetBlock(in_channels=block_in, out_channels=block_out, dropout=dropout))
                block_in = block_out
                if curr_res in attn_resolutions:
                    attn.append(AttnBlock(block_in))
            up = nn.Module()
            up.block, up.attn = block, attn
            if i_level != 0:
                up.upsample = Upsample(block_in)
                curr_res *= 2
            self.up.insert(0, up)  # prepended: index = level
        self.norm_out = Normalize(block_in)
        self.conv_out = nn.Conv2d(block_in, out_ch, 3, 1, 1)

    def forward(self, z):
        h = self.conv_in(z)
        h = self.mid.block_2(self.mid.attn_1(self.mid.block_1(h, None)), None)
        for i_level in reversed(range(self.num_resolutions)):
            for i_block in range(self.num_res_blocks + 1):
                h = self.up[i_level].block[i_block](h, None)
                if len(self.up[i_level].attn) > 0:
                    h = self.up[i_level].attn[i_block](h)
            if i_level != 0:
                h = self.up[i_level].upsample(h)
        return self.conv_out(nonlinearity(self.norm_out(h)))


class VectorQuantizer2(nn.Module):
    def __init__(self, n_e, e_dim, beta=0.25, legacy=True) -> None:
        super().__init__()
        self.n_e, self.e_dim, self.beta, self.legacy = n_e, e_dim, beta, legacy
        self.embedding = nn.Embedding(n_e, e_dim)
        self.embedding.weight.data.uniform_(-1.0 / n_e, 1.0 / n_e)

    def forward(self, z):
        z = z.permute(0, 2, 3, 1).contiguous()
        z_flattened = z.view(-1, self.e_dim)
        d = (torch.sum(z_flattened**2, dim=1, keepdim=True) + torch.sum(self.embedding.weight**2, dim=1)
             - 2 * torch.einsum("bd,dn->bn", z_flattened, self.embedding.weight.t()))
        min_encoding_indices = torch.argmin(d, dim=1)
        z_q = self.embedding(min_encoding_indices).view(z.shape)
        if not self.legacy:
            loss = self.beta * torch.mean((z_q.detach() - z) ** 2) + torch.mean((z_q - z.detach()) ** 2)
        else:
            loss = torch.mean((z_q.detach() - z) ** 2) + self.beta * torch.mean((z_q - z.detach()) ** 2)
        z_q = z + (z_q - z).detach()
        z_q = z_q.permute(0, 3, 1, 2).contiguous()
        return z_q, loss, (None, None, min_encoding_indices)

    def get_codebook_entry(self, indices, shape):
        z_q = self.embedding(indices)
        if shape is not None:
            z_q = z_q.view(shape).permute(0, 3, 1, 2).contiguous()
        return z_q


class OriginalVQModel(nn.Module):
    """taming's ``VQModel`` without Lightning; ``loss`` holds stand-ins for the LPIPS/discriminator
    tensors so that ``state_dict()`` has the ``loss.*`` keys of a training checkpoint."""

    def __init__(self, ddconfig: dict, n_embed: int, embed_dim: int, with_loss: bool = True) -> None:
        super().__init__()
        self.encoder = Encoder(**ddconfig)
        self.decoder = Decoder(**ddconfig)
        if with_loss:
            self.loss = nn.Module()
            self.loss.discriminator = nn.Sequential(nn.Conv2d(3, 8, 4, 2, 1), nn.LeakyReLU(0.2), nn.BatchNorm2d(8))
            self.loss.perceptual_loss = nn.Module()
            self.loss.perceptual_loss.lin0 = nn.Sequential(nn.Dropout(), nn.Conv2d(64, 1, 1, bias=False))
        self.quantize = VectorQuantizer2(n_embed, embed_dim, beta=0.25)
        self.quant_conv = nn.Conv2d(ddconfig["z_channels"], embed_dim, 1)
        self.post_quant_conv = nn.Conv2d(embed_dim, ddconfig["z_channels"], 1)

    def encode(self, x):
        return self.quantize(self.quant_conv(self.encoder(x)))

    def decode(self, quant):
        return self.decoder(self.post_quant_conv(quant))

    def forward(self, x):
        quant, diff, _ = self.encode(x)
        return self.decode(quant), diff


# --------------------------------------------------------------------------------------------- minGPT
class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head, block_size, n_unmasked=0) -> None:
        super().__init__()
        self.key = nn.Linear(n_embd, n_embd)
        self.query = nn.Linear(n_embd, n_embd)
        self.value = nn.Linear(n_embd, n_embd)
        self.attn_drop = nn.Dropout(0.0)
        self.resid_drop = nn.Dropout(0.0)
        self.proj = nn.Linear(n_embd, n_embd)
        mask = torch.tril(torch.ones(block_size, block_size))
        mask[:n_unmasked, :n_unmasked] = 1
        self.register_buffer("mask", mask.view(1, 1, block_size, block_size))
        self.n_head = n_head

    def forward(self, x, layer_past=None):
        B, T, C = x.size()
        k = self.key(x).view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = self.query(x).view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = self.value(x).view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        present = torch.stack((k, v))
        if layer_past is not None:
            k = torch.cat((layer_past[0], k), dim=-2)
            v = torch.cat((layer_past[1], v), dim=-2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        if layer_past is None:
            att = att.masked_fill(self.mask[:, :, :T, :T] == 0, float("-inf"))
        att = self.attn_drop(F.softmax(att, dim=-1))
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_drop(self.proj(y)), present


class Block(nn.Module):
    def __init__(self, n_embd, n_head, block_size, n_unmasked=0) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(n_embd)
        self.ln2 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, block_size, n_unmasked)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd), nn.Dropout(0.0))

    def forward(self, x, layer_past=None):
        attn, present = self.attn(self.ln1(x), layer_past=layer_past)
        x = x + attn
        return x + self.mlp(self.ln2(x)), present


class GPT(nn.Module):
    def __init__(self, vocab_size, block_size, n_layer=12, n_head=8, n_embd=256, n_unmasked=0) -> None:
        super().__init__()
        self.tok_emb = nn.Embedding(vocab_size, n_embd)
        self.pos_emb = nn.Parameter(torch.zeros(1, block_size, n_embd))
        self.drop = nn.Dropout(0.0)
        self.blocks = nn.Sequential(*[Block(n_embd, n_head, block_size, n_unmasked) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd)
        self.head = nn.Linear(n_embd, vocab_size, bias=False)
        self.block_size = block_size
        self.n_layer, self.n_head, self.n_embd = n_layer, n_head, n_embd

    def forward(self, idx, embeddings=None):
        x = self.tok_emb(idx)
        if embeddings is not None:
            x = torch.cat((embeddings, x), dim=1)
        t = x.shape[1]
        assert t <= self.block_size
        x = self.drop(x + self.pos_emb[:, :t, :])
        for block in self.blocks:
            x, _ = block(x)
        return self.head(self.ln_f(x)), None

    def forward_with_past(self, idx, past=None, past_length=None):
        x = self.tok_emb(idx)
        if past is not None:
            past = torch.cat(past, dim=-2)  # n_layer, 2, b, nh, len_past, dim_head
            pos = self.pos_emb[:, past_length, :]
        else:
            pos = self.pos_emb[:, : x.shape[1], :]
        x = self.drop(x + pos)
        presents = []
        for i, block in enumerate(self.blocks):
            x, present = block(x, layer_past=past[i, ...] if past is not None else None)
            presents.append(present)
        return self.head(self.ln_f(x)), None, torch.stack(presents)


def top_k_top_p_filtering(logits, top_k=0, top_p=1.0, filter_value=-float("inf"), min_tokens_to_keep=1):
    """transformers 4.x ``top_k_top_p_filtering`` (removed in 4.40): logits outside the top k, and
    outside the smallest set whose probability exceeds ``top_p``, set to ``filter_value``."""
    if top_k > 0:
        top_k = min(max(top_k, min_tokens_to_keep), logits.size(-1))
        logits = logits.masked_fill(logits < torch.topk(logits, top_k)[0][..., -1, None], filter_value)
    if top_p < 1.0:
        sorted_logits, sorted_indices = torch.sort(logits, descending=True)
        cumulative_probs = torch.cumsum(F.softmax(sorted_logits, dim=-1), dim=-1)
        remove = cumulative_probs > top_p
        if min_tokens_to_keep > 1:
            remove[..., :min_tokens_to_keep] = 0
        remove[..., 1:] = remove[..., :-1].clone()
        remove[..., 0] = 0
        remove = remove.scatter(1, sorted_indices, remove)
        logits = logits.masked_fill(remove, filter_value)
    return logits


@torch.no_grad()
def sample_with_past(x, model, steps, temperature=1.0, sample_logits=True, top_k=None, top_p=None):
    """taming's cached sampler: ``x`` (B, cond_len) conditioning -> (B, steps) sampled tokens."""
    sample = x
    cond_len = x.shape[1]
    past = None
    for n in range(steps):
        logits, _, present = model.forward_with_past(x, past=past, past_length=(n + cond_len - 1))
        past = [present] if past is None else past + [present]
        logits = logits[:, -1, :] / temperature
        if top_k is not None:
            logits = top_k_top_p_filtering(logits, top_k=top_k, top_p=1.0 if top_p is None else top_p)
        probs = F.softmax(logits, dim=-1)
        x = torch.topk(probs, k=1, dim=-1)[1] if not sample_logits else torch.multinomial(probs, num_samples=1)
        sample = torch.cat((sample, x), dim=1)
    return sample[:, cond_len:]


# taming/models/cond_transformer.py, Net2NetTransformer.top_k_logits and .sample (the uncached sampler), copied
# from CompVis/taming-transformers (MIT licence) with `self.transformer` as the argument `model`; only the
# `pkeep > 0` branch (taming's default pkeep=1.0; `pkeep <= 0` samples all tokens in one pass from noise)
def top_k_logits(logits, k):
    v, ix = torch.topk(logits, k)
    out = logits.clone()
    out[out < v[..., [-1]]] = -float('Inf')
    return out


@torch.no_grad()
def sample(x, c, steps, model, temperature=1.0, sample=False, top_k=None, callback=lambda k: None):
    """taming's uncached sampler: every step reruns the transformer over the whole sequence so far.
    ``x`` (B, 0) codes so far, ``c`` (B, cond_len) conditioning -> (B, steps) tokens."""
    x = torch.cat((c, x), dim=1)
    block_size = model.block_size
    assert not model.training
    for k in range(steps):
        callback(k)
        assert x.size(1) <= block_size  # make sure model can see conditioning
        x_cond = x if x.size(1) <= block_size else x[:, -block_size:]  # crop context if needed
        logits, _ = model(x_cond)
        # pluck the logits at the final step and scale by temperature
        logits = logits[:, -1, :] / temperature
        # optionally crop probabilities to only the top k options
        if top_k is not None:
            logits = top_k_logits(logits, top_k)
        # apply softmax to convert to probabilities
        probs = F.softmax(logits, dim=-1)
        # sample from the distribution or take the most likely
        if sample:
            ix = torch.multinomial(probs, num_samples=1)
        else:
            _, ix = torch.topk(probs, k=1, dim=-1)
        # append to the sequence and continue
        x = torch.cat((x, ix), dim=1)
    # cut off conditioning
    x = x[:, c.shape[1]:]
    return x
