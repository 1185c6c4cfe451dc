"""DETR's transformer: a post-norm encoder and a decoder whose final norm applies to every layer's output."""
from __future__ import annotations

import torch
from torch import Tensor, nn

from visiontf.nn import TransformerDecoder, TransformerDecoderLayer, TransformerEncoder, TransformerEncoderLayer

__all__ = ["DetrTransformer"]


class DetrTransformer(nn.Module):
    """Post-norm encoder (no final norm) + decoder whose final norm is applied to every layer's output."""

    def __init__(self, d_model: int, nhead: int, num_encoder_layers: int, num_decoder_layers: int, dim_feedforward: int, dropout: float) -> None:
        super().__init__()
        common = dict(
            mlp_dim=dim_feedforward, dropout=dropout, attn_drop=dropout, norm_first=False,
            act_layer=nn.ReLU, norm_eps=1e-5,
        )
        self.encoder = TransformerEncoder(TransformerEncoderLayer(d_model, nhead, **common), num_encoder_layers)
        self.decoder = TransformerDecoder(
            TransformerDecoderLayer(d_model, nhead, **common), num_decoder_layers, norm=nn.LayerNorm(d_model, eps=1e-5)
        )
        self.d_model = d_model
        self._reset_parameters()

    def _reset_parameters(self) -> None:
        # the original: xavier on every matrix; nn.MultiheadAttention zeroes its projection biases
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)
        for m in self.modules():
            if hasattr(m, "qkv") and hasattr(m, "proj"):
                nn.init.zeros_(m.qkv.bias)
                nn.init.zeros_(m.proj.bias)

    def forward(
        self,
        src: Tensor,
        key_padding_mask: Tensor | None,
        query_embed: Tensor,
        pos: Tensor,
        return_intermediate: bool = True,
        need_weights: bool = False,
    ) -> dict[str, Tensor | None]:
        """src/pos (B, HW, C), query_embed (Q, C) -> ``{"hs": (L, B, Q, C), "memory", "enc_attn", "dec_attn"}``."""
        B = src.shape[0]
        enc = self.encoder(src, pos, key_padding_mask, need_weights=need_weights)
        memory = enc["output"]
        query_pos = query_embed.to(memory.dtype).unsqueeze(0).expand(B, -1, -1)
        tgt = torch.zeros_like(query_pos)
        dec = self.decoder(
            tgt, memory, query_pos, pos, key_padding_mask,
            return_intermediate=return_intermediate, need_weights=need_weights,
        )
        hs = dec["output"] if return_intermediate else dec["output"].unsqueeze(0)
        return {"hs": hs, "memory": memory, "enc_attn": enc["attn"], "dec_attn": dec["attn"]}
