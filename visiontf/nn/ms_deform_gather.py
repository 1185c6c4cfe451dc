"""The ``"gather"`` core of multi-scale deformable attention: one weighted gather-sum over all levels.

The value is copied into the zero-bordered table of :mod:`visiontf.nn.ms_deform_tables`; for every
sample the four bilinear corner rows and weights are computed, the attention weight is folded into
the corner weights, and ``F.embedding_bag(mode="sum", per_sample_weights=...)`` reduces them
without materialising the (samples, head_dim) tensor. The backward is written out: the
corner-weight gradient (hence the locations' and attention weights') is a sampled dense-dense
product on the same sparsity pattern, the table's a sort of the samples' top-left rows and one
``embedding_bag`` per corner. The fast path on CPU (``benchmarks/deformable_detr.py``).
"""
from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import Tensor

from visiontf.nn.ms_deform_tables import SpatialShapes, as_shapes, bordered_table, gather_constants
from visiontf.nn.packed_tokens import PackedTokens

__all__ = ["core_gather", "gather_core"]


class _BilinearGatherSum(torch.autograd.Function):
    """Bilinear samples of the bordered table, weighted and summed per (image, query, head).

    Inputs (N images, Q queries, M heads, J = levels x points samples; everything contiguous in J,
    so every elementwise step vectorises):

    * ``table`` (R, D): rows ordered (image, bordered position, head);
    * ``pix`` (N, Q, 2, M, J): pixel coordinates x (plane 0) and y (plane 1), ``loc * size - 0.5``;
    * ``attn`` (N, Q, M, J): attention weights;
    * ``consts``: from :func:`gather_constants`.

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

    Deterministic by construction, with no atomics: every row's sum is over its samples in sample order
    (a stable sort), and each row is written by exactly one block add or one index (the targets of an
    ``index_put_`` are distinct).
    """
    J = keys.shape[1]
    flat = keys.reshape(-1)
    # stable: a key's samples stay in sample order, so each per-key sum adds the same terms in the same order
    # whatever the sort's implementation, device or thread count (deterministic, as
    # torch.use_deterministic_algorithms asks); on the CPU the default sort was already stable, at the same cost
    sorted_keys, order = torch.sort(flat, stable=True)
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
    shapes = tuple(as_shapes(spatial_shapes))
    Q, J = pix.shape[1], pix.shape[-1]
    M, D = value.shape[2:]
    N = value.shape[0] if packed is None else packed.padding_mask.shape[0]
    dtype = torch.float64 if value.dtype == torch.float64 else torch.float32
    consts = gather_constants(shapes, N, M, J // len(shapes), value.device)
    if packed is not None:
        # each packed query's own image
        consts = {**consts, "key_base": consts["key_base"].squeeze(1).index_select(0, packed.image).unsqueeze(0)}
    table = bordered_table(value, shapes, dtype, N, packed)
    out = _BilinearGatherSum.apply(table, pix.to(dtype).contiguous(), attn.to(dtype).contiguous(), consts)
    return out.view(pix.shape[0], Q, M * D).to(value.dtype)


def core_gather(value: Tensor, shapes: list[tuple[int, int]], loc: Tensor, attn: Tensor) -> Tensor:
    N, Q, M, L, P, _ = loc.shape
    dtype = torch.float64 if value.dtype == torch.float64 else torch.float32
    size = torch.tensor([(w, h) for h, w in shapes], dtype=dtype, device=loc.device).view(L, 1, 2)
    # grid_sample's align_corners=False convention: pixel coordinate = loc * size - 0.5
    pix = (loc.to(dtype) * size - 0.5).permute(0, 1, 5, 2, 3, 4).reshape(N, Q, 2, M, L * P)
    return gather_core(value, shapes, pix, attn.reshape(N, Q, M, L * P))
