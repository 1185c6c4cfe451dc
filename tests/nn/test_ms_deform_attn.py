"""Multi-scale deformable attention: both cores against an obvious loop, the original's results and each other.

The loop below is the definition: bilinear interpolation of each level's map at
``loc * (W, H) - 0.5`` (``grid_sample``'s align_corners=False), corners outside the map reading
zero, weighted by the attention weights and summed. What the original's ``MSDeformAttn`` and its
pure-PyTorch core ``ms_deform_attn_core_pytorch`` computed (outputs and gradients, float32 and float64,
padded values, 2-d and 4-d references, levels smaller than the sampling footprint) is the recorded
``ms_deform_attn`` fixture (``scripts/fixtures/make_deformable_detr.py``). Cost: about 3 s.
"""
from __future__ import annotations

import math

import pytest
import torch
from deformable_helpers import fixture, max_diff

from visiontf.nn import MSDeformAttn, ms_deform_attn_core

SHAPES = [(5, 6), (3, 4), (2, 2), (1, 1)]
METHODS = ("gather", "grid_sample")
DTYPES = {"float32": torch.float32, "float64": torch.float64}
#: largest difference to the original's results: outputs, then gradients relative to each one's largest value
TOL = {"float32": 1e-5, "float64": 1e-12}
GRAD_TOL = {"float32": 1e-5, "float64": 1e-11}


def loop_reference(value, shapes, loc, attn):
    """The obvious definition, one sample and one corner at a time (float64 Python loops)."""
    N, Q, M, L, P = loc.shape[:5]
    D = value.shape[-1]
    starts = [sum(h * w for h, w in shapes[:lvl]) for lvl in range(L)]
    out = torch.zeros(N, Q, M, D, dtype=torch.float64)
    for n in range(N):
        for q in range(Q):
            for m in range(M):
                for lvl, (h, w) in enumerate(shapes):
                    for p in range(P):
                        x = loc[n, q, m, lvl, p, 0].item() * w - 0.5
                        y = loc[n, q, m, lvl, p, 1].item() * h - 0.5
                        x0, y0 = math.floor(x), math.floor(y)
                        for cy, wy in ((y0, y0 + 1 - y), (y0 + 1, y - y0)):
                            for cx, wx in ((x0, x0 + 1 - x), (x0 + 1, x - x0)):
                                if 0 <= cx < w and 0 <= cy < h:
                                    row = value[n, starts[lvl] + cy * w + cx, m].double()
                                    out[n, q, m] += attn[n, q, m, lvl, p].item() * wy * wx * row
    return out.view(N, Q, M * D)


def _inputs(N=2, Q=4, M=2, D=3, P=2, shapes=SHAPES, lo=-0.3, hi=1.3, dtype=torch.float64, seed=0):
    """Value, locations partly outside [0, 1] (points off the map) and softmax weights."""
    g = torch.Generator().manual_seed(seed)
    S, L = sum(h * w for h, w in shapes), len(shapes)
    value = torch.randn(N, S, M, D, generator=g, dtype=dtype)
    loc = lo + (hi - lo) * torch.rand(N, Q, M, L, P, 2, generator=g, dtype=dtype)
    attn = torch.rand(N, Q, M, L * P, generator=g, dtype=dtype).softmax(-1).view(N, Q, M, L, P)
    return value, loc, attn


@pytest.mark.parametrize("method", METHODS)
def test_cores_equal_the_loop_definition(method):
    value, loc, attn = _inputs()
    expected = loop_reference(value, SHAPES, loc, attn)
    got = ms_deform_attn_core(value, SHAPES, loc, attn, method)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)


def _case(name: str) -> tuple[dict, list[tuple[int, int]]]:
    fx = fixture("ms_deform_attn")
    settings = fx.meta["settings"][name]
    return settings, [tuple(s) for s in settings["spatial_shapes"]]


def _close(ours: torch.Tensor, expected: torch.Tensor, tol: float) -> bool:
    return max_diff(ours, expected) <= tol * max(1.0, expected.abs().max().item())


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("name", ["a", "b"])
def test_cores_equal_the_original_core(name, method, dtype):
    """Output and the gradients of value, locations (partly off the map) and weights, as the original's core gave them."""
    fx = fixture("ms_deform_attn")
    _, shapes = _case(name)
    record = fx.outputs[dtype]
    leaves = [fx.inputs[f"{name}.core.{k}"].to(DTYPES[dtype]).clone().requires_grad_() for k in ("value", "locations", "weights")]
    out = ms_deform_attn_core(leaves[0], shapes, leaves[1], leaves[2], method)
    assert _close(out, record[f"{name}.core.output"], TOL[dtype])
    out.backward(fx.inputs[f"{name}.core.grad_output"].to(DTYPES[dtype]))
    for key, leaf in zip(("value", "locations", "weights"), leaves):
        assert _close(leaf.grad, record[f"{name}.core.grad.{key}"], GRAD_TOL[dtype]), key


@pytest.mark.parametrize("method", METHODS)
def test_gradcheck_float64(method):
    value, loc, attn = _inputs(N=1, Q=3, M=2, D=2, P=2, seed=2)
    inputs = tuple(t.clone().requires_grad_() for t in (value, loc, attn))
    assert torch.autograd.gradcheck(lambda v, l, a: ms_deform_attn_core(v, SHAPES, l, a, method), inputs, eps=1e-6, atol=1e-7)


@pytest.mark.parametrize("Q", [3, 400])  # few samples (sparse table gradient) and many (dense)
def test_gather_gradients_equal_grid_sample(Q):
    shapes = [(4, 5), (2, 3)]
    value, loc, attn = _inputs(N=2, Q=Q, M=2, D=3, P=2, shapes=shapes, seed=3)
    grad = torch.randn(2, Q, 6, dtype=torch.float64)
    grads = []
    for method in METHODS:
        inputs = tuple(t.clone().requires_grad_() for t in (value, loc, attn))
        ms_deform_attn_core(*inputs[:1], shapes, *inputs[1:], method).backward(grad)
        grads.append([t.grad for t in inputs])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-11)


def test_points_outside_the_map_read_zero():
    value, loc, attn = _inputs(seed=4)
    far = torch.tensor([-5.0, 1e30])
    for loc_far in (loc * 0 + far[0], loc * 0 + far[1], loc * 0 - 0.51):  # -0.51 * W - 0.5 < -1 even at W = 1
        for method in METHODS:
            assert ms_deform_attn_core(value, SHAPES, loc_far, attn, method).abs().max() == 0


def test_non_finite_locations_give_nan_only_where_they_are():
    value, loc, attn = _inputs(seed=5)
    loc[0, 1, 0, 0, 0, 0] = float("nan")
    loc[1, 2, 1, 1, 1, 1] = float("inf")
    outs = [ms_deform_attn_core(value, SHAPES, loc, attn, method) for method in METHODS]
    D = value.shape[-1]
    for out in outs:
        bad = ~torch.isfinite(out)
        assert bad[0, 1, :D].all() and bad[1, 2, D:].all()  # that query's head only
        assert bad.sum() == 2 * D
    torch.testing.assert_close(outs[0], outs[1], equal_nan=True, rtol=0, atol=1e-12)


def _module(d=16, L=4, M=4, P=2, seed=0) -> MSDeformAttn:
    torch.manual_seed(seed)
    ours = MSDeformAttn(d, L, M, P).double()
    with torch.no_grad():  # non-trivial offsets and weights (they start at zero)
        ours.sampling_offsets.weight.normal_(0, 0.3)
        ours.attention_weights.weight.normal_(0, 0.3)
    return ours


def test_initialisation_is_the_original():
    fx = fixture("ms_deform_attn")
    init = fx.meta["init"]
    torch.manual_seed(0)
    ours = MSDeformAttn(init["d_model"], init["n_levels"], init["n_heads"], init["n_points"])
    assert torch.equal(ours.sampling_offsets.bias, fx.outputs["float32"]["init.sampling_offsets.bias"])
    bias = ours.sampling_offsets.bias.view(8, 3, 4, 2)
    assert torch.equal(bias[0, 0, :, 0], torch.tensor([1.0, 2.0, 3.0, 4.0]))  # head 0 looks right, point i at i+1 px
    assert bias[2, 0, 0].tolist() == pytest.approx([0.0, 1.0], abs=1e-6)  # head 2 of 8 looks down
    for linear in (ours.sampling_offsets, ours.attention_weights):
        assert linear.weight.abs().max() == 0
    assert ours.attention_weights.bias.abs().max() == 0 and ours.value_proj.bias.abs().max() == 0


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("coords", [2, 4])
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("name", ["a", "b"])
def test_module_equals_the_original_module_with_padding(name, method, coords, dtype):
    """Point and box references, padded values; forward and every parameter's gradient, as the original's module gave them."""
    fx = fixture("ms_deform_attn")
    settings, shapes = _case(name)
    record = fx.outputs[dtype]
    ours = MSDeformAttn(settings["d_model"], len(shapes), settings["n_heads"], settings["n_points"], method=method)
    ours.load_state_dict({k.removeprefix(f"{name}."): v.float() for k, v in fx.weights.items() if k.startswith(f"{name}.")})
    ours.to(DTYPES[dtype])
    inp = {k.removeprefix(f"{name}."): v.to(DTYPES[dtype]) if v.is_floating_point() else v
           for k, v in fx.inputs.items() if k.startswith(f"{name}.")}
    out = ours(inp["query"], inp[f"reference_points_{coords}"], inp["value"], shapes, inp["padding_mask"])
    assert _close(out, record[f"{name}.module_{coords}.output"], TOL[dtype])
    out.backward(inp["grad_output"])
    for pname, p in ours.named_parameters():
        assert _close(p.grad, record[f"{name}.module_{coords}.grad.{pname}"], GRAD_TOL[dtype]), pname


def test_padded_values_are_zeroed():
    ours = _module()
    N, Q, S = 1, 6, sum(h * w for h, w in SHAPES)
    query, value = torch.randn(N, Q, 16, dtype=torch.float64), torch.randn(N, S, 16, dtype=torch.float64)
    refs = torch.rand(N, Q, 4, 2, dtype=torch.float64)
    pad = torch.zeros(N, S, dtype=torch.bool)
    pad[0, 10:25] = True
    changed = value.clone()
    changed[pad] = 1e6
    for method in METHODS:
        ours.method = method
        torch.testing.assert_close(ours(query, refs, changed, SHAPES, pad), ours(query, refs, value, SHAPES, pad))
        assert not torch.allclose(ours(query, refs, changed, SHAPES), ours(query, refs, value, SHAPES))


def test_bad_shapes_name_the_problem():
    ours = _module()
    query, value = torch.randn(1, 3, 16), torch.randn(1, sum(h * w for h, w in SHAPES), 16)
    ours.float()
    with pytest.raises(ValueError, match="n_levels=4"):
        ours(query, torch.rand(1, 3, 4, 2), value, SHAPES[:3])
    with pytest.raises(ValueError, match="end in 2 .* or 4"):
        ours(query, torch.rand(1, 3, 4, 3), value, SHAPES)
    with pytest.raises(ValueError, match="hold 47 positions, but value has S = 70"):
        ms_deform_attn_core(torch.randn(1, 70, 2, 8), SHAPES, torch.rand(1, 3, 2, 4, 2, 2), torch.rand(1, 3, 2, 4, 2))


@pytest.mark.parametrize("method", METHODS)
def test_packed_tokens_equal_the_padded_batch(method):
    """Self-attention over the unpadded tokens only gives the padded batch's result at those tokens."""
    from visiontf.nn.packed_tokens import PackedTokens

    ours = _module()
    ours.method = method
    N, S = 2, sum(h * w for h, w in SHAPES)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(N, S, 16, generator=g, dtype=torch.float64)
    refs = torch.rand(N, S, 4, 2, generator=g, dtype=torch.float64)
    pad = torch.rand(N, S, generator=g) < 0.3
    packed = PackedTokens.from_mask(pad)
    full = ours(x, refs, x, SHAPES, pad)
    got = ours(packed.pack(x)[None], packed.pack(refs)[None], packed.pack(x)[None], SHAPES, packed=packed)
    torch.testing.assert_close(got[0], packed.pack(full), rtol=0, atol=1e-12)
    assert torch.equal(packed.unpack(packed.pack(x))[~pad], x[~pad]) and packed.unpack(packed.pack(x))[pad].abs().max() == 0


# ---- determinism of the gather core --------------------------------------------------------------

def _bits(t: torch.Tensor) -> torch.Tensor:
    """The float32 tensor's bits (``torch.equal`` takes -0.0 for 0.0 and NaN for unequal to itself)."""
    return t.contiguous().view(torch.int32)


def _gather_forward_backward(value, shapes, loc, attn, grad, threads: int) -> list[torch.Tensor]:
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        assert torch.get_num_threads() == threads
        leaves = [t.clone().requires_grad_() for t in (value, loc, attn)]
        out = ms_deform_attn_core(leaves[0], shapes, leaves[1], leaves[2], "gather")
        out.backward(grad)
    finally:
        torch.set_num_threads(before)
    return [_bits(t) for t in (out.detach(), *(leaf.grad for leaf in leaves))]


@pytest.mark.parametrize("queries", ["encoder", "decoder"])
def test_gather_core_is_the_same_bit_for_bit_across_runs_and_thread_counts(queries):
    """The gather core's claim, deterministic by construction (a stable sort, per-row sums, no atomics): output
    and the three gradients are the same bits over repeated runs on 1 and on 2 threads, for the table
    gradient's dense per-key sums (every position queries, as in the encoder) and its sparse ones (few queries)."""
    from visiontf.nn.ms_deform_tables import bordered_layout

    shapes = [(8, 8), (4, 4), (2, 2)]
    N, M, D, P = 2, 2, 8, 4
    S = sum(h * w for h, w in shapes)
    Q = S if queries == "encoder" else 5
    # the table gradient's two paths: dense sums when the samples number at least 4x the table rows
    rows = N * bordered_layout(tuple(shapes), torch.device("cpu"))[3] * M
    assert (N * Q * M * len(shapes) * P >= 4 * rows) == (queries == "encoder")
    value, loc, attn = _inputs(N=N, Q=Q, M=M, D=D, P=P, shapes=shapes, dtype=torch.float32, seed=6)
    grad = torch.randn(N, Q, M * D, generator=torch.Generator().manual_seed(7))
    runs = {threads: [_gather_forward_backward(value, shapes, loc, attn, grad, threads) for _ in range(2)] for threads in (1, 2)}
    first = runs[1][0]
    for threads, repeats in runs.items():
        for run in repeats:
            for name, a, b in zip(("output", "value gradient", "location gradient", "attention-weight gradient"), first, run):
                assert torch.equal(a, b), f"{name} differs ({threads} threads)"


def test_two_threads_do_change_a_float_sum():
    """The control of the test above: in this process 2 threads do split a float32 reduction, and its bits change
    (for most inputs: five sums of 4M numbers, of which 4 change here)."""
    x = torch.randn(5, 4_000_000, generator=torch.Generator().manual_seed(8))
    before = torch.get_num_threads()
    try:
        sums = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            sums.append(_bits(torch.stack([row.sum() for row in x])))
    finally:
        torch.set_num_threads(before)
    assert not torch.equal(*sums)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device (the gather core's CUDA run needs one)")
def test_gather_core_is_deterministic_on_cuda():
    """On CUDA under ``torch.use_deterministic_algorithms(True)`` (what the "gather" method runs there without
    Triton): none of the gather core's operations is refused, and two runs give the same bits."""
    from visiontf.nn.ms_deform_gather import core_gather

    shapes = [(100, 152), (50, 76), (25, 38), (13, 19)]
    value, loc, attn = _inputs(N=2, Q=900, M=8, D=32, P=4, shapes=shapes, dtype=torch.float32, seed=9)
    value, loc, attn = value.cuda(), loc.cuda(), attn.cuda()
    grad = torch.randn(2, 900, 256, device="cuda")
    before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        runs = []
        for _ in range(2):
            leaves = [t.clone().requires_grad_() for t in (value, loc, attn)]
            out = core_gather(leaves[0], shapes, leaves[1], leaves[2])
            out.backward(grad)
            runs.append([_bits(t) for t in (out.detach(), *(leaf.grad for leaf in leaves))])
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
    for a, b in zip(*runs):
        assert torch.equal(a, b)


#: maps large enough that, without gradients, the module samples the unprojected value (see the test below)
WIDE_SHAPES = [(16, 20), (8, 10), (4, 5)]


@pytest.mark.parametrize("sampling", ["bilinear", "discrete"])
@pytest.mark.parametrize("points", [2, (3, 1, 2)])
@pytest.mark.parametrize("coords", [2, 4])
def test_sampling_before_projecting_equals_projecting_first(points, coords, sampling, monkeypatch):
    """Without gradients a decoder's queries sample the unprojected value and project the sums (a column of ones
    carries the bias's weight): the same output as the projection first, padded cells and cells off the map included,
    for every sampling option. The encoder's case (a query per value row) keeps the projection first."""
    if sampling == "discrete" and isinstance(points, int):
        points = (points,) * len(WIDE_SHAPES)
    torch.manual_seed(0)
    attn = MSDeformAttn(32, len(WIDE_SHAPES), 4, points, sampling=sampling).double()
    with torch.no_grad():
        for p in attn.parameters():
            p.normal_(0, 0.3)
    S = sum(h * w for h, w in WIDE_SHAPES)
    query, value = torch.randn(2, 5, 32, dtype=torch.float64), torch.randn(2, S, 32, dtype=torch.float64)
    refs = -0.1 + 1.2 * torch.rand(2, 5, len(WIDE_SHAPES), coords, dtype=torch.float64)
    pad = torch.zeros(2, S, dtype=torch.bool)
    pad[1, 200:320] = True  # the right part of image 1's first map, and the start of its second
    late = []
    sample_then_project = attn._sample_then_project
    monkeypatch.setattr(attn, "_sample_then_project", lambda *a: late.append(1) or sample_then_project(*a))
    projected_first = attn(query, refs, value, WIDE_SHAPES, pad)  # gradients on: the projection first
    assert not late
    with torch.no_grad():
        sampled_first = attn(query, refs, value, WIDE_SHAPES, pad)
    assert late == [1]
    torch.testing.assert_close(sampled_first, projected_first.detach(), rtol=0, atol=1e-12)
    with torch.no_grad():  # the bias's weight is each head's weight on valid cells: it differs from 1 here
        sums = attn(query, refs, value.new_zeros(value.shape), WIDE_SHAPES, pad)
    assert not torch.allclose(sums, attn.output_proj(attn.value_proj.bias.expand(2, 5, 32)))
    calls = len(late)
    with torch.no_grad():
        attn(value, torch.rand(2, S, len(WIDE_SHAPES), coords, dtype=torch.float64), value, WIDE_SHAPES, pad)
    assert len(late) == calls
