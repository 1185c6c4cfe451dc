"""Tables of multi-scale deformable attention's gather core: the zero-bordered layout of the level maps.

The value is copied into a table of (image x position x head) rows in which every level map has a
zero border, so ``grid_sample``'s zero padding needs no per-corner range test (see
:mod:`visiontf.nn.ms_deform_gather`). The layout and the per-sample constants depend only on the
level shapes, and are computed once per set of shapes.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from visiontf.nn.packed_tokens import PackedTokens
from visiontf.nn.tensor_cache import tensor_cache

__all__ = ["PAD_HI", "PAD_LO", "SpatialShapes", "as_shapes", "bordered_layout", "bordered_table", "gather_constants", "size_table",
           "tracing_shapes"]

SpatialShapes = Sequence[tuple[int, int]]


def tracing_shapes() -> bool:
    """True while a graph is being traced (ONNX export): level shapes then stay traced tensors.

    Under ``torch.jit.trace`` (the TorchScript ONNX exporter) ``x.shape[i]`` is a 0-dim tensor
    whose arithmetic is recorded, so a graph computed from it follows the input's size; ``int()``
    of it would bake the traced size into the graph. Eager code keeps Python ints (and the cached
    tables built from them), so training and eval run exactly as before.
    """
    return torch.jit.is_tracing() or torch.onnx.is_in_onnx_export()


def as_shapes(spatial_shapes) -> list[tuple[int, int]]:
    """(H_l, W_l) of each level as Python ints; while tracing, as given (traced sizes stay traced)."""
    if tracing_shapes():
        return [(h, w) for h, w in spatial_shapes]
    if isinstance(spatial_shapes, Tensor):
        return [(int(h), int(w)) for h, w in spatial_shapes.tolist()]
    return [(int(h), int(w)) for h, w in spatial_shapes]


def size_table(shapes: SpatialShapes, dtype: torch.dtype, device: torch.device) -> Tensor:
    """(L, 2) (W_l, H_l) of each level; built from traced sizes while tracing, so it follows the input."""
    if any(isinstance(v, Tensor) for hw in shapes for v in hw):
        return torch.stack([torch.stack([torch.as_tensor(w), torch.as_tensor(h)]) for h, w in shapes]).to(dtype=dtype, device=device)
    return torch.tensor([(w, h) for h, w in shapes], dtype=dtype, device=device)


#: zero border around every level map in the gather table: 1 before, 2 after (a location clamped
#: to x = W has its corners at W and W + 1), so no corner ever needs an in-range test or wraps into
#: the next row, level or image
PAD_LO, PAD_HI = 1, 2


@tensor_cache(maxsize=64)
def bordered_layout(shapes: tuple[tuple[int, int], ...], device: torch.device) -> tuple[Tensor, Tensor, Tensor, int]:
    """Layout of the zero-bordered level maps, computed once per set of shapes.

    Returns ``(interior, start, width, total)``: ``interior`` (S,) the bordered position of each
    value position; ``start`` (L,) and ``width`` (L,) each bordered map's offset and row length;
    ``total`` the number of bordered positions.
    """
    hw = torch.tensor(shapes, dtype=torch.int64)
    h, w = hw[:, 0], hw[:, 1]
    wp = w + PAD_LO + PAD_HI
    sizes = (h + PAD_LO + PAD_HI) * wp
    start = sizes.cumsum(0) - sizes
    level = torch.repeat_interleave(torch.arange(len(shapes)), h * w)
    local = torch.arange(int((h * w).sum())) - ((h * w).cumsum(0) - h * w)[level]
    i, j = local // w[level], local % w[level]
    interior = start[level] + (i + PAD_LO) * wp[level] + j + PAD_LO
    return interior.to(device), start.to(device), wp.to(device), int(sizes.sum())


@tensor_cache(maxsize=64)
def gather_constants(shapes: tuple[tuple[int, int], ...], N: int, M: int, P: int, device: torch.device) -> dict:
    """Per-sample constants of the gather core in its (N, Q, M, J = L * P) layout, one set per shapes.

    ``key_base`` (N, 1, M, J): table row of bordered position (-1, -1) of the sample's level, image
    and head; ``row_stride`` (J,): rows per bordered map row; ``corner`` (4, J): row offsets of the 4
    bilinear corners (y0x0, y0x1, y1x0, y1x1) from the top-left one; ``size`` (2, 1, J): (W, H).
    """
    _, start, width, total = bordered_layout(shapes, device)
    L = len(shapes)
    per_sample = lambda t: t.repeat_interleave(P, dim=-1)  # noqa: E731  level -> (level, point)
    base = (start + (width + 1) * PAD_LO) * M  # (L,)
    key_base = (
        torch.arange(N, device=device).view(N, 1, 1, 1) * (total * M)
        + torch.arange(M, device=device).view(1, 1, M, 1)
        + per_sample(base).view(1, 1, 1, L * P)
    )
    ones = torch.ones_like(width)
    corner = per_sample(torch.stack([ones * 0, ones, width, width + 1]) * M)  # (4, J)
    size = per_sample(torch.tensor([[w for _, w in shapes], [h for h, _ in shapes]], device=device)).view(2, 1, L * P)
    # per level, within one image's block of total * M rows: its first and end row and its corners'
    # row offsets, as Python ints (the dense table gradient adds whole level blocks at these shifts)
    spans = tuple(
        (int(a) * M, (int(a) + (h + PAD_LO + PAD_HI) * int(wp)) * M, (0, M, int(wp) * M, (int(wp) + 1) * M))
        for a, wp, (h, _) in zip(start.tolist(), width.tolist(), shapes)
    )
    return {"key_base": key_base, "row_stride": per_sample(width * M), "corner": corner, "size": size, "total": total,
            "spans": spans, "image_rows": total * M}


def bordered_table(value: Tensor, shapes: tuple[tuple[int, int], ...], dtype: torch.dtype, N: int, packed: PackedTokens | None) -> Tensor:
    """(N * total * M, D): every level map inside its zero border, rows ordered (image, position, head).

    ``value`` is (N, S, M, D), or (1, T, M, D) ``packed`` rows (padded positions then stay zero).
    One row scatter forward (``index_put`` into zeros; ``index_copy`` copies row by row on CPU)
    and one gather backward.
    """
    _, _, M, D = value.shape
    interior, _, _, total = bordered_layout(shapes, value.device)
    if packed is None:
        into = (torch.arange(N, device=value.device).view(N, 1) * total + interior).view(-1)
    else:
        into = packed.image * total + interior[packed.position]
    table = value.new_zeros(N * total, M * D, dtype=dtype).index_put((into,), value.reshape(-1, M * D).to(dtype))
    return table.view(N * total * M, D)
