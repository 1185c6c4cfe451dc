"""RT-DETRv2's options of the shared multi-scale deformable attention: points per level and discrete sampling.

Both are options of :class:`visiontf.nn.MSDeformAttn` and :func:`visiontf.nn.ms_deform_core.ms_deform_attn_core`,
run by every core (``gather``; ``triton`` in Triton's interpreter on CPU tensors, compiled on CUDA; ``grid_sample``
and its ``index_select`` form for discrete sampling). Checked against loop definitions in float64, with gradients;
the modules built without them are the existing ones (``tests/nn/test_ms_deform_attn.py``, ``test_ms_deform_triton.py``).
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from rtdetr_helpers import one_thread  # noqa: F401 (a module fixture: one torch thread)

from visiontf.nn import MSDeformAttn
from visiontf.nn import ms_deform_triton as triton_module
from visiontf.nn.ms_deform_core import ms_deform_attn_core

SHAPES = [(5, 7), (3, 4), (2, 2)]
POINTS = [(4, 4, 4), (3, 1, 2)]
METHODS = ["gather", "grid_sample", "triton"]


def _triton_runs() -> bool:
    return triton_module.INTERPRETED or torch.cuda.is_available()


def _device(method: str) -> str:
    """Where a core runs in these tests: the compiled Triton kernels take CUDA tensors, the interpreted ones CPU tensors."""
    return "cuda" if method == "triton" and not triton_module.INTERPRETED else "cpu"


def loop_reference(value, shapes, loc, attn, points, discrete=False):
    """The definition, one sample at a time: bilinear (grid_sample's convention) or the one cell of discrete sampling."""
    N, Q, M, J, _ = loc.shape
    D = value.shape[-1]
    starts = [sum(h * w for h, w in shapes[:lvl]) for lvl in range(len(shapes))]
    levels = [lvl for lvl, p in enumerate(points) for _ in range(p)]
    out = torch.zeros(N, Q, M, D, dtype=torch.float64)
    for n in range(N):
        for q in range(Q):
            for m in range(M):
                for j in range(J):
                    lvl = levels[j]
                    h, w = shapes[lvl]
                    a = attn[n, q, m, j].item()
                    if discrete:
                        cx = min(max(math.floor(loc[n, q, m, j, 0].item() * w + 0.5), 0), w - 1)
                        cy = min(max(math.floor(loc[n, q, m, j, 1].item() * h + 0.5), 0), h - 1)
                        out[n, q, m] += a * value[n, starts[lvl] + cy * w + cx, m].double()
                        continue
                    x, y = loc[n, q, m, j, 0].item() * w - 0.5, loc[n, q, m, j, 1].item() * h - 0.5
                    x0, y0 = math.floor(x), math.floor(y)
                    for cy, wy in ((y0, y0 + 1 - y), (y0 + 1, y - y0)):
                        for cx, wx in ((x0, x0 + 1 - x), (x0 + 1, x - x0)):
                            if 0 <= cx < w and 0 <= cy < h:
                                out[n, q, m] += a * wy * wx * value[n, starts[lvl] + cy * w + cx, m].double()
    return out.view(N, Q, M * D)


def _inputs(points, N=2, Q=3, M=2, D=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    S, J = sum(h * w for h, w in SHAPES), sum(points)
    value = torch.randn(N, S, M, D, generator=g, dtype=torch.float64)
    loc = -0.3 + 1.6 * torch.rand(N, Q, M, J, 2, generator=g, dtype=torch.float64)
    attn = torch.rand(N, Q, M, J, generator=g, dtype=torch.float64).softmax(-1)
    return value, loc, attn


@pytest.mark.parametrize("sampling", ["bilinear", "discrete"])
@pytest.mark.parametrize("points", POINTS, ids=str)
@pytest.mark.parametrize("method", METHODS)
def test_cores_equal_the_loop_definition_with_gradients(method, points, sampling):
    if method == "triton" and not _triton_runs():
        pytest.skip("Triton runs on CUDA or in its interpreter (TRITON_INTERPRET=1)")
    value, loc, attn = _inputs(points)
    expected = loop_reference(value, SHAPES, loc, attn, points, sampling == "discrete")
    device = _device(method)
    ours = [t.clone().to(device).requires_grad_() for t in (value, loc, attn)]
    out = ms_deform_attn_core(ours[0], SHAPES, ours[1], ours[2], method, points, sampling)
    assert (out.cpu() - expected).abs().max() < 1e-12
    reference = [t.clone().requires_grad_() for t in (value, loc, attn)]
    ms_deform_attn_core(reference[0], SHAPES, reference[1], reference[2], "grid_sample", points, sampling).pow(2).sum().backward()
    out.pow(2).sum().backward()
    for a, b in zip(ours, reference):
        grad_a = torch.zeros_like(b) if a.grad is None else a.grad.cpu()
        grad_b = torch.zeros_like(b) if b.grad is None else b.grad
        assert (grad_a - grad_b).abs().max() < 1e-10
    if sampling == "discrete":  # a cell index has no location gradient
        assert ours[1].grad is None or not ours[1].grad.any()


@pytest.mark.parametrize("points", POINTS, ids=str)
def test_per_level_points_equal_the_loop_with_float64_gradcheck(points):
    value, loc, attn = _inputs(points, M=1, D=2)
    value, loc, attn = value[:1], loc[:1, :2], attn[:1, :2]
    loc = loc.clamp(0.05, 0.95)  # away from the kinks of bilinear interpolation at cell borders
    check = lambda v, l, a: ms_deform_attn_core(v, SHAPES, l, a, "gather", points)  # noqa: E731
    assert torch.autograd.gradcheck(check, tuple(t.clone().requires_grad_() for t in (value, loc, attn)), atol=1e-7)


def _module_pair(points_int: int, levels: int = 3) -> tuple[MSDeformAttn, MSDeformAttn]:
    torch.manual_seed(0)
    uniform = MSDeformAttn(16, levels, 2, points_int).double()
    for p in uniform.parameters():
        torch.nn.init.normal_(p, std=0.3)
    per_level = MSDeformAttn(16, levels, 2, (points_int,) * levels).double()
    per_level.load_state_dict(uniform.state_dict())
    return uniform, per_level


@pytest.mark.parametrize("coords", [2, 4])
@pytest.mark.parametrize("method", ["gather", "grid_sample"])
def test_one_count_per_level_equals_the_single_count(method, coords):
    """(4, 4, 4) is RT-DETRv2's layout of RT-DETR's 4 points: the same parameters and outputs."""
    uniform, per_level = _module_pair(4)
    g = torch.Generator().manual_seed(1)
    S = sum(h * w for h, w in SHAPES)
    query, value = torch.randn(2, 5, 16, generator=g, dtype=torch.float64), torch.randn(2, S, 16, generator=g, dtype=torch.float64)
    ref = torch.rand(2, 5, 3, coords, generator=g, dtype=torch.float64) * 0.6 + 0.2
    for m in (uniform, per_level):
        m.method = method
    assert (uniform(query, ref, value, SHAPES) - per_level(query, ref, value, SHAPES)).abs().max() < 1e-13
    loc_u, w_u = uniform.sampling(query, ref, SHAPES)
    loc_p, w_p = per_level.sampling(query, ref, SHAPES)
    assert (loc_u.flatten(3, 4) - loc_p).abs().max() < 1e-15 and (w_u.flatten(3, 4) - w_p).abs().max() < 1e-15


@pytest.mark.parametrize("sampling", ["bilinear", "discrete"])
@pytest.mark.parametrize("coords", [2, 4])
def test_module_options_give_the_same_values_on_every_core(coords, sampling):
    torch.manual_seed(0)
    module = MSDeformAttn(16, 3, 2, (3, 1, 2), sampling=sampling, offset_scale=0.7).double()
    for p in module.parameters():
        torch.nn.init.normal_(p, std=0.3)
    g = torch.Generator().manual_seed(2)
    S = sum(h * w for h, w in SHAPES)
    query, value = torch.randn(2, 5, 16, generator=g, dtype=torch.float64), torch.randn(2, S, 16, generator=g, dtype=torch.float64)
    ref = torch.rand(2, 5, 3, coords, generator=g, dtype=torch.float64) * 0.6 + 0.2
    mask = torch.zeros(2, S, dtype=torch.bool)
    mask[1, -5:] = True
    outs = {}
    for method in METHODS if _triton_runs() else METHODS[:2]:
        device = _device(method)
        module.to(device).method = method
        outs[method] = module(query.to(device), ref.to(device), value.to(device), SHAPES, mask.to(device)).cpu()
        module.cpu()
    loc, weights = module.sampling(query, ref, SHAPES)
    v = module.value_proj(value).masked_fill(mask[..., None], 0).view(2, S, 2, 8)
    expected = module.output_proj(loop_reference(v, SHAPES, loc, weights, (3, 1, 2), sampling == "discrete"))
    for method, out in outs.items():
        assert (out - expected).abs().max() < 1e-12, method
    assert module.sampling_offsets.weight.requires_grad == (sampling == "bilinear")  # RT-DETRv2 freezes them for discrete


def test_box_offsets_use_rtdetrv2s_point_scale():
    """loc = box centre + offset * float32(1 / P_l) * box size * offset_scale, as RT-DETRv2's num_points_scale."""
    module = MSDeformAttn(8, 2, 1, (3, 2), offset_scale=0.5).double()
    torch.nn.init.normal_(module.sampling_offsets.weight, std=0.5)
    query = torch.randn(1, 1, 8, dtype=torch.float64)
    ref = torch.tensor([[[[0.4, 0.6, 0.2, 0.3]] * 2]], dtype=torch.float64)
    loc, _ = module.sampling(query, ref, [(4, 4), (2, 2)])
    offsets = module.sampling_offsets(query).view(1, 1, 1, 5, 2)
    scale = torch.tensor([1 / 3] * 3 + [1 / 2] * 2, dtype=torch.float32).double().view(1, 1, 1, 5, 1)
    assert torch.equal(loc, ref[:, :, None, :1, :2] + offsets * scale * ref[:, :, None, :1, 2:] * 0.5)


def test_initial_offsets_number_each_levels_points():
    module = MSDeformAttn(8, 3, 2, (2, 1, 3))
    bias = module.sampling_offsets.bias.view(2, 6, 2)
    assert torch.equal(bias[0, :, 0], torch.tensor([1.0, 2.0, 1.0, 1.0, 2.0, 3.0]))  # head 0 looks along +x
    assert torch.allclose(bias[1, :, 0], -torch.tensor([1.0, 2.0, 1.0, 1.0, 2.0, 3.0]), atol=1e-6)


def test_discrete_sampling_exports_without_grid_sample(monkeypatch):
    """The exportable core of discrete sampling gathers cells (index_select): no grid_sample in it."""
    module = MSDeformAttn(16, 3, 2, (4, 4, 4), method="grid_sample", sampling="discrete")
    monkeypatch.setattr(F, "grid_sample", lambda *a, **k: pytest.fail("grid_sample called"))
    S = sum(h * w for h, w in SHAPES)
    out = module(torch.randn(1, 4, 16), torch.rand(1, 4, 3, 4), torch.randn(1, S, 16), SHAPES)
    assert out.shape == (1, 4, 16) and torch.isfinite(out).all()


@pytest.mark.parametrize("method", ["gather", "grid_sample"])
def test_non_finite_locations_give_nan_only_there(method):
    value, loc, attn = _inputs((2, 2, 2))
    loc[0, 1, 0, 3, 0] = float("nan")
    out = ms_deform_attn_core(value, SHAPES, loc, attn, method, (2, 2, 2), "discrete")
    assert out[0, 1, :3].isnan().all() and not out[0, 1, 3:].isnan().any() and not out[1].isnan().any()
