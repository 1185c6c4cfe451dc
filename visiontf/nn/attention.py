"""Multi-head attention on ``F.scaled_dot_product_attention``.

One module serves ViT (fused self-attention, timm's ``qkv``/``proj`` parameter names) and DETR
(position embeddings added to queries and keys but not values, cross-attention) and IPT
(``nn.MultiheadAttention(bias=False)``: ``qkv_bias=False, proj_bias=False``). The input
projection is stored as one ``qkv`` Linear, as both timm and ``nn.MultiheadAttention``
(``in_proj_weight``) do, so either checkpoint maps onto it without reshaping.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

_REDUCED = (torch.bfloat16, torch.float16)
# On the CPU, torch's SDPA kernels in bfloat16 / float16 (what autocast picks for SDPA) are several times slower than
# in float32, forward and backward, up to a few hundred tokens, and about level above: DETR decoders' self-attention
# (50-300 queries) and small ViTs live there. The sizes measured: docs/record/speed.md, "Attention on the CPU under
# bf16"; benchmarks/cpu_attention.py.
CPU_FLOAT32_ATTENTION_PAIRS = 300 * 300


def scaled_dot_product_attention(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None = None,
                                 dropout_p: float = 0.0, is_causal: bool = False) -> Tensor:
    """``F.scaled_dot_product_attention``, computed in float32 on the CPU when it would run in bfloat16 / float16
    (the inputs' type, or autocast's) over at most :data:`CPU_FLOAT32_ATTENTION_PAIRS` query-key pairs a head; the
    output keeps the type SDPA would have returned. Elsewhere (float32, CUDA, long sequences) it is SDPA itself."""
    if q.device.type == "cpu":
        out_dtype = q.dtype
        # autocast casts every floating input but float64 to its type
        if q.dtype != torch.float64 and torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") in _REDUCED:
            out_dtype = torch.get_autocast_dtype("cpu")
        if out_dtype in _REDUCED and q.shape[-2] * k.shape[-2] <= CPU_FLOAT32_ATTENTION_PAIRS:
            if attn_mask is not None and attn_mask.is_floating_point():
                attn_mask = attn_mask.float()
            with torch.autocast("cpu", enabled=False):
                out = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=attn_mask,
                                                     dropout_p=dropout_p, is_causal=is_causal)
            return out.to(out_dtype)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal)


class MultiheadAttention(nn.Module):
    def __init__(
        self,
        dim: int,
        num_heads: int,
        qkv_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        proj_bias: bool = True,
    ) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"dim {dim} is not divisible by num_heads {num_heads}")
        self.dim = dim
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.attn_drop = attn_drop
        self.proj = nn.Linear(dim, dim, bias=proj_bias)
        self.proj_drop = nn.Dropout(proj_drop)

    def _project(self, query: Tensor, key: Tensor | None, value: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        if key is None and value is None:
            return self.qkv(query).chunk(3, dim=-1)
        key = query if key is None else key
        value = key if value is None else value
        w, b = self.qkv.weight, self.qkv.bias
        d = self.dim
        if key is query:
            # DETR self-attention: q and k share an input (tokens + pos), v does not
            q, k = F.linear(query, w[: 2 * d], None if b is None else b[: 2 * d]).chunk(2, dim=-1)
        else:
            q = F.linear(query, w[:d], None if b is None else b[:d])
            k = F.linear(key, w[d : 2 * d], None if b is None else b[d : 2 * d])
        v = F.linear(value, w[2 * d :], None if b is None else b[2 * d :])
        return q, k, v

    def forward(
        self,
        query: Tensor,
        key: Tensor | None = None,
        value: Tensor | None = None,
        key_padding_mask: Tensor | None = None,
        attn_mask: Tensor | None = None,
        is_causal: bool = False,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Batch-first attention.

        Args:
            query: (B, L, C). key/value: (B, S, C); omitted for self-attention.
            key_padding_mask: (B, S) bool, True marks padded keys that must be ignored.
            attn_mask: (L, S) or (B, H, L, S); bool (True = may attend) or float (added to logits).
            is_causal: mask future positions (decoder-style self-attention).
            need_weights: also return the head-averaged attention weights (B, L, S), for
                visualisation; takes the explicit (non-fused) path.
        """
        B, L, _ = query.shape
        q, k, v = self._project(query, key, value)
        S = k.shape[1]
        q = q.view(B, L, self.num_heads, self.head_dim).transpose(1, 2)
        k = k.view(B, S, self.num_heads, self.head_dim).transpose(1, 2)
        v = v.view(B, S, self.num_heads, self.head_dim).transpose(1, 2)
        # SDPA applies a lone causal mask itself; the explicit path needs it materialised
        fused_causal = is_causal and attn_mask is None and key_padding_mask is None and not need_weights
        mask = None if fused_causal else _merge_masks(attn_mask, key_padding_mask, is_causal, L, S, q.dtype, q.device)
        dropout = self.attn_drop if self.training else 0.0
        if need_weights:
            logits = (q * self.head_dim**-0.5) @ k.transpose(-2, -1)
            if mask is not None:
                logits = logits + mask
            weights = logits.softmax(dim=-1)
            out = F.dropout(weights, dropout, self.training) @ v
            attn = weights.mean(dim=1)
        else:
            out = scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=fused_causal)
            attn = None
        out = out.transpose(1, 2).reshape(B, L, self.dim)
        return self.proj_drop(self.proj(out)), attn


def _merge_masks(attn_mask, key_padding_mask, is_causal, L, S, dtype, device) -> Tensor | None:
    """One additive float mask (or None) from the optional boolean/float masks."""
    if key_padding_mask is None and attn_mask is None and not is_causal:
        return None
    mask = torch.zeros((), dtype=dtype, device=device)
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            attn_mask = torch.zeros_like(attn_mask, dtype=dtype).masked_fill(~attn_mask, float("-inf"))
        mask = mask + attn_mask.to(dtype)
    if is_causal:
        causal = torch.ones(L, S, dtype=torch.bool, device=device).tril()
        mask = mask + torch.zeros(L, S, dtype=dtype, device=device).masked_fill(~causal, float("-inf"))
    if key_padding_mask is not None:
        pad = torch.zeros(key_padding_mask.shape, dtype=dtype, device=device).masked_fill(key_padding_mask, float("-inf"))
        mask = mask + pad[:, None, None, :]
    return mask


def restrict_attn_mask(mask: Tensor | None, allowed: Tensor) -> Tensor:
    """``mask`` (bool True = may attend, or additive float; None = all) with what ``allowed`` (bool, broadcastable) blocks blocked too."""
    if mask is None:
        return allowed
    if mask.dtype == torch.bool:
        return mask & allowed
    return mask.masked_fill(~allowed, float("-inf"))
