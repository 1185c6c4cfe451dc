"""``visiontf.nn.scaled_dot_product_attention``: float32 on the CPU for short bf16 / fp16 attention, SDPA elsewhere."""
import pytest
import torch
import torch.nn.functional as F

from visiontf.nn import MultiheadAttention, scaled_dot_product_attention
from visiontf.nn.attention import CPU_FLOAT32_ATTENTION_PAIRS


def _qkv(L, S, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 4, L, 16, generator=g, dtype=torch.float64)
    k = torch.randn(2, 4, S, 16, generator=g, dtype=torch.float64)
    v = torch.randn(2, 4, S, 16, generator=g, dtype=torch.float64)
    return [t.to(dtype).requires_grad_() for t in (q, k, v)]


def _masks(L, S):
    g = torch.Generator().manual_seed(1)
    allowed = torch.rand(2, 1, L, S, generator=g) > 0.3
    allowed[..., 0] = True  # every query sees a key
    additive = torch.zeros(L, S).masked_fill(~allowed[0, 0], float("-inf"))
    return {"none": None, "bool (B,1,L,S)": allowed, "additive (L,S)": additive}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("mask_kind", ["none", "bool (B,1,L,S)", "additive (L,S)"])
def test_short_reduced_precision_attention_is_float32_attention_rounded_once(dtype, mask_kind):
    q, k, v = _qkv(30, 40, dtype)
    mask = _masks(30, 40)[mask_kind]
    out = scaled_dot_product_attention(q, k, v, attn_mask=None if mask is None else mask.to(dtype) if mask.is_floating_point() else mask)
    assert out.dtype == dtype
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    ref = F.scaled_dot_product_attention(q32, k32, v32, attn_mask=mask)
    # one rounding of the float32 result, not bf16 arithmetic all the way through
    assert torch.equal(out, ref.to(dtype))
    out.float().square().sum().backward()
    ref.to(dtype).float().square().sum().backward()
    for got, want in ((q, q32), (k, k32), (v, v32)):
        assert got.grad.dtype == dtype
        assert torch.allclose(got.grad.float(), want.grad, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("dtype, returned", [(torch.float32, torch.bfloat16), (torch.float64, torch.float64)])
def test_under_autocast_the_type_returned_is_sdpas(dtype, returned):
    """Autocast casts float32 to bf16 and leaves float64 alone; so does this function."""
    q, k, v = _qkv(50, 50, dtype)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ours = scaled_dot_product_attention(q, k, v)
        sdpa = F.scaled_dot_product_attention(q, k, v)
    assert ours.dtype == sdpa.dtype == returned
    if dtype == torch.float64:
        assert torch.equal(ours, sdpa)
        return
    exact = F.scaled_dot_product_attention(*(t.double() for t in (q, k, v)))
    # the float32 computation is closer to float64 than autocast's bf16 one
    assert (ours.double() - exact).abs().max() < (sdpa.double() - exact).abs().max()
    assert torch.equal(ours, F.scaled_dot_product_attention(q, k, v).to(torch.bfloat16))


def test_float32_and_long_sequences_are_sdpa_itself():
    for L, S, dtype in ((30, 40, torch.float32), (30, 40, torch.float64)):
        q, k, v = _qkv(L, S, dtype)
        assert torch.equal(scaled_dot_product_attention(q, k, v), F.scaled_dot_product_attention(q, k, v))
    side = int(CPU_FLOAT32_ATTENTION_PAIRS**0.5) + 1
    q, k, v = _qkv(side, side, torch.bfloat16)
    assert torch.equal(scaled_dot_product_attention(q, k, v), F.scaled_dot_product_attention(q, k, v))


def test_causal_and_dropout_pass_through():
    q, k, v = _qkv(20, 20, torch.bfloat16)
    ref = F.scaled_dot_product_attention(*(t.float() for t in (q, k, v)), is_causal=True).to(torch.bfloat16)
    assert torch.equal(scaled_dot_product_attention(q, k, v, is_causal=True), ref)
    torch.manual_seed(0)
    dropped = scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    assert not torch.equal(dropped, scaled_dot_product_attention(q, k, v))


def test_the_shared_attention_module_under_bf16_autocast_is_closer_to_float32():
    torch.manual_seed(0)
    attn = MultiheadAttention(64, 4).eval()
    x = torch.randn(2, 60, 64)
    pad = torch.zeros(2, 60, dtype=torch.bool)
    pad[1, 45:] = True
    with torch.no_grad():
        want, _ = attn(x, key_padding_mask=pad)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got, _ = attn(x, key_padding_mask=pad)
            q, k, v = attn._project(x, None, None)
    assert got.dtype == torch.bfloat16
    assert torch.allclose(got.float(), want, atol=3e-2)
    assert q.dtype == torch.bfloat16  # the projections stay in autocast's type; only the attention is float32
