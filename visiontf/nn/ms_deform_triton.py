"""The ``"triton"`` core of multi-scale deformable attention: one fused GPU kernel forward, one backward.

The gather core (:mod:`visiontf.nn.ms_deform_gather`) is a CPU design: it copies the value into a
bordered table and reduces with ``embedding_bag``; on a GPU each of its steps is a separate pass
over memory. Here one program takes a block of queries of one head and, for each of its L x P
samples, reads the 4 bilinear corner rows of the value (D channels each, contiguous), weights and
sums them in registers: the value is read where it lies, nothing is materialised between steps.

The backward is one kernel too: per (query block, head) it reads the output gradient once and, per
sample, the 4 corner rows again; the corner dot products give the attention weight's and the
location's gradients (written, no conflicts), and the weighted output gradient is added into the
value's gradient with float32 atomics (float64 for float64), cast to the value's dtype at the end.

Semantics are ``F.grid_sample(mode="bilinear", padding_mode="zeros", align_corners=False)``'s,
those of the other cores: pixel coordinate = ``loc * size - 0.5``, corners outside the map read
zero, a non-finite location makes its query's output NaN. Arithmetic is in float32 (float64 for
float64 inputs) whatever the value's dtype; the output has the value's dtype.

``TRITON_INTERPRET=1`` set before this module is first imported runs the kernels on CPU tensors
(Triton's interpreter): the tests do so, so CI checks the kernels without a GPU.
"""
from __future__ import annotations

import os
from collections.abc import Callable

import torch
import triton
import triton.language as tl
from torch import Tensor

from visiontf.nn.ms_deform_tables import SpatialShapes, as_shapes
from visiontf.nn.packed_tokens import PackedTokens
from visiontf.nn.tensor_cache import tensor_cache

__all__ = ["INTERPRETED", "fused_core", "triton_core"]

#: the kernels run in Triton's interpreter (on CPU tensors); read once, as ``triton.jit`` does
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"

# Launch configurations tried once per (heads, head dim, levels, points, dtypes, row count class) on
# a GPU; the interpreter takes the first (each one would run every kernel again).
# Two each: every configuration is compiled (seconds) before the first call of its class runs.
_FWD_CONFIGS = [triton.Config({"BLOCK_Q": q}, num_warps=4) for q in (64, 32)]
_BWD_CONFIGS = [triton.Config({"BLOCK_Q": q}, num_warps=4) for q in (32, 16)]
if INTERPRETED:
    _FWD_CONFIGS, _BWD_CONFIGS = _FWD_CONFIGS[:1], _BWD_CONFIGS[:1]


@triton.jit
def _corners(x, y, a, H, W):
    """Top-left corner (x0, y0), fractions (fx, fy), the 4 corners' in-map masks and the attention weight.

    A non-finite coordinate turns the weight into NaN (grid_sample's NaN output); coordinates are
    clamped to [-2, size + 1] before the integer cast, where every corner is outside the map (a NaN
    weight leaves every coordinate of its sample at -2).
    """
    # x - x is 0 for a finite x and NaN otherwise: it turns the weight into NaN without a NaN literal
    a = a + (x - x) + (y - y)
    finite = a == a
    x = tl.minimum(tl.maximum(tl.where(finite, x, -2.0), -2.0), W + 1.0)
    y = tl.minimum(tl.maximum(tl.where(finite, y, -2.0), -2.0), H + 1.0)
    xf = tl.floor(x)
    yf = tl.floor(y)
    fx = x - xf
    fy = y - yf
    x0 = xf.to(tl.int32)
    y0 = yf.to(tl.int32)
    in_x0 = (x0 >= 0) & (x0 < W)
    in_x1 = (x0 >= -1) & (x0 < W - 1)
    in_y0 = (y0 >= 0) & (y0 < H)
    in_y1 = (y0 >= -1) & (y0 < H - 1)
    return x0, y0, fx, fy, in_x0 & in_y0, in_x1 & in_y0, in_x0 & in_y1, in_x1 & in_y1, a


@triton.jit
def _channels_in_range(d, D: tl.constexpr, BLOCK_D: tl.constexpr):
    """(1, BLOCK_D) mask of the real channels; all true, as a constant, when D is a power of 2, so that
    the loads of a row stay one contiguous vector (a compared ``arange`` would split them into scalars)."""
    if BLOCK_D == D:
        return tl.full((1, BLOCK_D), 1, tl.int1)
    return (d < D)[None, :]


@triton.jit
def _sample_setup(pix_ptr, attn_ptr, levels_ptr, pix_row, attn_row, row_ok, j, M: tl.constexpr, P: tl.constexpr,
                  J: tl.constexpr, ACC: tl.constexpr):
    """Sample j's corners and the flat value row of its top-left corner (relative to the head's base)."""
    l = j // P
    H = tl.load(levels_ptr + 3 * l)
    W = tl.load(levels_ptr + 3 * l + 1)
    start = tl.load(levels_ptr + 3 * l + 2)
    x = tl.load(pix_ptr + pix_row + j, mask=row_ok, other=0.0).to(ACC)
    y = tl.load(pix_ptr + pix_row + M * J + j, mask=row_ok, other=0.0).to(ACC)
    a = tl.load(attn_ptr + attn_row + j, mask=row_ok, other=0.0).to(ACC)
    x0, y0, fx, fy, ok00, ok01, ok10, ok11, a = _corners(x, y, a, H, W)
    # row of corner (y0, x0) in (image, position, head) order; the others are +M, +W*M, +(W+1)*M
    top_left = (start + y0 * W + x0).to(tl.int64) * M
    return top_left, W * M, fx, fy, ok00 & row_ok, ok01 & row_ok, ok10 & row_ok, ok11 & row_ok, a


@triton.autotune(configs=_FWD_CONFIGS, key=["M", "D", "L", "P", "MANY_ROWS"])
@triton.jit
def _forward_kernel(
    value_ptr, pix_ptr, attn_ptr, levels_ptr, image_ptr, out_ptr, R, Q, S,
    M: tl.constexpr, D: tl.constexpr, L: tl.constexpr, P: tl.constexpr, PACKED: tl.constexpr, MANY_ROWS: tl.constexpr,
    ACC: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_Q: tl.constexpr,
):
    """out[r, m*D:(m+1)*D] = sum over samples of attention weight x bilinear sample, for BLOCK_Q rows r and head m."""
    rows = tl.program_id(0) * BLOCK_Q + tl.arange(0, BLOCK_Q)
    m = tl.program_id(1)
    row_ok = rows < R
    d = tl.arange(0, BLOCK_D)
    d_ok = _channels_in_range(d, D, BLOCK_D)
    image = tl.load(image_ptr + rows, mask=row_ok, other=0) if PACKED else rows // Q
    J: tl.constexpr = L * P
    pix_row = rows.to(tl.int64) * (2 * M * J) + m * J
    attn_row = rows.to(tl.int64) * (M * J) + m * J
    head = (image.to(tl.int64) * S * M + m) * D
    acc = tl.zeros((BLOCK_Q, BLOCK_D), dtype=ACC)
    # a loop, not unrolled: each sample already has 4 x BLOCK_Q x D loads in flight, and unrolling
    # all L x P samples made a megabyte of PTX that took minutes to compile
    for j in range(J):
        top_left, row_step, fx, fy, ok00, ok01, ok10, ok11, a = _sample_setup(
            pix_ptr, attn_ptr, levels_ptr, pix_row, attn_row, row_ok, j, M, P, J, ACC)
        base = value_ptr + (head + top_left * D)[:, None] + d[None, :]
        v00 = tl.load(base, mask=ok00[:, None] & d_ok, other=0.0).to(ACC)
        v01 = tl.load(base + M * D, mask=ok01[:, None] & d_ok, other=0.0).to(ACC)
        v10 = tl.load(base + (row_step * D)[:, None], mask=ok10[:, None] & d_ok, other=0.0).to(ACC)
        v11 = tl.load(base + ((row_step + M) * D)[:, None], mask=ok11[:, None] & d_ok, other=0.0).to(ACC)
        top = v00 + fx[:, None] * (v01 - v00)
        bottom = v10 + fx[:, None] * (v11 - v10)
        acc += a[:, None] * (top + fy[:, None] * (bottom - top))
    out = out_ptr + (rows.to(tl.int64) * (M * D) + m * D)[:, None] + d[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & d_ok)


@triton.autotune(configs=_BWD_CONFIGS, key=["M", "D", "L", "P", "MANY_ROWS"], reset_to_zero=["grad_value_ptr"])
@triton.jit
def _backward_kernel(
    value_ptr, pix_ptr, attn_ptr, levels_ptr, image_ptr, grad_out_ptr, grad_value_ptr, grad_pix_ptr, grad_attn_ptr, R, Q, S,
    M: tl.constexpr, D: tl.constexpr, L: tl.constexpr, P: tl.constexpr, PACKED: tl.constexpr, MANY_ROWS: tl.constexpr,
    ACC: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_Q: tl.constexpr,
):
    """Gradients of the value (atomic adds), the pixel coordinates and the attention weights."""
    rows = tl.program_id(0) * BLOCK_Q + tl.arange(0, BLOCK_Q)
    m = tl.program_id(1)
    row_ok = rows < R
    d = tl.arange(0, BLOCK_D)
    d_ok = _channels_in_range(d, D, BLOCK_D)
    image = tl.load(image_ptr + rows, mask=row_ok, other=0) if PACKED else rows // Q
    J: tl.constexpr = L * P
    pix_row = rows.to(tl.int64) * (2 * M * J) + m * J
    attn_row = rows.to(tl.int64) * (M * J) + m * J
    head = (image.to(tl.int64) * S * M + m) * D
    g_ptr = grad_out_ptr + (rows.to(tl.int64) * (M * D) + m * D)[:, None] + d[None, :]
    g = tl.load(g_ptr, mask=row_ok[:, None] & d_ok, other=0.0).to(ACC)
    # a loop, not unrolled: each sample already has 4 x BLOCK_Q x D loads in flight, and unrolling
    # all L x P samples made a megabyte of PTX that took minutes to compile
    for j in range(J):
        top_left, row_step, fx, fy, ok00, ok01, ok10, ok11, a = _sample_setup(
            pix_ptr, attn_ptr, levels_ptr, pix_row, attn_row, row_ok, j, M, P, J, ACC)
        offset = (head + top_left * D)[:, None] + d[None, :]
        o01 = offset + M * D
        o10 = offset + (row_step * D)[:, None]
        o11 = o10 + M * D
        m00 = ok00[:, None] & d_ok
        m01 = ok01[:, None] & d_ok
        m10 = ok10[:, None] & d_ok
        m11 = ok11[:, None] & d_ok
        # each corner's dot product with the output gradient
        g00 = tl.sum(g * tl.load(value_ptr + offset, mask=m00, other=0.0).to(ACC), 1)
        g01 = tl.sum(g * tl.load(value_ptr + o01, mask=m01, other=0.0).to(ACC), 1)
        g10 = tl.sum(g * tl.load(value_ptr + o10, mask=m10, other=0.0).to(ACC), 1)
        g11 = tl.sum(g * tl.load(value_ptr + o11, mask=m11, other=0.0).to(ACC), 1)
        gx = fy * (g11 - g10) + (1 - fy) * (g01 - g00)
        gy = fx * (g11 - g01) + (1 - fx) * (g10 - g00)
        top = g00 + fx * (g01 - g00)
        bottom = g10 + fx * (g11 - g10)
        tl.store(grad_attn_ptr + attn_row + j, top + fy * (bottom - top), mask=row_ok)
        tl.store(grad_pix_ptr + pix_row + j, a * gx, mask=row_ok)
        tl.store(grad_pix_ptr + pix_row + M * J + j, a * gy, mask=row_ok)
        # the value's gradient: each corner row gets its bilinear weight x attention x output gradient
        ay1 = a * fy
        ay0 = a - ay1
        w01 = ay0 * fx
        w11 = ay1 * fx
        tl.atomic_add(grad_value_ptr + offset, (ay0 - w01)[:, None] * g, mask=m00, sem="relaxed")
        tl.atomic_add(grad_value_ptr + o01, w01[:, None] * g, mask=m01, sem="relaxed")
        tl.atomic_add(grad_value_ptr + o10, (ay1 - w11)[:, None] * g, mask=m10, sem="relaxed")
        tl.atomic_add(grad_value_ptr + o11, w11[:, None] * g, mask=m11, sem="relaxed")


@tensor_cache(maxsize=64)
def _levels(shapes: tuple[tuple[int, int], ...], device: torch.device) -> Tensor:
    """(L, 3) int32: each level's H, W and first position in the flattened value."""
    sizes = [h * w for h, w in shapes]
    starts = [sum(sizes[:i]) for i in range(len(shapes))]
    return torch.tensor([(h, w, s) for (h, w), s in zip(shapes, starts)], dtype=torch.int32, device=device)


def _launch_args(value: Tensor, pix: Tensor, packed: bool) -> tuple[dict, Callable]:
    """Compile-time arguments shared by both kernels, and the grid (query blocks x heads)."""
    R, _, M, _ = pix.shape
    D = value.shape[3]
    meta = {
        "M": M, "D": D, "PACKED": packed, "ACC": tl.float64 if value.dtype == torch.float64 else tl.float32,
        "BLOCK_D": triton.next_power_of_2(D),
        # tuned separately: the decoder's few rows want smaller blocks than the encoder's many
        "MANY_ROWS": R * M >= 65536,
    }
    return meta, lambda cfg: (triton.cdiv(R, cfg["BLOCK_Q"]), M)


class _FusedSample(torch.autograd.Function):
    """(value, pixel coordinates, attention weights) -> weighted bilinear samples, in two Triton kernels.

    ``value`` (N, S, M, D) contiguous; ``pix`` (R, 2, M, J) pixel x and y planes of R query rows;
    ``attn`` (R, M, J); ``levels`` from :func:`_levels`; ``image`` (R,) each row's image, or None
    when row r is query r % Q of image r // Q. Returns (R, M * D) in the value's dtype.
    """

    @staticmethod
    def forward(ctx, value, pix, attn, levels, image, Q, P):
        R, _, M, J = pix.shape
        S, D = value.shape[1], value.shape[3]
        meta, grid = _launch_args(value, pix, image is not None)
        out = value.new_empty(R, M * D)
        rows_image = image if image is not None else levels  # any pointer: unread when not packed
        _forward_kernel[grid](value, pix, attn, levels, rows_image, out, R, Q, S, L=J // P, P=P, **meta)
        ctx.save_for_backward(value, pix, attn, levels, rows_image)
        ctx.Q, ctx.P, ctx.packed = Q, P, image is not None
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        value, pix, attn, levels, rows_image = ctx.saved_tensors
        R, _, _, J = pix.shape
        S = value.shape[1]
        meta, grid = _launch_args(value, pix, ctx.packed)
        acc = torch.float64 if value.dtype == torch.float64 else torch.float32
        grad_value = torch.zeros(value.shape, dtype=acc, device=value.device)
        grad_pix = torch.empty_like(pix)
        grad_attn = torch.empty_like(attn)
        _backward_kernel[grid](value, pix, attn, levels, rows_image, grad_out.contiguous(), grad_value, grad_pix, grad_attn,
                               R, ctx.Q, S, L=J // ctx.P, P=ctx.P, **meta)
        return grad_value.to(value.dtype), grad_pix, grad_attn, None, None, None, None


def fused_core(value: Tensor, spatial_shapes: SpatialShapes, pix: Tensor, attn: Tensor, packed: PackedTokens | None = None) -> Tensor:
    """The ``"triton"`` core in the gather core's native layout (what :class:`MSDeformAttn` calls on CUDA).

    Args and returns as :func:`visiontf.nn.ms_deform_gather.gather_core`: ``value`` (N, S, M, D),
    ``pix`` (N, Q, 2, M, J) pixel coordinates, ``attn`` (N, Q, M, J); ``packed``: value, pix and
    attn hold the packed tokens (1, T, ·), whose value is unpacked to whole maps here (zeros at
    padded positions, as the module's masking gives).
    """
    shapes = tuple(as_shapes(spatial_shapes))
    J = pix.shape[-1]
    P = J // len(shapes)
    if packed is None:
        N, Q = pix.shape[:2]
        image = None
    else:
        value = packed.unpack(value[0])
        N, Q = 1, pix.shape[1]
        image = packed.image.to(torch.int32)
    M, D = value.shape[2:]
    # pixel coordinates and weights in float32 (float64 for float64): locations never run in half precision
    dtype = torch.float64 if value.dtype == torch.float64 else torch.float32
    out = _FusedSample.apply(
        value.contiguous(), pix.to(dtype).reshape(N * Q, 2, M, J).contiguous(), attn.to(dtype).reshape(N * Q, M, J).contiguous(),
        _levels(shapes, value.device), image, Q, P,
    )
    return out.view(N, Q, M * D)


def triton_core(value: Tensor, shapes: list[tuple[int, int]], loc: Tensor, attn: Tensor) -> Tensor:
    """:func:`fused_core` from normalised locations (N, Q, M, L, P, 2), as :func:`~visiontf.nn.ms_deform_core.ms_deform_attn_core` takes them."""
    N, Q, M, L, P, _ = loc.shape
    dtype = torch.float64 if value.dtype == torch.float64 else torch.float32
    size = torch.tensor([(w, h) for h, w in shapes], dtype=dtype, device=loc.device).view(L, 1, 2)
    pix = (loc.to(dtype) * size - 0.5).permute(0, 1, 5, 2, 3, 4).reshape(N, Q, 2, M, L * P)
    return fused_core(value, shapes, pix, attn.reshape(N, Q, M, L * P))
