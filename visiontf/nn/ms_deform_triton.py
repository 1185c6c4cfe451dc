"""The ``"triton"`` core of multi-scale deformable attention: one fused GPU kernel forward, one backward.

The gather core (:mod:`visiontf.nn.ms_deform_gather`) is a CPU design: it copies the value into a
bordered table and reduces with ``embedding_bag``; on a GPU each of its steps is a separate pass
over memory. Here one program takes a block of queries of one head and, for each of its L x P
samples, reads the 4 bilinear corner rows of the value (D channels each, contiguous), weights and
sums them in registers: the value is read where it lies, nothing is materialised between steps.

The backward is one kernel too: per (query block, head) it reads the output gradient once and, per
sample, the 4 corner rows again; the corner dot products give the attention weight's and the
location's gradients (each written by the one program that owns its query row: no atomics), and the
weighted output gradient is added into the value's gradient with float32 atomics (float64 for
float64), cast to the value's dtype at the end. Atomics add in whatever order the programs reach
them, so the value gradient's last bits change from run to run.

Under ``torch.use_deterministic_algorithms(True)`` (which Lightning's ``Trainer(deterministic=True)``
calls) the value gradient is summed without atomics instead: the backward kernel writes each
sample corner's value row and weight, a stable sort groups the corners by value row, and a second
kernel sums each row's corners in that order, one (row, channel) lane at a time. The order is the
stable sort's (query row, head, sample, corner), a function of the inputs alone: the result does not
depend on scheduling or on either kernel's block sizes. It costs the sort of 4 x samples keys and
about 20 bytes of memory per sample corner. The kernels' launch configurations are then fixed
(:data:`DETERMINISTIC_BLOCKS`) rather than autotuned: the autotuner keeps the fastest by timing,
which can differ between two processes, and the location gradient's dot products are reduced
across threads in a layout that follows the tile's shape.

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

#: block sizes under deterministic algorithms, fixed for the reasons of the module docstring: query rows
#: per program of the forward and of the backward kernel, and value rows and channels per program of the
#: value gradient's segmented sum (``BLOCK_D`` None: the head dim rounded up to a power of 2, at most 64).
#: The tests change them to show that no gradient depends on them.
DETERMINISTIC_BLOCKS: dict[str, int | None] = {"BLOCK_Q_FORWARD": 64, "BLOCK_Q_BACKWARD": 32, "BLOCK_V": 32, "BLOCK_D": None}


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
    """(1, BLOCK_D) mask of the real channels; all true, as a constant, when blocks of BLOCK_D tile D exactly
    (D a power of 2), so that the loads of a row stay one contiguous vector (a compared ``arange`` would split
    them into scalars)."""
    if D % BLOCK_D == 0:
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
    value_ptr, pix_ptr, attn_ptr, levels_ptr, image_ptr, grad_out_ptr, grad_value_ptr, grad_pix_ptr, grad_attn_ptr,
    corner_row_ptr, corner_weight_ptr, R, Q, S, NO_ROW,
    M: tl.constexpr, D: tl.constexpr, L: tl.constexpr, P: tl.constexpr, PACKED: tl.constexpr, MANY_ROWS: tl.constexpr,
    ACC: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_Q: tl.constexpr, DETERMINISTIC: tl.constexpr = False,
):
    """Gradients of the pixel coordinates and the attention weights, and of the value: added with atomics,
    or (``DETERMINISTIC``) each sample corner's value row (``NO_ROW`` outside the map) and weight written to
    ``corner_row_ptr`` / ``corner_weight_ptr`` at (query row, head, sample, corner), for
    :func:`_value_grad_kernel` to sum."""
    rows = tl.program_id(0) * BLOCK_Q + tl.arange(0, BLOCK_Q)
    m = tl.program_id(1)
    row_ok = rows < R
    d = tl.arange(0, BLOCK_D)
    d_ok = _channels_in_range(d, D, BLOCK_D)
    image = tl.load(image_ptr + rows, mask=row_ok, other=0) if PACKED else rows // Q
    J: tl.constexpr = L * P
    pix_row = rows.to(tl.int64) * (2 * M * J) + m * J
    attn_row = rows.to(tl.int64) * (M * J) + m * J
    head_row = image.to(tl.int64) * S * M + m
    head = head_row * D
    corner_base = (rows.to(tl.int64) * M + m) * (4 * J)
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
        if DETERMINISTIC:
            r00 = head_row + top_left
            r10 = r00 + row_step
            at = corner_base + 4 * j
            tl.store(corner_row_ptr + at, tl.where(ok00, r00, NO_ROW).to(corner_row_ptr.dtype.element_ty), mask=row_ok)
            tl.store(corner_row_ptr + at + 1, tl.where(ok01, r00 + M, NO_ROW).to(corner_row_ptr.dtype.element_ty), mask=row_ok)
            tl.store(corner_row_ptr + at + 2, tl.where(ok10, r10, NO_ROW).to(corner_row_ptr.dtype.element_ty), mask=row_ok)
            tl.store(corner_row_ptr + at + 3, tl.where(ok11, r10 + M, NO_ROW).to(corner_row_ptr.dtype.element_ty), mask=row_ok)
            tl.store(corner_weight_ptr + at, ay0 - w01, mask=row_ok)
            tl.store(corner_weight_ptr + at + 1, w01, mask=row_ok)
            tl.store(corner_weight_ptr + at + 2, ay1 - w11, mask=row_ok)
            tl.store(corner_weight_ptr + at + 3, w11, mask=row_ok)
        else:
            tl.atomic_add(grad_value_ptr + offset, (ay0 - w01)[:, None] * g, mask=m00, sem="relaxed")
            tl.atomic_add(grad_value_ptr + o01, w01[:, None] * g, mask=m01, sem="relaxed")
            tl.atomic_add(grad_value_ptr + o10, (ay1 - w11)[:, None] * g, mask=m10, sem="relaxed")
            tl.atomic_add(grad_value_ptr + o11, w11[:, None] * g, mask=m11, sem="relaxed")


@triton.jit
def _value_grad_kernel(
    order_ptr, corner_weight_ptr, bounds_ptr, grad_out_ptr, grad_value_ptr, V,
    D: tl.constexpr, CORNERS: tl.constexpr, ACC: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """The value gradient without atomics: row v's channels are the sum, over the sample corners that read
    row v, of corner weight x output gradient. ``order`` lists the corners sorted by value row (stably), row
    v's being ``order[bounds[v]:bounds[v + 1]]``; ``CORNERS`` is 4 x samples per (query row, head)."""
    v = tl.program_id(0) * BLOCK_V + tl.arange(0, BLOCK_V)
    v_ok = v < V
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    d_ok = _channels_in_range(d, D, BLOCK_D)
    first = tl.load(bounds_ptr + v, mask=v_ok, other=0)
    count = tl.load(bounds_ptr + v + 1, mask=v_ok, other=0) - first
    acc = tl.zeros((BLOCK_V, BLOCK_D), dtype=ACC)
    # each (row, channel) lane adds its own corners one by one in the sorted order, so neither block size
    # nor the rows sharing a program change a bit of it
    for k in range(0, tl.max(count, 0)):
        live = k < count
        corner = tl.load(order_ptr + first + k, mask=live, other=0)
        weight = tl.load(corner_weight_ptr + corner, mask=live, other=0.0)
        # a corner's (query row, head) is its index // CORNERS: the row of the (R * M, D) output gradient
        g = tl.load(grad_out_ptr + ((corner // CORNERS) * D)[:, None] + d[None, :], mask=live[:, None] & d_ok, other=0.0)
        # where, not a masked add of 0: adding +0.0 turns a -0.0 sum positive, depending on which rows share the block
        acc = tl.where(live[:, None], acc + weight[:, None] * g.to(ACC), acc)
    out = grad_value_ptr + (v.to(tl.int64) * D)[:, None] + d[None, :]
    tl.store(out, acc.to(grad_value_ptr.dtype.element_ty), mask=v_ok[:, None] & d_ok)


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


def _launch(kernel, grid: Callable, block_q: str, *args, **meta) -> None:
    """``kernel`` as autotuned, or under deterministic algorithms at the fixed ``DETERMINISTIC_BLOCKS[block_q]``
    query rows per program (the autotuner's choice follows timings)."""
    if torch.are_deterministic_algorithms_enabled():
        kernel.fn[grid](*args, BLOCK_Q=DETERMINISTIC_BLOCKS[block_q], num_warps=4, **meta)
    else:
        kernel[grid](*args, **meta)


def _summed_value_grad(corner_rows: Tensor, corner_weights: Tensor, grad_out: Tensor, value: Tensor, corners: int) -> Tensor:
    """The value's gradient (in its dtype) from every sample corner's value row and weight, without atomics.

    ``corner_rows``, ``corner_weights`` (R * M * corners,) as :func:`_backward_kernel` writes them under
    ``DETERMINISTIC`` (rows outside every map: N * S * M); ``grad_out`` (R, M * D) contiguous.
    """
    N, S, M, D = value.shape
    V = N * S * M
    # stable: the corners of one value row keep the order they were written in, (query row, head, sample,
    # corner), so the sort's output, and with it each row's order of addition, is a function of the inputs
    # alone (an unstable sort may order equal keys by thread timing)
    sorted_rows, order = torch.sort(corner_rows, stable=True)
    bounds = torch.searchsorted(sorted_rows, torch.arange(V + 1, dtype=sorted_rows.dtype, device=sorted_rows.device))
    del sorted_rows
    grad_value = torch.empty_like(value)
    block_v = DETERMINISTIC_BLOCKS["BLOCK_V"]
    block_d = DETERMINISTIC_BLOCKS["BLOCK_D"] or min(triton.next_power_of_2(D), 64)
    grid = (triton.cdiv(V, block_v), triton.cdiv(D, block_d))
    _value_grad_kernel[grid](order, corner_weights, bounds, grad_out, grad_value, V, D=D, CORNERS=corners,
                             ACC=tl.float64 if value.dtype == torch.float64 else tl.float32, BLOCK_V=block_v, BLOCK_D=block_d,
                             num_warps=4)
    return grad_value


class _FusedSample(torch.autograd.Function):
    """(value, pixel coordinates, attention weights) -> weighted bilinear samples, in two Triton kernels.

    ``value`` (N, S, M, D) contiguous; ``pix`` (R, 2, M, J) pixel x and y planes of R query rows;
    ``attn`` (R, M, J); ``levels`` from :func:`_levels`; ``image`` (R,) each row's image, or None
    when row r is query r % Q of image r // Q. Returns (R, M * D) in the value's dtype. The backward
    sums the value's gradient without atomics under ``torch.use_deterministic_algorithms(True)``.
    """

    @staticmethod
    def forward(ctx, value, pix, attn, levels, image, Q, P):
        R, _, M, J = pix.shape
        S, D = value.shape[1], value.shape[3]
        meta, grid = _launch_args(value, pix, image is not None)
        out = value.new_empty(R, M * D)
        rows_image = image if image is not None else levels  # any pointer: unread when not packed
        _launch(_forward_kernel, grid, "BLOCK_Q_FORWARD", value, pix, attn, levels, rows_image, out, R, Q, S, L=J // P, P=P, **meta)
        ctx.save_for_backward(value, pix, attn, levels, rows_image)
        ctx.Q, ctx.P, ctx.packed = Q, P, image is not None
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        value, pix, attn, levels, rows_image = ctx.saved_tensors
        R, _, M, J = pix.shape
        N, S = value.shape[:2]
        meta, grid = _launch_args(value, pix, ctx.packed)
        meta.update(L=J // ctx.P, P=ctx.P)
        acc = torch.float64 if value.dtype == torch.float64 else torch.float32
        grad_out = grad_out.contiguous()
        grad_pix = torch.empty_like(pix)
        grad_attn = torch.empty_like(attn)
        inputs = (value, pix, attn, levels, rows_image, grad_out)
        if torch.are_deterministic_algorithms_enabled():
            no_row = N * S * M
            corners = R * M * J * 4
            # int32 rows where they fit: half the radix sort's passes and memory of int64 ones
            rows = torch.empty(corners, dtype=torch.int32 if no_row < 2**31 - 1 else torch.int64, device=value.device)
            weights = torch.empty(corners, dtype=acc, device=value.device)
            # the grad_value argument is unread in this variant: any pointer
            _launch(_backward_kernel, grid, "BLOCK_Q_BACKWARD", *inputs, weights, grad_pix, grad_attn, rows, weights,
                    R, ctx.Q, S, no_row, DETERMINISTIC=True, **meta)
            grad_value = _summed_value_grad(rows, weights, grad_out, value, 4 * J)
            return grad_value, grad_pix, grad_attn, None, None, None, None
        grad_value = torch.zeros(value.shape, dtype=acc, device=value.device)
        # the corner row and weight arguments are unread in this variant: any pointers
        _backward_kernel[grid](*inputs, grad_value, grad_pix, grad_attn, grad_value, grad_value, R, ctx.Q, S, 0, **meta)
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
