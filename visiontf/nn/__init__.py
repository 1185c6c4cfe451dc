"""Shared building blocks: attention, transformer layers, position embeddings."""
from visiontf.nn.attention import MultiheadAttention, scaled_dot_product_attention
from visiontf.nn.ms_deform_attn import MSDeformAttn
from visiontf.nn.ms_deform_core import ms_deform_attn_core
from visiontf.nn.pos_embed import (
    LearnedPositionEmbedding1d,
    PositionEmbeddingLearned2d,
    PositionEmbeddingSine2d,
    SinusoidalPositionEmbedding1d,
    resample_pos_embed,
    sinusoidal_1d,
)
from visiontf.nn.transformer import TransformerDecoder, TransformerDecoderLayer, TransformerEncoder, TransformerEncoderLayer

__all__ = [
    "MultiheadAttention",
    "scaled_dot_product_attention",
    "MSDeformAttn",
    "ms_deform_attn_core",
    "TransformerEncoderLayer",
    "TransformerDecoderLayer",
    "TransformerEncoder",
    "TransformerDecoder",
    "SinusoidalPositionEmbedding1d",
    "PositionEmbeddingSine2d",
    "PositionEmbeddingLearned2d",
    "LearnedPositionEmbedding1d",
    "resample_pos_embed",
    "sinusoidal_1d",
]
