"""Transformer encoder/decoder layers and stacks shared by ViT, DETR and SETR.

Pre-norm (ViT) and post-norm (original Transformer / DETR) share one layer class. Parameter names
follow timm's ViT block (``norm1``, ``attn.qkv``, ``attn.proj``, ``norm2``, ``mlp.fc1``,
``mlp.fc2``) so timm checkpoints load unchanged; DETR and IPT checkpoints are renamed on load.
``qkv_bias=False, proj_bias=False`` is ``nn.MultiheadAttention(bias=False)`` (IPT).
Position embeddings, when given, are added to queries and keys only, never to values (DETR).
"""
from __future__ import annotations

import copy

import torch
from timm.layers import DropPath, Mlp
from torch import Tensor, nn

from visiontf.nn.attention import MultiheadAttention


def _with_pos(x: Tensor, pos: Tensor | None) -> Tensor:
    return x if pos is None else x + pos


class TransformerEncoderLayer(nn.Module):
    def __init__(
        self,
        dim: int,
        num_heads: int,
        mlp_dim: int | None = None,
        dropout: float = 0.0,
        attn_drop: float = 0.0,
        drop_path: float = 0.0,
        norm_first: bool = True,
        qkv_bias: bool = True,
        act_layer: type[nn.Module] = nn.GELU,
        norm_eps: float = 1e-6,
        proj_bias: bool = True,
    ) -> None:
        super().__init__()
        self.norm_first = norm_first
        self.norm1 = nn.LayerNorm(dim, eps=norm_eps)
        self.attn = MultiheadAttention(dim, num_heads, qkv_bias=qkv_bias, attn_drop=attn_drop, proj_bias=proj_bias)
        self.norm2 = nn.LayerNorm(dim, eps=norm_eps)
        self.mlp = Mlp(dim, mlp_dim or 4 * dim, act_layer=act_layer, drop=dropout)
        self.drop1 = nn.Dropout(dropout)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(
        self,
        x: Tensor,
        pos: Tensor | None = None,
        key_padding_mask: Tensor | None = None,
        attn_mask: Tensor | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        if self.norm_first:
            h = self.norm1(x)
            if pos is None:
                a, w = self.attn(h, key_padding_mask=key_padding_mask, attn_mask=attn_mask, need_weights=need_weights)
            else:
                qk = h + pos
                a, w = self.attn(qk, qk, h, key_padding_mask, attn_mask, need_weights=need_weights)
            x = x + self.drop_path(self.drop1(a))
            x = x + self.drop_path(self.mlp(self.norm2(x)))
        else:
            qk = _with_pos(x, pos)
            a, w = self.attn(qk, qk, x, key_padding_mask, attn_mask, need_weights=need_weights)
            x = self.norm1(x + self.drop_path(self.drop1(a)))
            x = self.norm2(x + self.drop_path(self.mlp(x)))
        return x, w


class TransformerDecoderLayer(nn.Module):
    """Self-attention over queries, cross-attention to memory, FFN (DETR's decoder layer)."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        mlp_dim: int | None = None,
        dropout: float = 0.0,
        attn_drop: float = 0.0,
        drop_path: float = 0.0,
        norm_first: bool = False,
        qkv_bias: bool = True,
        act_layer: type[nn.Module] = nn.ReLU,
        norm_eps: float = 1e-5,
        proj_bias: bool = True,
    ) -> None:
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = MultiheadAttention(dim, num_heads, qkv_bias=qkv_bias, attn_drop=attn_drop, proj_bias=proj_bias)
        self.cross_attn = MultiheadAttention(dim, num_heads, qkv_bias=qkv_bias, attn_drop=attn_drop, proj_bias=proj_bias)
        self.norm1 = nn.LayerNorm(dim, eps=norm_eps)
        self.norm2 = nn.LayerNorm(dim, eps=norm_eps)
        self.norm3 = nn.LayerNorm(dim, eps=norm_eps)
        self.mlp = Mlp(dim, mlp_dim or 4 * dim, act_layer=act_layer, drop=dropout)
        self.drop1 = nn.Dropout(dropout)
        self.drop2 = nn.Dropout(dropout)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(
        self,
        tgt: Tensor,
        memory: Tensor,
        query_pos: Tensor | None = None,
        pos: Tensor | None = None,
        memory_key_padding_mask: Tensor | None = None,
        tgt_mask: Tensor | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Returns the new queries and, with ``need_weights``, the cross-attention (B, Q, S)."""
        key = _with_pos(memory, pos)
        if self.norm_first:
            h = self.norm1(tgt)
            qk = _with_pos(h, query_pos)
            tgt = tgt + self.drop_path(self.drop1(self.self_attn(qk, qk, h, attn_mask=tgt_mask)[0]))
            h = self.norm2(tgt)
            a, w = self.cross_attn(_with_pos(h, query_pos), key, memory, memory_key_padding_mask, need_weights=need_weights)
            tgt = tgt + self.drop_path(self.drop2(a))
            tgt = tgt + self.drop_path(self.mlp(self.norm3(tgt)))
        else:
            qk = _with_pos(tgt, query_pos)
            tgt = self.norm1(tgt + self.drop_path(self.drop1(self.self_attn(qk, qk, tgt, attn_mask=tgt_mask)[0])))
            a, w = self.cross_attn(_with_pos(tgt, query_pos), key, memory, memory_key_padding_mask, need_weights=need_weights)
            tgt = self.norm2(tgt + self.drop_path(self.drop2(a)))
            tgt = self.norm3(tgt + self.drop_path(self.mlp(tgt)))
        return tgt, w


class TransformerEncoder(nn.Module):
    """A stack of encoder layers with an optional final norm (pre-norm stacks need one)."""

    def __init__(self, layer: TransformerEncoderLayer, num_layers: int, norm: nn.Module | None = None) -> None:
        super().__init__()
        self.layers = nn.ModuleList(copy.deepcopy(layer) for _ in range(num_layers))
        self.norm = norm

    def forward(
        self,
        x: Tensor,
        pos: Tensor | None = None,
        key_padding_mask: Tensor | None = None,
        attn_mask: Tensor | None = None,
        return_intermediate: bool = False,
        need_weights: bool = False,
    ) -> dict[str, Tensor | list[Tensor] | None]:
        """``{"output", "intermediates" (each layer's output), "attn" (last layer's weights)}``."""
        intermediates = []
        attn = None
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            x, attn = layer(x, pos, key_padding_mask, attn_mask, need_weights=need_weights and i == last)
            if return_intermediate:
                intermediates.append(x)
        if self.norm is not None:
            x = self.norm(x)
        return {"output": x, "intermediates": intermediates, "attn": attn}


class TransformerDecoder(nn.Module):
    """A stack of decoder layers; the final norm is applied to every returned intermediate (DETR)."""

    def __init__(self, layer: TransformerDecoderLayer, num_layers: int, norm: nn.Module | None = None) -> None:
        super().__init__()
        self.layers = nn.ModuleList(copy.deepcopy(layer) for _ in range(num_layers))
        self.norm = norm

    def forward(
        self,
        tgt: Tensor,
        memory: Tensor,
        query_pos: Tensor | None = None,
        pos: Tensor | None = None,
        memory_key_padding_mask: Tensor | None = None,
        tgt_mask: Tensor | None = None,
        return_intermediate: bool = False,
        need_weights: bool = False,
    ) -> dict[str, Tensor | None]:
        """``{"output": (L, B, Q, C) if return_intermediate else (B, Q, C), "attn": last layer's cross-attention}``."""
        outputs = []
        attn = None
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            tgt, attn = layer(tgt, memory, query_pos, pos, memory_key_padding_mask, tgt_mask, need_weights=need_weights and i == last)
            if return_intermediate:
                outputs.append(tgt if self.norm is None else self.norm(tgt))
        if return_intermediate:
            return {"output": torch.stack(outputs), "attn": attn}
        return {"output": tgt if self.norm is None else self.norm(tgt), "attn": attn}
