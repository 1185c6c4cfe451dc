"""The fused Triton core of multi-scale deformable attention equals the PyTorch cores, values and gradients.

On the CPU the kernels run in Triton's interpreter (``TRITON_INTERPRET=1``, which ``tests/conftest.py``
sets on machines without a GPU, before anything imports Triton), at tiny shapes; on a GPU the same
tests run the compiled kernels at real shapes. The deterministic backward (the value gradient summed
without atomics under ``torch.use_deterministic_algorithms(True)``) is checked bit for bit.
"""
from __future__ import annotations

import contextlib
import warnings

import pytest
import torch
import triton

from visiontf.nn import ms_deform_triton
from visiontf.nn.ms_deform_attn import MSDeformAttn
from visiontf.nn.ms_deform_core import core_grid_sample, fused_kernel_runs, ms_deform_attn_core
from visiontf.nn.ms_deform_gather import core_gather, gather_core
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
    # grid_sample's CPU semantics: a non-finite location makes its head's output NaN. CUDA's grid_sample drops such
    # a sample instead (finite output; seen on an H200, 2026-11-28), so the reference is computed on the CPU
    expected = core_grid_sample(value.cpu(), shapes, loc.cpu(), attn.cpu())
    assert torch.equal(out.isnan().cpu(), expected.isnan()) and out.isnan().any()
    torch.testing.assert_close(out.nan_to_num().cpu(), expected.nan_to_num(), atol=1e-5, rtol=1e-5)


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


@contextlib.contextmanager
def deterministic(on: bool = True):
    """``torch.use_deterministic_algorithms(on)`` inside the block, the process's setting restored after."""
    before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(on)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])


def test_gather_runs_the_kernels_on_cuda_only():
    """The default method picks the fused kernels for CUDA tensors, not for CPU ones; under determinism too
    (their backward is then the atomic-free one)."""
    with deterministic():
        assert not fused_kernel_runs(torch.zeros(1))
    assert not fused_kernel_runs(torch.zeros(1))
    if torch.cuda.is_available():
        assert fused_kernel_runs(torch.zeros(1, device="cuda"))
        with deterministic():
            assert fused_kernel_runs(torch.zeros(1, device="cuda"))


# ---- the deterministic backward ----------------------------------------------------------------------

def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit for bit: ``torch.equal`` takes -0.0 for 0.0 and NaN for unequal to itself."""
    ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.contiguous().view(ints[a.element_size()]), b.contiguous().view(ints[b.element_size()]))


def _forward_backward(value, shapes, loc, attn, grad, core=None) -> list[torch.Tensor]:
    """Output and the gradients of value, locations and attention weights of ``core`` (the Triton core)."""
    leaves = [t.clone().requires_grad_() for t in (value, loc, attn)]
    out = (core or ms_deform_triton.triton_core)(leaves[0], shapes, leaves[1], leaves[2])
    out.backward(grad)
    return [out.detach()] + [t.grad for t in leaves]


NAMES = ("output", "value gradient", "location gradient", "attention-weight gradient")
#: DETERMINISTIC_BLOCKS overrides: query rows per program of both kernels, and value rows and channels per
#: program of the value gradient's sum (channel blocks of 2 tile D = 6 exactly, 4 and 8 do not)
BLOCKS = [
    {"BLOCK_Q_FORWARD": 2, "BLOCK_Q_BACKWARD": 2, "BLOCK_V": 16, "BLOCK_D": 2},
    {"BLOCK_Q_FORWARD": 16, "BLOCK_Q_BACKWARD": 4, "BLOCK_V": 4, "BLOCK_D": 4},
    {"BLOCK_Q_BACKWARD": 16, "BLOCK_V": 128, "BLOCK_D": 8},
]


def _deterministic_case(device):
    """(shapes, value, loc, attn, output gradient): tiny on the CPU, the real encoder's levels on CUDA."""
    shapes, M, D, P = TINY[0] if device == "cpu" else REAL[0]
    value, loc, attn = _inputs(shapes, M, D, P, torch.float32, device, Q=7 if device == "cpu" else 900)
    grad = torch.randn(value.shape[0], loc.shape[1], M * D, generator=torch.Generator().manual_seed(3)).to(device)
    return shapes, value, loc, attn, grad


@pytest.mark.parametrize("device", DEVICES)
def test_deterministic_backward_is_the_same_bit_for_bit_across_runs_and_block_sizes(kernels, device, monkeypatch):
    """Under ``torch.use_deterministic_algorithms(True)``: two runs, and runs at other block sizes of both
    kernels and of the value gradient's sum, give the same output and gradients bit for bit."""
    module = kernels(device)
    shapes, value, loc, attn, grad = _deterministic_case(device)
    summed = []  # the atomic-free value gradient runs under the switch, and only there
    real_sum = module._summed_value_grad
    monkeypatch.setattr(module, "_summed_value_grad", lambda *args: summed.append(1) or real_sum(*args))
    _forward_backward(value, shapes, loc, attn, grad)
    assert not summed
    with deterministic():
        first = _forward_backward(value, shapes, loc, attn, grad)
        assert summed
        repeats = [_forward_backward(value, shapes, loc, attn, grad)]
        other_blocks = []
        for blocks in BLOCKS:
            with monkeypatch.context() as patch:
                for key, size in blocks.items():
                    patch.setitem(module.DETERMINISTIC_BLOCKS, key, size)
                other_blocks.append(_forward_backward(value, shapes, loc, attn, grad))
    assert first[1].abs().sum() > 0 and first[2].abs().sum() > 0
    for run in repeats:
        for name, a, b in zip(NAMES, first, run):
            assert same_bits(a, b), f"{name} differs between two runs"
    # The value gradient's order of addition is the stable sort's whatever the blocks. On a GPU the location
    # and weight gradients' channel sums are reduced across threads in a layout that follows the tile (why
    # the blocks are fixed in deterministic mode), so there only the value gradient is compared.
    compared = NAMES if device == "cpu" else ("value gradient",)
    for blocks, run in zip(BLOCKS, other_blocks):
        for name, a, b in zip(NAMES, first, run):
            if name in compared:
                assert same_bits(a, b), f"{name} differs at blocks {blocks}"


def test_atomic_value_gradient_moves_with_the_block_size(kernels, monkeypatch):
    """The control of the test above: with atomics, another block size adds the value gradient's terms in
    another order, and its bits change (in the interpreter; on a GPU they change from run to run)."""
    module = kernels("cpu")
    shapes, value, loc, attn, grad = _deterministic_case("cpu")
    grads = []
    for block_q in (2, 32):
        monkeypatch.setattr(module._backward_kernel, "configs", [triton.Config({"BLOCK_Q": block_q}, num_warps=4)])
        grads.append(_forward_backward(value, shapes, loc, attn, grad)[1])
    torch.testing.assert_close(grads[0], grads[1], atol=1e-5, rtol=1e-5)
    assert not same_bits(grads[0], grads[1])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_deterministic_backward_equals_the_atomic_one_and_the_pytorch_cores(kernels, device, dtype):
    """Output and gradients of the deterministic backward: the atomic one's within float32 rounding (the same
    terms summed in another order), and the ``grid_sample`` and gather cores' as the atomic one is."""
    kernels(device)
    out_tol, value_tol = TOLERANCE[dtype]
    if device == "cuda":
        value_tol = max(value_tol, 1e-4)  # the atomic sums: thousands of terms in no fixed order
    cases = _cases(device) if dtype == torch.float32 else _cases(device)[:1]
    for case, (shapes, M, D, P) in enumerate(cases):
        value, loc, attn = _inputs(shapes, M, D, P, dtype, device, Q=7 if device == "cpu" else 900, seed=case)
        grad = torch.randn(value.shape[0], loc.shape[1], M * D, generator=torch.Generator().manual_seed(case)).to(device, dtype)
        atomic = _forward_backward(value, shapes, loc, attn, grad)
        with deterministic():
            ours = _forward_backward(value, shapes, loc, attn, grad)
        assert [t.dtype for t in ours] == [t.dtype for t in atomic]
        torch.testing.assert_close(ours[0], atomic[0], atol=0, rtol=0)  # the same forward kernel
        # float32 sums rounded to the value's dtype: one unit of a half-precision dtype apart at most
        torch.testing.assert_close(ours[1].float(), atomic[1].float(), atol=value_tol, rtol=value_tol)
        torch.testing.assert_close(ours[2], atomic[2], atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(ours[3], atomic[3], atol=1e-6, rtol=1e-6)
        # the PyTorch cores in float32 from the same (rounded) inputs
        for core in (core_grid_sample, core_gather):
            ref = _forward_backward(value.float(), shapes, loc, attn, grad.float(), core)
            torch.testing.assert_close(ours[0].float(), ref[0], atol=out_tol, rtol=out_tol)
            torch.testing.assert_close(ours[1].float(), ref[1], atol=value_tol, rtol=value_tol)
            scale = 1e-4 if device == "cpu" else 1e-3
            torch.testing.assert_close(ours[2], ref[2], atol=scale, rtol=1e-4)
            torch.testing.assert_close(ours[3], ref[3], atol=scale, rtol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
def test_deterministic_backward_gradcheck_float64(kernels, device):
    """Finite differences agree with the deterministic backward, and gradcheck's second backward (its
    reentrancy check, ``nondet_tol=0``) gives the same gradients exactly."""
    module = kernels(device)
    shapes, M, D, P = [(3, 4), (2, 1)], 2, 3, 2
    value, loc, attn = _inputs(shapes, M, D, P, torch.float64, device, N=1, Q=3)
    args = [t.double().requires_grad_() for t in (value, loc.double() + 0.013, attn)]
    with deterministic():
        assert torch.autograd.gradcheck(lambda v, l, a: module.triton_core(v, shapes, l, a), args, fast_mode=True, nondet_tol=0.0)


@pytest.mark.parametrize("device", DEVICES)
def test_deterministic_backward_with_packed_tokens(kernels, device, monkeypatch):
    """The encoder's packed tokens (each row's image read from a table): the deterministic backward equals
    the gather core's packed gradients, and is the same bit for bit at other value-gradient blocks."""
    module = kernels(device)
    shapes, M, D, P = ([(4, 5), (2, 3)], 2, 4, 2) if device == "cpu" else (REAL[0][0], 8, 32, 4)
    N, S, J = 2, sum(h * w for h, w in shapes), len(shapes) * P
    g = torch.Generator().manual_seed(4)
    mask = torch.zeros(N, S, dtype=torch.bool)
    mask[1, S // 2:] = True  # the second image is half padding
    packed = PackedTokens.from_mask(mask.to(device))
    T = int((~mask).sum())
    value = torch.randn(1, T, M, D, generator=g).to(device)
    size = torch.tensor([(w, h) for h, w in shapes], dtype=torch.float32).repeat_interleave(P, 0).t()  # (2, J)
    pix = ((torch.rand(1, T, 2, M, J, generator=g) * 1.4 - 0.2) * size[:, None, :] - 0.5).to(device)
    attn = torch.rand(1, T, M, J, generator=g).to(device)
    grad = torch.randn(1, T, M * D, generator=g).to(device)

    def run(core):
        leaves = [t.clone().requires_grad_() for t in (value, pix, attn)]
        out = core(leaves[0], shapes, leaves[1], leaves[2], packed)
        out.backward(grad)
        return [out.detach()] + [t.grad for t in leaves]

    expected = run(gather_core)
    with deterministic():
        ours = run(module.fused_core)
        with monkeypatch.context() as patch:
            patch.setitem(module.DETERMINISTIC_BLOCKS, "BLOCK_V", 2)
            patch.setitem(module.DETERMINISTIC_BLOCKS, "BLOCK_D", 2)
            other = run(module.fused_core)
    tol = 1e-5 if device == "cpu" else 1e-4
    for name, a, b in zip(NAMES, ours, expected):
        torch.testing.assert_close(a, b, atol=tol, rtol=tol, msg=name)
    assert same_bits(ours[1], other[1])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: the atomic backward is deterministic in the interpreter")
def test_gather_method_is_deterministic_on_cuda(kernels):
    """``ms_deform_attn_core(method="gather")`` on CUDA under deterministic algorithms: the Triton kernels
    with their atomic-free backward, the same bits in two runs at the real encoder's size (where atomics
    add thousands of terms per value row)."""
    kernels("cuda")
    shapes, value, loc, attn, grad = _deterministic_case("cuda")
    with deterministic():
        assert fused_kernel_runs(value)
        runs = [_forward_backward(value, shapes, loc, attn, grad, lambda v, s, l, a: ms_deform_attn_core(v, s, l, a, "gather"))
                for _ in range(2)]
    for name, a, b in zip(NAMES, *runs):
        assert same_bits(a, b), f"{name} differs between two runs"
