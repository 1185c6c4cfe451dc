"""The interchangeable cores of multi-scale deformable attention behind one function.

* ``"gather"`` (default): the fast path. On CUDA tensors it runs the fused Triton kernels of
  :mod:`visiontf.nn.ms_deform_triton` (see :func:`fused_kernel_runs`), elsewhere the gather core
  of :mod:`visiontf.nn.ms_deform_gather` (a CPU design: a bordered table and ``embedding_bag``).
* ``"triton"``: the fused Triton kernels whatever the device (on CPU tensors only under
  ``TRITON_INTERPRET=1``: the tests).
* ``"grid_sample"``: the original's pure-PyTorch design, one ``F.grid_sample`` per level (here).
  ONNX exports it (GridSample, opset 16+), and the tests use it as a cross-check. It does not train
  deterministically on CUDA: ``F.grid_sample``'s backward adds with atomics there (torch raises under
  ``torch.use_deterministic_algorithms(True)``).

Under ``torch.use_deterministic_algorithms(True)`` the ``"gather"`` and ``"triton"`` methods are
deterministic, on every device: see :func:`fused_kernel_runs`.

Two options of every core (RT-DETRv2's, Lv et al. 2024), off by default:

* ``points``: a number of sampling points per level (``(P_0, ..., P_{L-1})``) instead of one for all
  levels. Locations are then laid out flat, ``(N, Lq, M, J, 2)`` with ``J = sum(points)`` samples
  ordered (level, point), and the weights ``(N, Lq, M, J)``. The fast cores run them padded to
  ``L x max(points)`` samples with zero weights where a level has fewer (nothing padded when every
  level has the same count); ``grid_sample`` samples each level's own points.
* ``sampling="discrete"``: each sample reads the one cell its location falls in instead of
  interpolating four: column ``floor(x * W + 0.5)`` and row ``floor(y * H + 0.5)``, each clamped into
  its map (RT-DETRv2's ``index_select`` sampling, which TensorRT 8.4 and older runs; there is no
  location gradient). The fast cores read it as a bilinear sample at those integer pixel coordinates
  (all weight on one corner); ``"grid_sample"`` gathers the cells with ``index_select``
  (:func:`core_discrete`), so an exported graph holds a Gather and no GridSample. RT-DETRv2's own code
  clamps the column into ``[0, H - 1]`` (the map's height) as well; transformers clamps each axis into
  its own size, as here. The two agree on square maps.
"""
from __future__ import annotations

import functools
import importlib.util

import torch
import torch.nn.functional as F
from torch import Tensor

from visiontf.nn.ms_deform_gather import core_gather, gather_core
from visiontf.nn.ms_deform_tables import SpatialShapes, as_shapes, size_table, tracing_shapes
from visiontf.nn.packed_tokens import PackedTokens

__all__ = ["METHODS", "SAMPLINGS", "core_discrete", "core_grid_sample", "core_grid_sample_points", "fused_kernel_runs",
           "ms_deform_attn_core", "pixel_core"]

METHODS = ("gather", "grid_sample", "triton")
#: how a sample reads its level map: four bilinear corners, or the one cell it falls in (RT-DETRv2's discrete sampling)
SAMPLINGS = ("bilinear", "discrete")


@functools.cache
def _triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


def fused_kernel_runs(value: Tensor) -> bool:
    """Whether the ``"gather"`` method runs the fused Triton kernels for ``value``: a CUDA tensor and
    Triton installed; otherwise it runs the gather core.

    Deterministic algorithms (``torch.use_deterministic_algorithms(True)``, Lightning's
    ``Trainer(deterministic=True)``) change the kernels, not this choice: their backward then sums the
    value's gradient without atomics (:mod:`visiontf.nn.ms_deform_triton`). Both cores the ``"gather"``
    method can run are deterministic in that mode (the gather core's table gradient is a stable sort and
    per-row sums in any mode). It never falls back to the ``"grid_sample"`` core: ``F.grid_sample``'s CUDA
    backward adds the value's gradient with atomics, and torch refuses to run it under deterministic
    algorithms.
    """
    return value.is_cuda and _triton_installed()


def ms_deform_attn_core(
    value: Tensor,
    spatial_shapes: SpatialShapes,
    sampling_locations: Tensor,
    attention_weights: Tensor,
    method: str = "gather",
    points: tuple[int, ...] | None = None,
    sampling: str = "bilinear",
) -> Tensor:
    """Weighted bilinear samples of multi-level value maps.

    Args:
        value: (N, S, M, D), the levels flattened row-major and concatenated, S = sum(H_l * W_l).
        spatial_shapes: (H_l, W_l) of each level, Python ints (a (L, 2) tensor is accepted too).
        sampling_locations: (N, Lq, M, L, P, 2) normalised (x, y), (0, 0) the top-left corner of
            the map and (1, 1) its bottom-right corner.
        attention_weights: (N, Lq, M, L, P), already normalised.
        method: ``"gather"``, ``"triton"`` or ``"grid_sample"`` (see the module docstring).
        points: sampling points of each level (RT-DETRv2); ``sampling_locations`` are then
            (N, Lq, M, J, 2) and ``attention_weights`` (N, Lq, M, J), J = sum(points), ordered (level, point).
        sampling: ``"bilinear"`` or ``"discrete"`` (see the module docstring).

    Returns:
        (N, Lq, M * D).
    """
    shapes = as_shapes(spatial_shapes)
    S = value.shape[1]
    if not tracing_shapes() and sum(h * w for h, w in shapes) != S:
        raise ValueError(f"spatial_shapes {shapes} hold {sum(h * w for h, w in shapes)} positions, but value has S = {S}")
    if sampling not in SAMPLINGS:
        raise ValueError(f"sampling must be one of {SAMPLINGS}, got {sampling!r}")
    if points is not None or sampling != "bilinear":
        if method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {method!r}")
        if points is None:  # one count for every level: the (L, P) layout, flattened
            N, Q, M, L, P, _ = sampling_locations.shape
            points = (P,) * L
            sampling_locations, attention_weights = sampling_locations.flatten(3, 4), attention_weights.flatten(3, 4)
        points = check_points(points, len(shapes), sampling_locations.shape[3])
        if method == "grid_sample":
            if sampling == "discrete":
                return core_discrete(value, shapes, sampling_locations, attention_weights, points)
            return core_grid_sample_points(value, shapes, sampling_locations, attention_weights, points)
        dtype = torch.float64 if value.dtype == torch.float64 else torch.float32
        size = sample_sizes(shapes, points, dtype, value.device)  # (J, 2)
        pix = (sampling_locations.to(dtype) * size - 0.5).permute(0, 1, 4, 2, 3)  # (N, Lq, 2, M, J)
        return pixel_core(value, shapes, pix, attention_weights, None, method, points, sampling)
    # "gather" resolves to one of the two fast cores, whatever the device and in deterministic mode too:
    # both have a deterministic backward there, grid_sample's has none on CUDA (see fused_kernel_runs)
    if method == "triton" or (method == "gather" and fused_kernel_runs(value)):
        from visiontf.nn.ms_deform_triton import triton_core  # imports Triton: only where it runs

        return triton_core(value, shapes, sampling_locations, attention_weights)
    if method == "gather":
        return core_gather(value, shapes, sampling_locations, attention_weights)
    if method == "grid_sample":
        return core_grid_sample(value, shapes, sampling_locations, attention_weights)
    raise ValueError(f"method must be one of {METHODS}, got {method!r}")


def core_grid_sample(value: Tensor, shapes: list[tuple[int, int]], loc: Tensor, attn: Tensor) -> Tensor:
    N, S, M, D = value.shape
    _, Lq, _, L, P, _ = loc.shape
    # sampled in float32 (float64 for float64 inputs), as the gather core: bf16 locations would move
    # samples by up to a quarter pixel on a 100-pixel map; the result comes back in value's dtype
    dtype = torch.float64 if value.dtype == torch.float64 else torch.float32
    grids = 2 * loc.to(dtype) - 1
    # (N, S, M, D) -> (N, M, D, S): each level is then a contiguous (N*M, D, H, W) slice
    per_level = value.to(dtype).permute(0, 2, 3, 1).split([h * w for h, w in shapes], dim=-1)
    samples = []
    for lvl, (h, w) in enumerate(shapes):
        v = per_level[lvl].reshape(N * M, D, h, w)
        # (N, Lq, M, P, 2) -> (N*M, Lq, P, 2)
        g = grids[:, :, :, lvl].transpose(1, 2).flatten(0, 1)
        samples.append(F.grid_sample(v, g, mode="bilinear", padding_mode="zeros", align_corners=False))
    # (N*M, D, Lq, L, P) weighted by (N*M, 1, Lq, L, P)
    stacked = torch.stack(samples, dim=-2)
    weights = attn.to(dtype).transpose(1, 2).reshape(N * M, 1, Lq, L, P)
    out = (stacked * weights).sum((-1, -2)).view(N, M * D, Lq)
    return out.transpose(1, 2).to(value.dtype)


def check_points(points, levels: int, samples: int | None = None) -> tuple[int, ...]:
    """``points`` as a tuple of one positive count per level (and ``samples`` of them in all, when given)."""
    points = tuple(int(p) for p in points)
    if len(points) != levels or min(points) < 1:
        raise ValueError(f"points must give a positive number of sampling points for each of the {levels} levels, got {points}")
    if samples is not None and not tracing_shapes() and sum(points) != samples:
        raise ValueError(f"points {points} make {sum(points)} samples per head, but the locations hold {samples}")
    return points


def _sample_levels(points: tuple[int, ...], device) -> Tensor:
    """(J,) the level of each sample, samples ordered (level, point)."""
    return torch.repeat_interleave(torch.arange(len(points), device=device), torch.tensor(points, device=device))


def sample_sizes(shapes, points: tuple[int, ...], dtype: torch.dtype, device) -> Tensor:
    """(J, 2) (W, H) of each sample's level; from the traced sizes while exporting (the graph follows the input)."""
    return size_table(shapes, dtype, device)[_sample_levels(points, device)]


def discrete_pixels(pix: Tensor, shapes, points: tuple[int, ...]) -> Tensor:
    """Pixel coordinates ``loc * size - 0.5`` (N, Q, 2, M, J) -> the integer coordinates of the cell each sample
    reads in discrete sampling: ``floor(loc * size + 0.5)`` clamped into ``[0, size - 1]`` per axis. A bilinear
    core reads exactly that cell there (its fractions are 0); NaN stays NaN. No gradient reaches the locations."""
    size = sample_sizes(shapes, points, pix.dtype, pix.device).t().unsqueeze(1)  # (2, 1, J): x plane W, y plane H
    return torch.minimum(torch.floor(pix.detach() + 1.0).clamp_min(0.0), size - 1.0)


def _padded_to_uniform(pix: Tensor, attn: Tensor, points: tuple[int, ...]) -> tuple[Tensor, Tensor]:
    """Per-level sample counts as ``L x max(points)`` samples a head, the missing ones with weight 0 at pixel
    (-2, -2), outside every map: the layout of one count per level that the gather and Triton cores take."""
    if len(set(points)) == 1:
        return pix, attn
    most = max(points)
    levels = _sample_levels(points, pix.device)
    first = torch.tensor([sum(points[:lvl]) for lvl in range(len(points))], device=pix.device)
    slot = levels * most + torch.arange(len(levels), device=pix.device) - first[levels]
    total = len(points) * most
    padded_pix = pix.new_full((*pix.shape[:-1], total), -2.0).index_copy(-1, slot, pix)
    padded_attn = attn.new_zeros((*attn.shape[:-1], total)).index_copy(-1, slot, attn)
    return padded_pix, padded_attn


def pixel_core(
    value: Tensor,
    spatial_shapes: SpatialShapes,
    pix: Tensor,
    attn: Tensor,
    packed: PackedTokens | None = None,
    method: str = "gather",
    points: tuple[int, ...] | None = None,
    sampling: str = "bilinear",
) -> Tensor:
    """The fast cores (``"gather"``, ``"triton"``) from pixel coordinates, with the options of the module docstring.

    Args:
        value: (N, S, M, D); pix: (N, Q, 2, M, J) pixel coordinates ``loc * (W, H) - 0.5``, x then y planes;
        attn: (N, Q, M, J); packed: as :func:`visiontf.nn.ms_deform_gather.gather_core`.
        points: samples of each level (J = sum(points), ordered (level, point)); None: J / L each.

    Returns:
        (N, Q, M * D) (packed: (1, T, M * D)).
    """
    shapes = as_shapes(spatial_shapes)
    if points is None:
        points = (pix.shape[-1] // len(shapes),) * len(shapes)
    if sampling == "discrete":
        pix = discrete_pixels(pix, shapes, points)
    pix, attn = _padded_to_uniform(pix, attn, points)
    if method == "triton" or (method == "gather" and fused_kernel_runs(value)):
        from visiontf.nn.ms_deform_triton import fused_core  # imports Triton: only where it runs

        return fused_core(value, shapes, pix, attn, packed)
    if method != "gather":
        raise ValueError(f"pixel_core runs the 'gather' and 'triton' cores, not {method!r}")
    return gather_core(value, shapes, pix, attn, packed)


def core_grid_sample_points(value: Tensor, shapes: list[tuple[int, int]], loc: Tensor, attn: Tensor, points: tuple[int, ...]) -> Tensor:
    """The ``grid_sample`` core with ``points[l]`` samples on level l: loc (N, Lq, M, J, 2), attn (N, Lq, M, J)."""
    N, S, M, D = value.shape
    Lq, J = loc.shape[1], loc.shape[3]
    dtype = torch.float64 if value.dtype == torch.float64 else torch.float32
    grids = (2 * loc.to(dtype) - 1).transpose(1, 2).flatten(0, 1).split(list(points), dim=2)  # per level (N*M, Lq, P_l, 2)
    per_level = value.to(dtype).permute(0, 2, 3, 1).split([h * w for h, w in shapes], dim=-1)
    samples = [F.grid_sample(v.reshape(N * M, D, h, w), g, mode="bilinear", padding_mode="zeros", align_corners=False)
               for v, g, (h, w) in zip(per_level, grids, shapes)]
    weights = attn.to(dtype).transpose(1, 2).reshape(N * M, 1, Lq, J)
    out = (torch.cat(samples, dim=-1) * weights).sum(-1).view(N, M * D, Lq)
    return out.transpose(1, 2).to(value.dtype)


def core_discrete(value: Tensor, shapes, loc: Tensor, attn: Tensor, points: tuple[int, ...]) -> Tensor:
    """Discrete sampling by ``index_select``: each sample reads the cell ``floor(loc * (W, H) + 0.5)`` (clamped into
    its map per axis), weighted and summed; loc (N, Lq, M, J, 2), attn (N, Lq, M, J). It exports to a Gather, which
    older TensorRT runs where it has no GridSample. A non-finite location makes its query's output NaN, as in the
    other cores."""
    N, S, M, D = value.shape
    Lq, J = loc.shape[1], loc.shape[3]
    dtype = torch.float64 if value.dtype == torch.float64 else torch.float32
    levels = _sample_levels(points, value.device)
    size = size_table(shapes, dtype, value.device)[levels]  # (J, 2) (W, H)
    sizes = [h * w for h, w in shapes]
    if any(isinstance(s, Tensor) for s in sizes):
        start = torch.cumsum(torch.stack([torch.as_tensor(s) for s in sizes]), 0).to(value.device) - torch.stack(
            [torch.as_tensor(s) for s in sizes]).to(value.device)
    else:
        start = torch.tensor([sum(sizes[:lvl]) for lvl in range(len(sizes))], device=value.device)
    loc = loc.to(dtype).detach()
    finite = torch.isfinite(loc).all(-1)
    cell = torch.minimum(torch.floor(torch.where(finite[..., None], loc, 0.0) * size + 0.5).clamp_min(0), size - 1).long()
    row = start[levels] + cell[..., 1] * size[:, 0].long() + cell[..., 0]  # (N, Lq, M, J) position in the flattened value
    table = value.to(dtype).permute(0, 2, 1, 3).reshape(N * M * S, D)
    image_head = (torch.arange(N * M, device=value.device) * S).view(N, 1, M, 1)
    picked = table.index_select(0, (row + image_head).permute(0, 2, 1, 3).reshape(-1)).view(N, M, Lq, J, D)
    weights = torch.where(finite, attn.to(dtype), float("nan")).permute(0, 2, 1, 3).unsqueeze(-1)
    out = (picked * weights).sum(3)  # (N, M, Lq, D)
    return out.permute(0, 2, 1, 3).reshape(N, Lq, M * D).to(value.dtype)
