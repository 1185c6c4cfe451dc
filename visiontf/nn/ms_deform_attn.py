"""Multi-scale deformable attention (Zhu et al., 2021, "Deformable DETR"), batch-first, pure PyTorch.

Each query attends to ``n_points`` sampled locations per head on each of ``n_levels`` feature
maps. The sampling location is ``reference + offset / (W_l, H_l)`` (2-d point references) or
``ref_xy + offset / n_points * ref_wh / 2`` (4-d box references); the value there is read by
bilinear interpolation with zero padding and ``align_corners=False`` (``F.grid_sample``'s
convention), and the samples are summed with weights softmax-normalised over levels x points.

Two interchangeable cores compute the same thing (see :func:`ms_deform_attn_core`):

* ``"gather"`` (default): one weighted gather-sum over all levels with no per-level Python loop.
  The value is copied into a table of (image x position x head) rows in which every level map has
  a zero border, so ``grid_sample``'s zero padding needs no per-corner range test; for every
  sample the four bilinear corner rows and weights are computed, the attention weight is folded
  into the corner weights, and ``F.embedding_bag(mode="sum", per_sample_weights=...)`` reduces
  them without materialising the (samples, head_dim) tensor. The backward is written out: the
  corner-weight gradient (hence the locations' and attention weights') is a sampled dense-dense
  product on the same sparsity pattern, the table's a sort of the samples' top-left rows and one
  ``embedding_bag`` per corner. This is the fast path on CPU (``benchmarks/deformable_detr.py``).
* ``"grid_sample"``: the original's pure-PyTorch design, one ``F.grid_sample`` per level. ONNX
  exports it (GridSample, opset 16+), and the tests use it as a cross-check.

Samples whose location is outside its map contribute zero, as in ``grid_sample``; a location
that is NaN or infinite makes its query's output NaN in both cores (as ``grid_sample`` does), so a
diverged model shows up in the loss instead of silently reading zeros or out-of-range memory.
"""
from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from visiontf.nn.tensor_cache import tensor_cache

SpatialShapes = Sequence[tuple[int, int]]
METHODS = ("gather", "grid_sample")


@dataclass(frozen=True)
class PackedTokens:
    """The unpadded positions of a (N, S) batch of flattened maps, packed into T rows.

    Deformable DETR's encoder output at padded positions is never used (those values are zeroed
    wherever they are read), so its per-token work (projections, FFN, attention queries) can skip
    them: :class:`~visiontf.models.deformable_transformer.DeformableTransformerEncoder` packs the
    tokens with this and the attention reads packed queries and values.

    Attributes:
        index: (T,) flat position ``n * S + s`` of each packed token, increasing.
        image: (T,) its image n; ``position``: (T,) its position s.
        padding_mask: (N, S) the mask it was made from (True on padding).
    """

    index: Tensor
    image: Tensor
    position: Tensor
    padding_mask: Tensor

    @classmethod
    def from_mask(cls, padding_mask: Tensor) -> PackedTokens:
        N, S = padding_mask.shape
        index = (~padding_mask).flatten().nonzero().squeeze(1)
        return cls(index, torch.div(index, S, rounding_mode="floor"), index % S, padding_mask)

    def pack(self, x: Tensor) -> Tensor:
        """(N, S, ...) -> (T, ...)."""
        return x.flatten(0, 1).index_select(0, self.index)

    def unpack(self, x: Tensor) -> Tensor:
        """(T, ...) -> (N, S, ...) with zeros at padded positions."""
        N, S = self.padding_mask.shape
        # index_put, not index_copy: the same rows, about 10x faster on CPU (index_copy copies row by row)
        return x.new_zeros((N * S, *x.shape[1:])).index_put((self.index,), x).view(N, S, *x.shape[1:])


def _as_shapes(spatial_shapes) -> list[tuple[int, int]]:
    if isinstance(spatial_shapes, Tensor):
        return [(int(h), int(w)) for h, w in spatial_shapes.tolist()]
    return [(int(h), int(w)) for h, w in spatial_shapes]


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
        method: ``"gather"`` or ``"grid_sample"`` (see the module docstring).

    Returns:
        (N, Lq, M * D).
    """
    shapes = _as_shapes(spatial_shapes)
    S = value.shape[1]
    if sum(h * w for h, w in shapes) != S:
        raise ValueError(f"spatial_shapes {shapes} hold {sum(h * w for h, w in shapes)} positions, but value has S = {S}")
    if method == "gather":
        return _core_gather(value, shapes, sampling_locations, attention_weights)
    if method == "grid_sample":
        return _core_grid_sample(value, shapes, sampling_locations, attention_weights)
    raise ValueError(f"method must be one of {METHODS}, got {method!r}")


def _core_grid_sample(value: Tensor, shapes: list[tuple[int, int]], loc: Tensor, attn: Tensor) -> Tensor:
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


def _float(t: Tensor) -> Tensor:
    """float32, or float64 when given float64 (gradcheck): locations never run in half precision."""
    return t if t.dtype == torch.float64 else t.float()


#: zero border around every level map in the gather table: 1 before, 2 after (a location clamped
#: to x = W has its corners at W and W + 1), so no corner ever needs an in-range test or wraps into
#: the next row, level or image
_PAD_LO, _PAD_HI = 1, 2


@tensor_cache(maxsize=64)
def _bordered_layout(shapes: tuple[tuple[int, int], ...], device: torch.device) -> tuple[Tensor, Tensor, Tensor, int]:
    """Layout of the zero-bordered level maps, computed once per set of shapes.

    Returns ``(interior, start, width, total)``: ``interior`` (S,) the bordered position of each
    value position; ``start`` (L,) and ``width`` (L,) each bordered map's offset and row length;
    ``total`` the number of bordered positions.
    """
    hw = torch.tensor(shapes, dtype=torch.int64)
    h, w = hw[:, 0], hw[:, 1]
    wp = w + _PAD_LO + _PAD_HI
    sizes = (h + _PAD_LO + _PAD_HI) * wp
    start = sizes.cumsum(0) - sizes
    level = torch.repeat_interleave(torch.arange(len(shapes)), h * w)
    local = torch.arange(int((h * w).sum())) - ((h * w).cumsum(0) - h * w)[level]
    i, j = local // w[level], local % w[level]
    interior = start[level] + (i + _PAD_LO) * wp[level] + j + _PAD_LO
    return interior.to(device), start.to(device), wp.to(device), int(sizes.sum())


@tensor_cache(maxsize=64)
def _gather_constants(shapes: tuple[tuple[int, int], ...], N: int, M: int, P: int, device: torch.device) -> dict:
    """Per-sample constants of the gather core in its (N, Q, M, J = L * P) layout, one set per shapes.

    ``key_base`` (N, 1, M, J): table row of bordered position (-1, -1) of the sample's level, image
    and head; ``row_stride`` (J,): rows per bordered map row; ``corner`` (4, J): row offsets of the 4
    bilinear corners (y0x0, y0x1, y1x0, y1x1) from the top-left one; ``size`` (2, 1, J): (W, H).
    """
    _, start, width, total = _bordered_layout(shapes, device)
    L = len(shapes)
    per_sample = lambda t: t.repeat_interleave(P, dim=-1)  # noqa: E731  level -> (level, point)
    base = (start + (width + 1) * _PAD_LO) * M  # (L,)
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
        (int(a) * M, (int(a) + (h + _PAD_LO + _PAD_HI) * int(wp)) * M, (0, M, int(wp) * M, (int(wp) + 1) * M))
        for a, wp, (h, _) in zip(start.tolist(), width.tolist(), shapes)
    )
    return {"key_base": key_base, "row_stride": per_sample(width * M), "corner": corner, "size": size, "total": total,
            "spans": spans, "image_rows": total * M}


class _BilinearGatherSum(torch.autograd.Function):
    """Bilinear samples of the bordered table, weighted and summed per (image, query, head).

    Inputs (N images, Q queries, M heads, J = levels x points samples; everything contiguous in J,
    so every elementwise step vectorises):

    * ``table`` (R, D): rows ordered (image, bordered position, head);
    * ``pix`` (N, Q, 2, M, J): pixel coordinates x (plane 0) and y (plane 1), ``loc * size - 0.5``;
    * ``attn`` (N, Q, M, J): attention weights;
    * ``consts``: from :func:`_gather_constants`.

    Forward: ``F.embedding_bag`` with the 4 corner weights of every sample as per-sample weights,
    which never materialises the gathered (samples, D) rows. Backward, written out rather than
    left to autograd (one pass instead of a graph of broadcast products): the corner-weight
    gradient is a sampled dense-dense product on the same sparsity pattern
    (``torch.sparse.sampled_addmm``), from which the location and attention gradients follow in
    closed form; the table gradient sorts the top-left keys (see :func:`_table_grad`).
    """

    @staticmethod
    def forward(ctx, table, pix, attn, consts):
        N, Q, _, M, J = pix.shape
        size = consts["size"].to(pix.dtype)
        # A non-finite location gives NaN (as in grid_sample) through its attention weight; before
        # the integer cast every location is clamped to [-1, size], where the zero border makes
        # far-away points read zeros.
        if pix.device.type != "cpu" or not bool(torch.isfinite(pix).all()):
            attn = torch.where(torch.isfinite(pix).all(2), attn, float("nan"))
        clamped = torch.minimum(pix.nan_to_num(nan=-1.0).clamp_min(-1.0), size)
        floor = clamped.floor()
        fx, fy = (clamped - floor).unbind(2)
        # top-left corner rows; int32 (faster to build, gather and sort) whenever the table allows
        index_dtype = torch.int32 if table.shape[0] + int(consts["corner"].max()) < 2**31 else torch.int64
        cx, cy = floor.to(index_dtype).unbind(2)
        keys = cy * consts["row_stride"].to(index_dtype) + cx * M + consts["key_base"].to(index_dtype)  # (N, Q, M, J)
        ay0, ay1 = attn * (1 - fy), attn * fy
        weights = torch.stack((ay0 * (1 - fx), ay0 * fx, ay1 * (1 - fx), ay1 * fx), 3)  # (N, Q, M, 4, J)
        rows = keys.unsqueeze(3) + consts["corner"].to(index_dtype)
        out = F.embedding_bag(rows.view(N * Q * M, 4 * J), table, per_sample_weights=weights.view(N * Q * M, 4 * J), mode="sum")
        ctx.save_for_backward(table, pix, fx, fy, attn, keys)
        ctx.consts = consts
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        table, pix, fx, fy, attn, keys = ctx.saved_tensors
        consts = ctx.consts
        N, Q, _, M, J = pix.shape
        B = N * Q * M
        grad = grad.contiguous()
        grad_table = grad_pix = grad_attn = None
        if ctx.needs_input_grad[1] or ctx.needs_input_grad[2]:
            rows = (keys.long().unsqueeze(3) + consts["corner"]).view(-1)
            nnz = rows.numel()
            crow = torch.arange(0, nnz + 1, 4 * J, device=rows.device)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "sparse CSR support is in beta"
                # beta=0 still reads the values (0 * NaN = NaN): they must be zeros
                products = torch.sparse_csr_tensor(crow, rows, grad.new_zeros(nnz), size=(B, table.shape[0]))
                torch.sparse.sampled_addmm(products, grad, table.t(), beta=0.0, out=products)  # in place: no copy
            g00, g01, g10, g11 = products.values().view(N, Q, M, 4, J).unbind(3)
            if ctx.needs_input_grad[2]:
                grad_attn = (1 - fy) * ((1 - fx) * g00 + fx * g01) + fy * ((1 - fx) * g10 + fx * g11)
            if ctx.needs_input_grad[1]:
                grad_fx = attn * ((1 - fy) * (g01 - g00) + fy * (g11 - g10))
                grad_fy = attn * ((1 - fx) * (g10 - g00) + fx * (g11 - g01))
                # locations clamped at either end get no gradient: everything outside reads zeros
                grad_pix = torch.stack((grad_fx, grad_fy), 2) * ((pix > -1.0) & (pix < consts["size"]))
        if ctx.needs_input_grad[0]:
            grad_table = _table_grad(grad, fx.reshape(B * J), fy.reshape(B * J), attn.reshape(B * J), keys.view(B, J), consts["corner"],
                                     table.shape[0], consts["spans"], consts["image_rows"])
        return grad_table, grad_pix, grad_attn, None


def _table_grad(
    grad: Tensor, fx: Tensor, fy: Tensor, attn: Tensor, keys: Tensor, corner: Tensor, rows: int,
    spans: tuple[tuple[int, int, tuple[int, int, int, int]], ...], image_rows: int,
) -> Tensor:
    """``d out / d table``: each bag's gradient, weighted, summed into its samples' 4 corner rows.

    ``grad`` (B, D); per sample (B*J,): fractional position ``fx``, ``fy`` and attention weight;
    ``keys`` (B, J) top-left rows; ``corner`` (4, J) row offsets. The B*J keys are sorted once
    (int32 when they fit: several times faster than int64); per corner, one ``embedding_bag`` over
    the sorted samples sums them per key, and the sums are added at the corner's rows. With more
    samples than rows (the encoder) the per-key sums are dense over all rows, empty bags included;
    otherwise (the decoder) only over the keys present. Dense sums are added per level as whole
    shifted blocks (``spans``: each level's rows in an image's block of ``image_rows`` rows and its
    corner offsets), several times faster than an accumulating scatter of every row.
    """
    J = keys.shape[1]
    flat = keys.reshape(-1)
    sorted_keys, order = torch.sort(flat)
    # dense per-key sums write every row 4 times: worth it only when samples far outnumber rows
    dense = flat.numel() >= 4 * rows
    if dense:
        counts = torch.bincount(sorted_keys, minlength=rows)
        targets = torch.arange(rows, device=grad.device)
    else:
        targets, counts = torch.unique_consecutive(sorted_keys, return_counts=True)
        targets = targets.long()
    offsets = counts.cumsum(0) - counts
    order = order.to(sorted_keys.dtype)
    bag = torch.div(order, J, rounding_mode="floor")
    # corner offsets of each key, from its first sample (all samples of a key share its level);
    # keys with no sample (dense case) get some in-range value: their sums are zero
    key_corner = corner[:, order[offsets.clamp_max(flat.numel() - 1)].long() % J]  # (4, U)
    # the 4 corner weights in sorted order, from 3 gathered factors
    fx, fy, attn = (t.index_select(0, order) for t in (fx, fy, attn))
    ay = (attn * (1 - fy), attn * fy)
    grad_table = torch.zeros(rows, grad.shape[1], dtype=grad.dtype, device=grad.device)
    for c in range(4):
        weight = ay[c // 2] * (fx if c % 2 else 1 - fx)
        per_key = F.embedding_bag(bag, grad, offsets.to(bag.dtype), per_sample_weights=weight, mode="sum")
        if dense and c == 0:
            grad_table += per_key
        elif dense:
            # key k's corner c is row k + offset of k's level: one block add per level, over all images
            # (keys in a level's last rows have no samples, so a block may end early or spill zeros)
            into, sums = grad_table.view(-1, image_rows, grad.shape[1]), per_key.view(-1, image_rows, grad.shape[1])
            for first, end, corner_rows in spans:
                shift = corner_rows[c]
                end = min(end, image_rows - shift)
                into[:, first + shift : end + shift] += sums[:, first:end]
        else:
            grad_table.index_put_(((targets + key_corner[c]).clamp_max(rows - 1),), per_key, accumulate=True)
    return grad_table


def _bordered_table(value: Tensor, shapes: tuple[tuple[int, int], ...], dtype: torch.dtype, N: int, packed: PackedTokens | None) -> Tensor:
    """(N * total * M, D): every level map inside its zero border, rows ordered (image, position, head).

    ``value`` is (N, S, M, D), or (1, T, M, D) ``packed`` rows (padded positions then stay zero).
    One row scatter forward (``index_put`` into zeros; ``index_copy`` is about 10x slower on CPU)
    and one gather backward.
    """
    _, _, M, D = value.shape
    interior, _, _, total = _bordered_layout(shapes, value.device)
    if packed is None:
        into = (torch.arange(N, device=value.device).view(N, 1) * total + interior).view(-1)
    else:
        into = packed.image * total + interior[packed.position]
    table = value.new_zeros(N * total, M * D, dtype=dtype).index_put((into,), value.reshape(-1, M * D).to(dtype))
    return table.view(N * total * M, D)


def gather_core(value: Tensor, spatial_shapes: SpatialShapes, pix: Tensor, attn: Tensor, packed: PackedTokens | None = None) -> Tensor:
    """The ``"gather"`` core in its native layout (what :class:`MSDeformAttn` calls).

    Args:
        value: (N, S, M, D).
        pix: (N, Q, 2, M, J) pixel coordinates ``loc * (W, H) - 0.5`` of each sample, x then y
            planes, J = L * P ordered (level, point).
        attn: (N, Q, M, J) attention weights.
        packed: queries and values are the packed tokens of a self-attention: value (1, T, M, D),
            pix (1, T, 2, M, J), attn (1, T, M, J).

    Returns:
        (N, Q, M * D) (packed: (1, T, M * D)), in ``value``'s dtype (computed in float32, or
        float64 for float64 inputs).
    """
    shapes = tuple(_as_shapes(spatial_shapes))
    Q, J = pix.shape[1], pix.shape[-1]
    M, D = value.shape[2:]
    N = value.shape[0] if packed is None else packed.padding_mask.shape[0]
    dtype = torch.float64 if value.dtype == torch.float64 else torch.float32
    consts = _gather_constants(shapes, N, M, J // len(shapes), value.device)
    if packed is not None:
        # each packed query's own image
        consts = {**consts, "key_base": consts["key_base"].squeeze(1).index_select(0, packed.image).unsqueeze(0)}
    table = _bordered_table(value, shapes, dtype, N, packed)
    out = _BilinearGatherSum.apply(table, pix.to(dtype).contiguous(), attn.to(dtype).contiguous(), consts)
    return out.view(pix.shape[0], Q, M * D).to(value.dtype)


def _core_gather(value: Tensor, shapes: list[tuple[int, int]], loc: Tensor, attn: Tensor) -> Tensor:
    N, Q, M, L, P, _ = loc.shape
    dtype = torch.float64 if value.dtype == torch.float64 else torch.float32
    size = torch.tensor([(w, h) for h, w in shapes], dtype=dtype, device=loc.device).view(L, 1, 2)
    # grid_sample's align_corners=False convention: pixel coordinate = loc * size - 0.5
    pix = (loc.to(dtype) * size - 0.5).permute(0, 1, 5, 2, 3, 4).reshape(N, Q, 2, M, L * P)
    return gather_core(value, shapes, pix, attn.reshape(N, Q, M, L * P))


class MSDeformAttn(nn.Module):
    """Multi-scale deformable attention with the original's parameters and initialisation.

    Parameters (the original names, so its checkpoints load unchanged): ``sampling_offsets``
    Linear(d, heads*levels*points*2), ``attention_weights`` Linear(d, heads*levels*points),
    ``value_proj`` and ``output_proj`` Linear(d, d).

    Args:
        d_model: channels of queries and values.
        n_levels: feature levels sampled.
        n_heads: attention heads; ``d_model`` must be divisible by it.
        n_points: sampling points per head and level.
        method: core used in ``forward``, ``"gather"`` (fast) or ``"grid_sample"`` (exportable).
    """

    def __init__(self, d_model: int = 256, n_levels: int = 4, n_heads: int = 8, n_points: int = 4, method: str = "gather") -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model must be divisible by n_heads, got {d_model} and {n_heads}")
        if method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {method!r}")
        self.d_model = d_model
        self.n_levels = n_levels
        self.n_heads = n_heads
        self.n_points = n_points
        self.method = method
        self.sampling_offsets = nn.Linear(d_model, n_heads * n_levels * n_points * 2)
        self.attention_weights = nn.Linear(d_model, n_heads * n_levels * n_points)
        self.value_proj = nn.Linear(d_model, d_model)
        self.output_proj = nn.Linear(d_model, d_model)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """The original's: offsets start on a per-head direction scaled by the point index, weights at zero."""
        nn.init.zeros_(self.sampling_offsets.weight)
        thetas = torch.arange(self.n_heads, dtype=torch.float32) * (2.0 * math.pi / self.n_heads)
        grid = torch.stack([thetas.cos(), thetas.sin()], -1)
        # the largest of |x|, |y| becomes 1, so head h looks one pixel (times the point index) away
        grid = grid / grid.abs().max(-1, keepdim=True)[0]
        grid = grid.view(self.n_heads, 1, 1, 2).repeat(1, self.n_levels, self.n_points, 1)
        grid = grid * torch.arange(1, self.n_points + 1, dtype=torch.float32).view(1, 1, -1, 1)
        with torch.no_grad():
            self.sampling_offsets.bias.copy_(grid.view(-1))
        nn.init.zeros_(self.attention_weights.weight)
        nn.init.zeros_(self.attention_weights.bias)
        nn.init.xavier_uniform_(self.value_proj.weight)
        nn.init.zeros_(self.value_proj.bias)
        nn.init.xavier_uniform_(self.output_proj.weight)
        nn.init.zeros_(self.output_proj.bias)

    def sampling(self, query: Tensor, reference_points: Tensor, spatial_shapes: SpatialShapes) -> tuple[Tensor, Tensor]:
        """Sampling locations (N, Lq, M, L, P, 2) in float32 and attention weights (N, Lq, M, L, P)."""
        N, Lq, _ = query.shape
        M, L, P = self.n_heads, self.n_levels, self.n_points
        offsets = _float(self.sampling_offsets(query).view(N, Lq, M, L, P, 2))
        weights = _float(self.attention_weights(query).view(N, Lq, M, L * P)).softmax(-1).view(N, Lq, M, L, P)
        ref = _float(reference_points)
        if ref.shape[-1] == 2:
            # offsets are in pixels of each level: divide by (W_l, H_l)
            normalizer = torch.tensor([(w, h) for h, w in _as_shapes(spatial_shapes)], dtype=offsets.dtype, device=query.device)
            loc = ref[:, :, None, :, None, :] + offsets / normalizer[None, None, None, :, None, :]
        elif ref.shape[-1] == 4:
            # box references: offsets are fractions of half the box size, spread over the points
            loc = ref[:, :, None, :, None, :2] + offsets / P * ref[:, :, None, :, None, 2:] * 0.5
        else:
            raise ValueError(f"reference_points must end in 2 (points) or 4 (boxes) coordinates, got {tuple(reference_points.shape)}")
        return loc, weights

    def forward(
        self,
        query: Tensor,
        reference_points: Tensor,
        value: Tensor,
        spatial_shapes: SpatialShapes,
        value_padding_mask: Tensor | None = None,
        packed: PackedTokens | None = None,
    ) -> Tensor:
        """Attend from every query to its sampled points.

        Args:
            query: (N, Lq, C), position embedding already added.
            reference_points: (N, Lq, L, 2) normalised (x, y), or (N, Lq, L, 4) boxes (cx, cy, w, h),
                per level (the decoder scales them by each level's valid ratio).
            value: (N, S, C) flattened multi-level input, S = sum(H_l * W_l).
            spatial_shapes: (H_l, W_l) of each level.
            value_padding_mask: (N, S) bool, True on padded positions (their values are zeroed).
            packed: self-attention over the unpadded tokens only: query, reference_points and
                value are their packed rows, (1, T, ·) (see :class:`PackedTokens`).

        Returns:
            (N, Lq, C), or (1, T, C) packed.
        """
        N, Lq, C = query.shape
        S = value.shape[1]
        shapes = _as_shapes(spatial_shapes)
        if len(shapes) != self.n_levels:
            raise ValueError(f"MSDeformAttn has n_levels={self.n_levels}, got spatial_shapes for {len(shapes)} levels")
        if reference_points.shape[:3] != (N, Lq, self.n_levels):
            raise ValueError(
                f"reference_points must be (N, Lq, n_levels, 2|4) = ({N}, {Lq}, {self.n_levels}, ·), got {tuple(reference_points.shape)}"
            )
        if reference_points.shape[-1] not in (2, 4):
            raise ValueError(f"reference_points must end in 2 (points) or 4 (boxes) coordinates, got {tuple(reference_points.shape)}")
        if packed is not None and self.method != "gather":
            # the grid_sample core needs whole maps: unpack, attend, pack
            out = self.forward(*(packed.unpack(t[0]) for t in (query, reference_points, value)), shapes, packed.padding_mask)
            return packed.pack(out).unsqueeze(0)
        v = self.value_proj(value)
        if value_padding_mask is not None:
            v = v.masked_fill(value_padding_mask[..., None], 0.0)
        v = v.view(N, S, self.n_heads, C // self.n_heads)
        if self.method == "gather":
            pix, weights = self._pixel_sampling(query, reference_points, shapes)
            out = gather_core(v, shapes, pix, weights, packed)
        else:
            loc, weights = self.sampling(query, reference_points, shapes)
            out = ms_deform_attn_core(v, shapes, loc, weights, self.method)
        return self.output_proj(out)

    def _pixel_sampling(self, query: Tensor, reference_points: Tensor, shapes: list[tuple[int, int]]) -> tuple[Tensor, Tensor]:
        """The gather core's inputs: pixel coordinates (N, Lq, 2, M, L*P) and weights (N, Lq, M, L*P).

        The same locations as :meth:`sampling`, laid out for vectorised elementwise work: one GEMM
        (offsets and attention logits together, the offset rows reordered) gives contiguous x and y
        planes (instead of (x, y) pairs),
        and the per-level terms are folded into (L*P,)-long rows: for points, pixel =
        ``offset + ref * size - 0.5``; for boxes, ``offset * ref_wh * size / (2P) + ref_xy * size - 0.5``.
        """
        N, Lq, C = query.shape
        M, L, P = self.n_heads, self.n_levels, self.n_points
        K = M * L * P
        # one GEMM for offsets (rows reordered x-plane, y-plane) and attention logits
        w = torch.cat([self.sampling_offsets.weight.view(K, 2, C).transpose(0, 1).reshape(2 * K, C), self.attention_weights.weight])
        b = torch.cat([self.sampling_offsets.bias.view(K, 2).t().reshape(-1), self.attention_weights.bias])
        offsets, logits = F.linear(query, w, b).split([2 * K, K], dim=-1)
        offsets = _float(offsets).reshape(N, Lq, 2, M, L * P)
        weights = _float(logits).reshape(N, Lq, M, L * P).softmax(-1)
        ref = _float(reference_points)
        size = torch.tensor([(w_, h_) for h_, w_ in shapes], dtype=ref.dtype, device=ref.device)  # (L, 2)
        # (N, Lq, L, 2) -> (N, Lq, 2, 1, L*P): one value per (image, query, axis, level), repeated per point
        per_point = lambda t: t.transpose(2, 3).repeat_interleave(P, dim=-1).unsqueeze(3)  # noqa: E731
        base = per_point(ref[..., :2] * size - 0.5)
        if ref.shape[-1] == 2:
            pix = offsets + base
        else:
            pix = offsets * per_point(ref[..., 2:] * size * (0.5 / P)) + base
        return pix, weights

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, n_levels={self.n_levels}, n_heads={self.n_heads}, n_points={self.n_points}, method={self.method!r}"
