"""The interchangeable cores of multi-scale deformable attention behind one function.

* ``"gather"`` (default): the fast path. On CUDA tensors it runs the fused Triton kernels of
  :mod:`visiontf.nn.ms_deform_triton` (see :func:`fused_kernel_runs`), elsewhere the gather core
  of :mod:`visiontf.nn.ms_deform_gather` (a CPU design: a bordered table and ``embedding_bag``).
* ``"triton"``: the fused Triton kernels whatever the device (on CPU tensors only under
  ``TRITON_INTERPRET=1``: the tests).
* ``"grid_sample"``: the original's pure-PyTorch design, one ``F.grid_sample`` per level (here).
  ONNX exports it (GridSample, opset 16+), and the tests use it as a cross-check.
"""
from __future__ import annotations

import functools
import importlib.util

import torch
import torch.nn.functional as F
from torch import Tensor

from visiontf.nn.ms_deform_gather import core_gather
from visiontf.nn.ms_deform_tables import SpatialShapes, as_shapes, tracing_shapes

__all__ = ["METHODS", "core_grid_sample", "fused_kernel_runs", "ms_deform_attn_core"]

METHODS = ("gather", "grid_sample", "triton")


@functools.cache
def _triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


def fused_kernel_runs(value: Tensor) -> bool:
    """Whether the ``"gather"`` method runs the fused Triton kernels for ``value``: a CUDA tensor,
    Triton installed, and deterministic algorithms not asked for (the kernels' value gradient adds
    with atomics, in no fixed order; the gather core's is deterministic)."""
    return value.is_cuda and _triton_installed() and not torch.are_deterministic_algorithms_enabled()


def ms_deform_attn_core(
    value: Tensor,
    spatial_shapes: SpatialShapes,
    sampling_locations: Tensor,
    attention_weights: Tensor,
    method: str = "gather",
) -> Tensor:
    """Weighted bilinear samples of multi-level value maps.

    Args:
        value: (N, S, M, D), the levels flattened row-major and concatenated, S = sum(H_l * W_l).
        spatial_shapes: (H_l, W_l) of each level, Python ints (a (L, 2) tensor is accepted too).
        sampling_locations: (N, Lq, M, L, P, 2) normalised (x, y), (0, 0) the top-left corner of
            the map and (1, 1) its bottom-right corner.
        attention_weights: (N, Lq, M, L, P), already normalised.
        method: ``"gather"``, ``"triton"`` or ``"grid_sample"`` (see the module docstring).

    Returns:
        (N, Lq, M * D).
    """
    shapes = as_shapes(spatial_shapes)
    S = value.shape[1]
    if not tracing_shapes() and sum(h * w for h, w in shapes) != S:
        raise ValueError(f"spatial_shapes {shapes} hold {sum(h * w for h, w in shapes)} positions, but value has S = {S}")
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
