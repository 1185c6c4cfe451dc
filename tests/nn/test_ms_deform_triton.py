"""The fused Triton core of multi-scale deformable attention equals the PyTorch cores, values and gradients.

On the CPU the kernels run in Triton's interpreter (``TRITON_INTERPRET=1``, which ``tests/conftest.py``
sets on machines without a GPU, before anything imports Triton), at tiny shapes; on a GPU the same
tests run the compiled kernels at real shapes.
"""
from __future__ import annotations

import warnings

import pytest
import torch

from visiontf.nn import ms_deform_triton
from visiontf.nn.ms_deform_attn import MSDeformAttn
from visiontf.nn.ms_deform_core import core_grid_sample, fused_kernel_runs, ms_deform_attn_core
from visiontf.nn.ms_deform_gather import core_gather
from visiontf.nn.packed_tokens import PackedTokens

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"))]

# (level shapes, heads, head dim, points): odd and 1-pixel levels, 1 to 4 levels, head dims that are
# no power of 2 (6, 24); on CUDA the real encoder's levels replace the tiny ones
TINY = [
    ([(3, 5), (2, 3), (1, 1)], 2, 6, 3),
    ([(4, 4)], 1, 24, 1),
    ([(5, 3), (3, 2), (2, 1), (1, 2)], 3, 8, 2),
]
REAL = [
    ([(100, 152), (50, 76), (25, 38), (13, 19)], 8, 32, 4),
    ([(67, 101), (34, 51), (17, 26), (9, 13)], 8, 24, 3),
]
# (output, value gradient) tolerances: half precision rounds the output and the value's gradient
# (both in its dtype); everything else is float32 arithmetic on the same inputs
TOLERANCE = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (2e-2, 2e-2), torch.float16: (3e-3, 3e-3)}


@pytest.fixture
def kernels():
    """``select(device)``: the kernel module, after checking that it runs what the test claims
    (interpreted kernels on CPU tensors, compiled ones on CUDA)."""

    def select(device: str):
        interpreted = device == "cpu"
        if ms_deform_triton.INTERPRETED != interpreted:
            pytest.skip(f"{device} runs {'interpreted' if interpreted else 'compiled'} kernels: TRITON_INTERPRET="
                        f"{int(ms_deform_triton.INTERPRETED)} in this process (tests/conftest.py sets 1 without a GPU)")
        kind = type(ms_deform_triton._forward_kernel.fn).__name__
        assert kind == ("InterpretedFunction" if interpreted else "JITFunction")
        return ms_deform_triton

    return select


def _inputs(shapes, M, D, P, dtype, device, N=2, Q=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    S, L = sum(h * w for h, w in shapes), len(shapes)
    value = torch.randn(N, S, M, D, generator=g).to(device, dtype)
    # some samples fall outside the maps (zero padding) and on their borders
    loc = (torch.rand(N, Q, M, L, P, 2, generator=g) * 1.4 - 0.2).to(device)
    attn = torch.rand(N, Q, M, L, P, generator=g).to(device)
    return value, loc, attn


def _cases(device):
    return TINY if device == "cpu" else REAL


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_values_and_gradients_equal_grid_sample_core(kernels, device, dtype):
    """Output and the gradients of value, locations and attention weights, at several L, P, M, D and dtypes."""
    module = kernels(device)
    out_tol, value_tol = TOLERANCE[dtype]
    if device == "cuda":
        value_tol = max(value_tol, 1e-4)  # float32 atomics add thousands of terms in no fixed order
    for case, (shapes, M, D, P) in enumerate(_cases(device)):
        Q = 7 if device == "cpu" else 900
        value, loc, attn = _inputs(shapes, M, D, P, dtype, device, Q=Q, seed=case)
        ours = [t.clone().requires_grad_() for t in (value, loc, attn)]
        # the reference in float32 from the same (rounded) values
        ref = [t.float().clone().requires_grad_() for t in (value, loc, attn)]
        out = module.triton_core(*ours[:1], shapes, *ours[1:])
        expected = core_grid_sample(ref[0], shapes, ref[1], ref[2])
        assert out.dtype == dtype and out.shape == expected.shape
        torch.testing.assert_close(out.float(), expected, atol=out_tol, rtol=out_tol)
        grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(case)).to(device, dtype)
        out.backward(grad)
        expected.backward(grad.float())
        assert ours[0].grad.dtype == dtype
        torch.testing.assert_close(ours[0].grad.float(), ref[0].grad, atol=value_tol, rtol=value_tol)
        # location and weight gradients are float32 arithmetic on the same inputs in every dtype
        scale = 1e-4 if device == "cpu" else 1e-3  # sums of 20k-query gradients on CUDA: relative
        torch.testing.assert_close(ours[1].grad, ref[1].grad, atol=scale, rtol=1e-4)
        torch.testing.assert_close(ours[2].grad, ref[2].grad, atol=scale, rtol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
def test_gradcheck_float64(kernels, device):
    """Finite differences agree with the kernels' backward (float64 arithmetic for float64 inputs)."""
    module = kernels(device)
    shapes, M, D, P = [(3, 4), (2, 1)], 2, 3, 2
    value, loc, attn = _inputs(shapes, M, D, P, torch.float64, device, N=1, Q=3)
    # keep locations off the pixel grid, where bilinear sampling has kinks
    loc = loc.double() + 0.013
    args = [t.double().requires_grad_() for t in (value, loc, attn)]
    assert torch.autograd.gradcheck(lambda v, l, a: module.triton_core(v, shapes, l, a), args, fast_mode=True)


@pytest.mark.parametrize("device", DEVICES)
def test_matches_gather_core_through_the_dispatcher(kernels, device):
    """``ms_deform_attn_core(method="triton")`` equals the gather core (the CPU default)."""
    kernels(device)
    shapes, M, D, P = _cases(device)[0][0], 2, 8, 2
    value, loc, attn = _inputs(shapes, M, D, P, torch.float32, device, Q=5)
    out = ms_deform_attn_core(value, shapes, loc, attn, method="triton")
    torch.testing.assert_close(out, core_gather(value, shapes, loc, attn), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_non_finite_location_gives_nan_like_grid_sample(kernels, device):
    module = kernels(device)
    shapes, M, D, P = [(3, 5), (2, 3)], 2, 4, 2
    value, loc, attn = _inputs(shapes, M, D, P, torch.float32, device, Q=4)
    loc[0, 1, 0, 0, 0, 0] = float("nan")
    loc[1, 2, 1, 1, 1, 1] = float("inf")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the interpreter's numpy: inf - inf
        out = module.triton_core(value, shapes, loc, attn)
    expected = core_grid_sample(value, shapes, loc, attn)
    assert torch.equal(out.isnan(), expected.isnan()) and out.isnan().any()
    torch.testing.assert_close(out.nan_to_num(), expected.nan_to_num(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_module_with_padding_and_packed_tokens(kernels, device):
    """MSDeformAttn on a padded batch, as the encoder runs it (packed tokens) and as the decoder does
    (whole maps, masked value): the Triton core equals the grid_sample core, output and every gradient."""
    kernels(device)
    shapes = [(4, 5), (2, 3)] if device == "cpu" else REAL[0][0]
    C, heads, points = (16, 2, 2) if device == "cpu" else (256, 8, 4)
    S = sum(h * w for h, w in shapes)
    torch.manual_seed(0)
    layers = {m: MSDeformAttn(C, len(shapes), heads, points, method=m).to(device) for m in ("triton", "grid_sample")}
    layers["grid_sample"].load_state_dict(layers["triton"].state_dict())
    for layer in layers.values():
        torch.nn.init.normal_(layer.attention_weights.weight, std=0.3)
        torch.nn.init.normal_(layer.sampling_offsets.weight, std=0.3)
    layers["grid_sample"].load_state_dict(layers["triton"].state_dict())
    mask = torch.zeros(2, S, dtype=torch.bool, device=device)
    mask[1, S // 2 :] = True  # the second image is half padding
    src = torch.randn(2, S, C, device=device)
    ref_points = torch.rand(2, S, len(shapes), 2, device=device)
    packed = PackedTokens.from_mask(mask)
    outputs, grads = {}, {}
    for name, layer in layers.items():
        x = src.clone().requires_grad_()
        if name == "triton":  # the encoder's way: packed rows
            q, r = packed.pack(x).unsqueeze(0), packed.pack(ref_points).unsqueeze(0)
            out = packed.unpack(layer(q, r, q, shapes, packed=packed)[0])
        else:
            out = layer(x, ref_points, x, shapes, mask).masked_fill(mask[..., None], 0.0)
        out.square().sum().backward()
        outputs[name] = out
        grads[name] = [x.grad] + [p.grad for p in layer.parameters()]
    tol = 1e-4 if device == "cpu" else 1e-3
    torch.testing.assert_close(outputs["triton"], outputs["grid_sample"], atol=tol, rtol=tol)
    for ours, theirs in zip(grads["triton"], grads["grid_sample"]):
        torch.testing.assert_close(ours, theirs, atol=tol, rtol=tol)


def test_gather_runs_the_kernels_on_cuda_only():
    """The default method picks the fused kernels for CUDA tensors, not for CPU ones, nor under determinism."""
    assert not fused_kernel_runs(torch.zeros(1))
    if torch.cuda.is_available():
        assert fused_kernel_runs(torch.zeros(1, device="cuda"))
        torch.use_deterministic_algorithms(True)
        try:
            assert not fused_kernel_runs(torch.zeros(1, device="cuda"))
        finally:
            torch.use_deterministic_algorithms(False)
