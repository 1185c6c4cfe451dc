"""Shared attention and transformer layers against torch's reference modules."""
import torch
from torch import nn

from visiontf.nn import (
    MultiheadAttention,
    TransformerDecoder,
    TransformerDecoderLayer,
    TransformerEncoder,
    TransformerEncoderLayer,
)


def _torch_mha_like(attn: MultiheadAttention) -> nn.MultiheadAttention:
    ref = nn.MultiheadAttention(attn.dim, attn.num_heads, batch_first=True)
    ref.in_proj_weight.data.copy_(attn.qkv.weight)
    ref.in_proj_bias.data.copy_(attn.qkv.bias)
    ref.out_proj.load_state_dict(attn.proj.state_dict())
    return ref.eval()


def test_attention_matches_torch_with_padding_cross_and_causal():
    attn = MultiheadAttention(32, 4).eval()
    ref = _torch_mha_like(attn)
    x, mem = torch.randn(2, 5, 32), torch.randn(2, 7, 32)
    pad = torch.zeros(2, 7, dtype=torch.bool)
    pad[1, 4:] = True
    out, w = attn(x, mem, mem, key_padding_mask=pad, need_weights=True)
    ref_out, ref_w = ref(x, mem, mem, key_padding_mask=pad)
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=0)
    torch.testing.assert_close(w, ref_w, atol=1e-6, rtol=0)
    assert w[1, :, 4:].abs().max() == 0  # padded keys get no weight
    causal, _ = attn(x, is_causal=True)
    ref_causal, _ = ref(x, x, x, attn_mask=nn.Transformer.generate_square_subsequent_mask(5), is_causal=True)
    torch.testing.assert_close(causal, ref_causal, atol=1e-5, rtol=0)
    # query+pos / key+pos / value without pos (DETR) through the split-projection path
    pos = torch.randn(2, 5, 32)
    out_pos, _ = attn(x + pos, x + pos, x)
    torch.testing.assert_close(out_pos, ref(x + pos, x + pos, x)[0], atol=1e-5, rtol=0)


def test_post_norm_layers_match_torch_transformer():
    d, h, f = 16, 2, 32
    enc = TransformerEncoderLayer(d, h, f, norm_first=False, act_layer=nn.ReLU, norm_eps=1e-5).eval()
    ref = nn.TransformerEncoderLayer(d, h, f, dropout=0.0, batch_first=True).eval()
    ref.self_attn.load_state_dict(_torch_mha_like(enc.attn).state_dict())
    ref.linear1.load_state_dict(enc.mlp.fc1.state_dict())
    ref.linear2.load_state_dict(enc.mlp.fc2.state_dict())
    ref.norm1.load_state_dict(enc.norm1.state_dict())
    ref.norm2.load_state_dict(enc.norm2.state_dict())
    x = torch.randn(2, 6, d)
    torch.testing.assert_close(enc(x)[0], ref(x), atol=1e-5, rtol=0)

    dec = TransformerDecoderLayer(d, h, f, norm_first=False).eval()
    ref_dec = nn.TransformerDecoderLayer(d, h, f, dropout=0.0, batch_first=True).eval()
    ref_dec.self_attn.load_state_dict(_torch_mha_like(dec.self_attn).state_dict())
    ref_dec.multihead_attn.load_state_dict(_torch_mha_like(dec.cross_attn).state_dict())
    for a, b in (("linear1", "fc1"), ("linear2", "fc2")):
        getattr(ref_dec, a).load_state_dict(getattr(dec.mlp, b).state_dict())
    for n in ("norm1", "norm2", "norm3"):
        getattr(ref_dec, n).load_state_dict(getattr(dec, n).state_dict())
    tgt, mem = torch.randn(2, 4, d), torch.randn(2, 9, d)
    torch.testing.assert_close(dec(tgt, mem)[0], ref_dec(tgt, mem), atol=1e-5, rtol=0)


def test_pre_norm_and_stacks_intermediates():
    layer = TransformerEncoderLayer(16, 2, norm_first=True, drop_path=0.1)
    enc = TransformerEncoder(layer, 3, norm=nn.LayerNorm(16)).eval()
    out = enc(torch.randn(2, 5, 16), return_intermediate=True, need_weights=True)
    assert len(out["intermediates"]) == 3 and out["attn"].shape == (2, 5, 5)
    torch.testing.assert_close(out["attn"].sum(-1), torch.ones(2, 5))
    dec = TransformerDecoder(TransformerDecoderLayer(16, 2), 3, norm=nn.LayerNorm(16)).eval()
    res = dec(torch.zeros(2, 4, 16), torch.randn(2, 6, 16), query_pos=torch.randn(2, 4, 16), return_intermediate=True)
    assert res["output"].shape == (3, 2, 4, 16)
    # the final norm is applied to every intermediate: each row is normalised
    torch.testing.assert_close(res["output"].mean(-1), torch.zeros(3, 2, 4), atol=1e-5, rtol=0)


def test_drop_path_only_in_training():
    layer = TransformerEncoderLayer(8, 2, drop_path=0.5)
    x = torch.randn(4, 3, 8)
    layer.eval()
    torch.testing.assert_close(layer(x)[0], layer(x)[0])
    layer.train()
    torch.manual_seed(1)
    a = layer(x)[0]
    torch.manual_seed(2)
    assert not torch.allclose(a, layer(x)[0])
