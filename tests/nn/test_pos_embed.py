"""Position embeddings against values computed by hand from their definitions."""
import math

import pytest
import torch
from timm.layers import resample_abs_pos_embed

from visiontf.nn import (
    LearnedPositionEmbedding1d,
    PositionEmbeddingLearned2d,
    PositionEmbeddingSine2d,
    SinusoidalPositionEmbedding1d,
    sinusoidal_1d,
)


def test_sinusoidal_1d_matches_transformer_paper():
    d = 8
    pe = sinusoidal_1d(torch.arange(5), d)
    for pos in range(5):
        for i in range(d // 2):
            angle = pos / 10000 ** (2 * i / d)
            assert pe[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert pe[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)
    assert SinusoidalPositionEmbedding1d(d)(torch.zeros(2, 5, d)).shape == (1, 5, d)


def _detr_sine_by_hand(mask, npf, temperature=10000.0, scale=2 * math.pi):
    """DETR's PositionEmbeddingSine written as scalar loops, straight from its definition."""
    B, H, W = mask.shape
    out = torch.zeros(B, 2 * npf, H, W)
    for b in range(B):
        valid = ~mask[b]
        for y in range(H):
            for x in range(W):
                ycum = valid[: y + 1, x].sum().item()
                xcum = valid[y, : x + 1].sum().item()
                ylast = valid[:, x].sum().item()
                xlast = valid[y, :].sum().item()
                yn = ycum / (ylast + 1e-6) * scale
                xn = xcum / (xlast + 1e-6) * scale
                for c in range(npf):
                    dim_t = temperature ** (2 * (c // 2) / npf)
                    f = math.sin if c % 2 == 0 else math.cos
                    out[b, c, y, x] = f(yn / dim_t)
                    out[b, npf + c, y, x] = f(xn / dim_t)
    return out


def test_sine_2d_equals_detr_definition_with_padding():
    mask = torch.zeros(2, 4, 5, dtype=torch.bool)
    mask[1, 3:, :] = True
    mask[1, :, 4:] = True
    pe = PositionEmbeddingSine2d(num_pos_feats=6)(mask)
    assert pe.shape == (2, 12, 4, 5)
    torch.testing.assert_close(pe, _detr_sine_by_hand(mask, 6), atol=1e-5, rtol=0)


def test_sine_2d_padding_does_not_shift_valid_positions():
    small = torch.zeros(1, 3, 4, dtype=torch.bool)
    padded = torch.ones(1, 5, 7, dtype=torch.bool)
    padded[:, :3, :4] = False
    emb = PositionEmbeddingSine2d(8)
    torch.testing.assert_close(emb(padded)[..., :3, :4], emb(small), atol=1e-6, rtol=0)


def test_learned_2d_is_cat_of_column_then_row():
    emb = PositionEmbeddingLearned2d(num_pos_feats=4, num_embeddings=10)
    pos = emb(torch.zeros(2, 3, 5, dtype=torch.bool))
    assert pos.shape == (2, 8, 3, 5)
    torch.testing.assert_close(pos[0, :4, 2, 4], emb.col_embed.weight[4])
    torch.testing.assert_close(pos[1, 4:, 2, 4], emb.row_embed.weight[2])
    with pytest.raises(ValueError, match="exceeds the learned table"):
        emb(torch.zeros(1, 11, 2, dtype=torch.bool))


def test_learned_1d_resamples_like_timm_and_keeps_prefix():
    emb = LearnedPositionEmbedding1d((4, 4), dim=6, num_prefix_tokens=1)
    out = emb((6, 6))
    assert out.shape == (1, 37, 6)
    torch.testing.assert_close(out[:, :1], emb.weight[:, :1])
    ref = resample_abs_pos_embed(emb.weight, [6, 6], [4, 4], num_prefix_tokens=1)
    torch.testing.assert_close(out, ref)
    assert emb((4, 4)) is emb.weight
