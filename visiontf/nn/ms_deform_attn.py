"""Multi-scale deformable attention (Zhu et al., 2021, "Deformable DETR"), batch-first, pure PyTorch.

Each query attends to ``n_points`` sampled locations per head on each of ``n_levels`` feature
maps. The sampling location is ``reference + offset / (W_l, H_l)`` (2-d point references) or
``ref_xy + offset / n_points * ref_wh / 2`` (4-d box references); the value there is read by
bilinear interpolation with zero padding and ``align_corners=False`` (``F.grid_sample``'s
convention), and the samples are summed with weights softmax-normalised over levels x points.

Interchangeable cores compute the same thing (see :func:`~visiontf.nn.ms_deform_core.ms_deform_attn_core`):

* ``"gather"`` (default): on CUDA tensors the fused Triton kernels (:mod:`visiontf.nn.ms_deform_triton`:
  one program per block of queries and head reads the 4 corner rows of every sample and sums them
  in registers; the backward adds the value's gradient with atomics, or without them when deterministic
  algorithms are asked for). Elsewhere, the gather core: one weighted gather-sum over all levels with no
  per-level Python loop.
  The value is copied into a table of (image x position x head) rows in which every level map has
  a zero border, so ``grid_sample``'s zero padding needs no per-corner range test; for every
  sample the four bilinear corner rows and weights are computed, the attention weight is folded
  into the corner weights, and ``F.embedding_bag(mode="sum", per_sample_weights=...)`` reduces
  them without materialising the (samples, head_dim) tensor. The backward is written out: the
  corner-weight gradient (hence the locations' and attention weights') is a sampled dense-dense
  product on the same sparsity pattern, the table's a sort of the samples' top-left rows and one
  ``embedding_bag`` per corner. This is the fast path on CPU (``benchmarks/deformable_detr.py``).
* ``"triton"``: the Triton kernels on any device (CPU tensors under ``TRITON_INTERPRET=1``: tests).
* ``"grid_sample"``: the original's pure-PyTorch design, one ``F.grid_sample`` per level. ONNX
  exports it (GridSample, opset 16+), and the tests use it as a cross-check.

RT-DETRv2's options (Lv et al., 2024), off by default so that the modules built without them compute
exactly what they did: a number of sampling points per level (``n_points=(P_0, ..., P_{L-1})``, with
RT-DETRv2's offset scaling ``offset_scale / P_l`` of the box size) and discrete sampling
(``sampling="discrete"``: one cell per sample, ``index_select`` in the exported graph). Both run on every
core; see :mod:`visiontf.nn.ms_deform_core`.

Samples whose location is outside its map contribute zero, as in ``grid_sample``; a location
that is NaN or infinite makes its query's output NaN in both cores (as ``grid_sample`` does), so a
diverged model shows up in the loss instead of silently reading zeros or out-of-range memory.

This module holds the attention layer; the cores and their tables are beside it:
:mod:`visiontf.nn.ms_deform_core` (:func:`~visiontf.nn.ms_deform_core.ms_deform_attn_core` and the
``grid_sample`` core), :mod:`visiontf.nn.ms_deform_gather` (the gather core),
:mod:`visiontf.nn.ms_deform_tables` (the bordered layout of the level maps) and
:mod:`visiontf.nn.packed_tokens` (the unpadded tokens of the encoder).
"""
from __future__ import annotations

import contextlib
import inspect
import math
from collections.abc import Iterator, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from visiontf.nn.ms_deform_core import METHODS, SAMPLINGS, check_points, fused_kernel_runs, ms_deform_attn_core, pixel_core
from visiontf.nn.ms_deform_gather import gather_core
from visiontf.nn.ms_deform_tables import SpatialShapes, as_shapes, size_table
from visiontf.nn.packed_tokens import PackedTokens
from visiontf.nn.precision import at_least_float32

__all__ = ["MSDeformAttn", "recording_sampling"]


class MSDeformAttn(nn.Module):
    """Multi-scale deformable attention with the original's parameters and initialisation.

    Parameters (the original names, so its checkpoints load unchanged): ``sampling_offsets``
    Linear(d, heads*levels*points*2), ``attention_weights`` Linear(d, heads*levels*points),
    ``value_proj`` and ``output_proj`` Linear(d, d).

    Args:
        d_model: channels of queries and values.
        n_levels: feature levels sampled.
        n_heads: attention heads; ``d_model`` must be divisible by it.
        n_points: sampling points per head and level; or one count per level (RT-DETRv2's
            ``num_points`` list), which switches to its layout and box offsets: ``J = sum(n_points)``
            samples per head ordered (level, point), offsets scaled by ``offset_scale`` times
            ``float32(1 / P_l)`` (its ``num_points_scale``) of the box size.
        method: core used in ``forward``, ``"gather"`` (fast: the Triton kernels on CUDA), ``"triton"``
            or ``"grid_sample"`` (exportable).
        sampling: ``"bilinear"`` or ``"discrete"`` (RT-DETRv2: each sample reads one cell, the
            sampling offsets are not trained, as there).
        offset_scale: box-reference offsets are ``offset / P * box_size * offset_scale`` (0.5 in
            Deformable DETR and RT-DETR; RT-DETRv2's ``offset_scale``).
        projections: the value and output projections (``value_proj``, ``output_proj``); False samples the
            value as given and returns the weighted sum unprojected (D-FINE's decoder, whose attention has neither).
    """

    def __init__(self, d_model: int = 256, n_levels: int = 4, n_heads: int = 8, n_points: int | Sequence[int] = 4, method: str = "gather",
                 sampling: str = "bilinear", offset_scale: float = 0.5, projections: bool = True) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model must be divisible by n_heads, got {d_model} and {n_heads}")
        if method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {method!r}")
        if sampling not in SAMPLINGS:
            raise ValueError(f"sampling must be one of {SAMPLINGS}, got {sampling!r}")
        self.d_model = d_model
        self.n_levels = n_levels
        self.n_heads = n_heads
        #: None: one count for every level (``n_points``); else the count of each level (RT-DETRv2)
        self.points_per_level = None if isinstance(n_points, int) else check_points(n_points, n_levels)
        self.n_points = n_points if self.points_per_level is None else self.points_per_level
        self.method = method
        self.sampling_mode = sampling
        self.offset_scale = float(offset_scale)
        samples = n_levels * n_points if self.points_per_level is None else sum(self.points_per_level)
        self.sampling_offsets = nn.Linear(d_model, n_heads * samples * 2)
        self.attention_weights = nn.Linear(d_model, n_heads * samples)
        self.projections = bool(projections)
        self.value_proj = nn.Linear(d_model, d_model) if projections else nn.Identity()
        self.output_proj = nn.Linear(d_model, d_model) if projections else nn.Identity()
        self.reset_parameters()
        if sampling == "discrete":
            # no gradient reaches the offsets through a cell index: RT-DETRv2 freezes them
            self.sampling_offsets.requires_grad_(False)

    @property
    def samples(self) -> int:
        """Sampling points of one head over all levels."""
        return self.n_levels * self.n_points if self.points_per_level is None else sum(self.points_per_level)

    def _point_scale(self, dtype: torch.dtype, device) -> Tensor:
        """(J,) RT-DETRv2's ``num_points_scale``: float32 ``1 / P_l`` of each sample's level, in ``dtype``."""
        per_sample = [1.0 / p for p in self.points_per_level for _ in range(p)]
        return torch.tensor(per_sample, dtype=torch.float32, device=device).to(dtype)

    def reset_parameters(self) -> None:
        """The original's: offsets start on a per-head direction scaled by the point index, weights at zero."""
        nn.init.zeros_(self.sampling_offsets.weight)
        thetas = torch.arange(self.n_heads, dtype=torch.float32) * (2.0 * math.pi / self.n_heads)
        grid = torch.stack([thetas.cos(), thetas.sin()], -1)
        # the largest of |x|, |y| becomes 1, so head h looks one pixel (times the point index) away
        grid = grid / grid.abs().max(-1, keepdim=True)[0]
        if self.points_per_level is None:
            grid = grid.view(self.n_heads, 1, 1, 2).repeat(1, self.n_levels, self.n_points, 1)
            grid = grid * torch.arange(1, self.n_points + 1, dtype=torch.float32).view(1, 1, -1, 1)
        else:  # the same, each level's points numbered 1..P_l
            index = torch.cat([torch.arange(1, p + 1, dtype=torch.float32) for p in self.points_per_level])
            grid = grid.view(self.n_heads, 1, 2) * index.view(1, -1, 1)
        with torch.no_grad():
            self.sampling_offsets.bias.copy_(grid.view(-1))
        nn.init.zeros_(self.attention_weights.weight)
        nn.init.zeros_(self.attention_weights.bias)
        if self.projections:
            nn.init.xavier_uniform_(self.value_proj.weight)
            nn.init.zeros_(self.value_proj.bias)
            nn.init.xavier_uniform_(self.output_proj.weight)
            nn.init.zeros_(self.output_proj.bias)

    @property
    def takes_packed_tokens(self) -> bool:
        """Whether ``forward`` reads packed tokens as they are (``"grid_sample"`` unpacks them to whole maps)."""
        return self.method != "grid_sample"

    def sampling(self, query: Tensor, reference_points: Tensor, spatial_shapes: SpatialShapes) -> tuple[Tensor, Tensor]:
        """Sampling locations (N, Lq, M, L, P, 2) in float32 (float64 kept) and attention weights (N, Lq, M, L, P);
        with a count per level, (N, Lq, M, J, 2) and (N, Lq, M, J)."""
        if self.points_per_level is not None:
            return self._sampling_per_level(query, reference_points, spatial_shapes)
        N, Lq, _ = query.shape
        M, L, P = self.n_heads, self.n_levels, self.n_points
        offsets = at_least_float32(self.sampling_offsets(query).view(N, Lq, M, L, P, 2))
        weights = at_least_float32(self.attention_weights(query).view(N, Lq, M, L * P)).softmax(-1).view(N, Lq, M, L, P)
        ref = at_least_float32(reference_points)
        if ref.shape[-1] == 2:
            # offsets are in pixels of each level: divide by (W_l, H_l)
            normalizer = size_table(as_shapes(spatial_shapes), offsets.dtype, query.device)
            loc = ref[:, :, None, :, None, :] + offsets / normalizer[None, None, None, :, None, :]
        elif ref.shape[-1] == 4:
            # box references: offsets are fractions of half the box size, spread over the points
            loc = ref[:, :, None, :, None, :2] + offsets / P * ref[:, :, None, :, None, 2:] * self.offset_scale
        else:
            raise ValueError(f"reference_points must end in 2 (points) or 4 (boxes) coordinates, got {tuple(reference_points.shape)}")
        return loc, weights

    def _sampling_per_level(self, query: Tensor, reference_points: Tensor, spatial_shapes: SpatialShapes) -> tuple[Tensor, Tensor]:
        N, Lq, _ = query.shape
        M, J = self.n_heads, self.samples
        levels = torch.repeat_interleave(torch.arange(self.n_levels, device=query.device),
                                         torch.tensor(self.points_per_level, device=query.device))
        offsets = at_least_float32(self.sampling_offsets(query).view(N, Lq, M, J, 2))
        weights = at_least_float32(self.attention_weights(query).view(N, Lq, M, J)).softmax(-1)
        ref = at_least_float32(reference_points)[:, :, levels]  # (N, Lq, J, 2|4): each sample's level
        if ref.shape[-1] == 2:
            normalizer = size_table(as_shapes(spatial_shapes), offsets.dtype, query.device)[levels]
            loc = ref[:, :, None] + offsets / normalizer
        elif ref.shape[-1] == 4:
            scale = self._point_scale(offsets.dtype, query.device)[:, None]
            loc = ref[:, :, None, :, :2] + offsets * scale * ref[:, :, None, :, 2:] * self.offset_scale
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
        shapes = as_shapes(spatial_shapes)
        if len(shapes) != self.n_levels:
            raise ValueError(f"MSDeformAttn has n_levels={self.n_levels}, got spatial_shapes for {len(shapes)} levels")
        if reference_points.shape[:3] != (N, Lq, self.n_levels):
            raise ValueError(
                f"reference_points must be (N, Lq, n_levels, 2|4) = ({N}, {Lq}, {self.n_levels}, ·), got {tuple(reference_points.shape)}"
            )
        if reference_points.shape[-1] not in (2, 4):
            raise ValueError(f"reference_points must end in 2 (points) or 4 (boxes) coordinates, got {tuple(reference_points.shape)}")
        if packed is not None and not self.takes_packed_tokens:
            # the grid_sample core needs whole maps: unpack, attend, pack
            out = self.forward(*(packed.unpack(t[0]) for t in (query, reference_points, value)), shapes, packed.padding_mask)
            return packed.pack(out).unsqueeze(0)
        if self._samples_before_projecting(value, Lq, packed):
            return self._sample_then_project(query, reference_points, value, shapes, value_padding_mask)
        v = self.value_proj(value)
        if value_padding_mask is not None:
            v = v.masked_fill(value_padding_mask[..., None], 0.0)
        v = v.view(N, S, self.n_heads, C // self.n_heads)
        if self.points_per_level is not None or self.sampling_mode != "bilinear":
            points = self.points_per_level or (self.n_points,) * self.n_levels
            if self.method == "grid_sample":
                loc, weights = self.sampling(query, reference_points, shapes)
                if self.points_per_level is None:
                    loc, weights = loc.flatten(3, 4), weights.flatten(3, 4)
                out = ms_deform_attn_core(v, shapes, loc, weights, self.method, points, self.sampling_mode)
            else:
                pix, weights = self._pixel_sampling(query, reference_points, shapes)
                out = pixel_core(v, shapes, pix, weights, packed, self.method, points, self.sampling_mode)
            return self.output_proj(out)
        if self.method == "triton" or (self.method == "gather" and fused_kernel_runs(v)):
            from visiontf.nn.ms_deform_triton import fused_core  # imports Triton: only where it runs

            pix, weights = self._pixel_sampling(query, reference_points, shapes)
            out = fused_core(v, shapes, pix, weights, packed)
        elif self.method == "gather":
            pix, weights = self._pixel_sampling(query, reference_points, shapes)
            out = gather_core(v, shapes, pix, weights, packed)
        else:
            loc, weights = self.sampling(query, reference_points, shapes)
            out = ms_deform_attn_core(v, shapes, loc, weights, self.method)
        return self.output_proj(out)

    def _samples_before_projecting(self, value: Tensor, Lq: int, packed: PackedTokens | None) -> bool:
        """Whether :meth:`forward` samples the unprojected value and projects the samples
        (:meth:`_sample_then_project`): without gradients, on the gather core, where the value's rows far
        outnumber the samples (a decoder's cross-attention: RT-DETR's 300 queries read 8,400 rows at 640 x 640).

        Both orders compute the same sum, since the projection and the weighted bilinear sum are linear: projecting
        every row costs ``S * C * C`` multiply-adds, sampling the unprojected rows ``Lq * M * J * 4 * (C + 1)``
        gathered values (each head reads all ``C`` channels, and a column of ones for the bias) and a per-head
        projection of the sums. On the CPU a gathered value costs a few multiply-adds of a projection, so the rule
        asks the gathers to count under a quarter of the projection's multiply-adds. Training keeps the projection
        first: under autocast its bf16 projections are cheap, and a step gained nothing. (Where the two orders cross,
        and what each gives: docs/record/speed.md, "Real-time DETRs in CPU inference".)
        """
        if torch.is_grad_enabled() or not self.projections or packed is not None or self.method != "gather" or fused_kernel_runs(value):
            return False
        C, S = self.d_model, value.shape[1]
        return 4 * Lq * self.n_heads * self.samples * 4 * (C + 1) < S * C * C

    def _sample_then_project(self, query: Tensor, reference_points: Tensor, value: Tensor, shapes: list[tuple[int, int]],
                             value_padding_mask: Tensor | None) -> Tensor:
        """:meth:`forward` with the value projection after the sampling (see :meth:`_samples_before_projecting`).

        Every head samples one shared table of the unprojected rows with a column of ones appended (its heads become
        queries of a one-head core), so the samples' sums carry each head's weight on valid cells: the bias enters
        times that weight, as it does where padded and outside cells read zeros after the projection."""
        N, Lq, C = query.shape
        S, M = value.shape[1], self.n_heads
        rows = torch.cat([value, value.new_ones(N, S, 1)], -1)
        if value_padding_mask is not None:
            rows = rows.masked_fill(value_padding_mask[..., None], 0.0)
        pix, weights = self._pixel_sampling(query, reference_points, shapes)
        J = pix.shape[-1]
        pix = pix.transpose(2, 3).reshape(N, Lq * M, 2, 1, J)
        weights = weights.reshape(N, Lq * M, 1, J)
        if self.points_per_level is not None or self.sampling_mode != "bilinear":
            points = self.points_per_level or (self.n_points,) * self.n_levels
            sums = pixel_core(rows.unsqueeze(2), shapes, pix, weights, None, "gather", points, self.sampling_mode)
        else:
            sums = gather_core(rows.unsqueeze(2), shapes, pix, weights)
        sums = sums.view(N, Lq, M, C + 1)
        weight = self.value_proj.weight.view(M, C // M, C)
        out = torch.einsum("nqmc,mdc->nqmd", sums[..., :C], weight) + sums[..., C:] * self.value_proj.bias.view(M, C // M)
        return self.output_proj(out.reshape(N, Lq, C))

    def _pixel_sampling(self, query: Tensor, reference_points: Tensor, shapes: list[tuple[int, int]]) -> tuple[Tensor, Tensor]:
        """The gather core's inputs: pixel coordinates (N, Lq, 2, M, L*P) and weights (N, Lq, M, L*P).

        The same locations as :meth:`sampling`, laid out for vectorised elementwise work: one GEMM
        (offsets and attention logits together, the offset rows reordered) gives contiguous x and y
        planes (instead of (x, y) pairs),
        and the per-level terms are folded into (L*P,)-long rows: for points, pixel =
        ``offset + ref * size - 0.5``; for boxes, ``offset * ref_wh * size / (2P) + ref_xy * size - 0.5``.
        """
        N, Lq, C = query.shape
        if self.points_per_level is not None:
            return self._pixel_sampling_per_level(query, reference_points, shapes)
        M, L, P = self.n_heads, self.n_levels, self.n_points
        K = M * L * P
        # one GEMM for offsets (rows reordered x-plane, y-plane) and attention logits
        w = torch.cat([self.sampling_offsets.weight.view(K, 2, C).transpose(0, 1).reshape(2 * K, C), self.attention_weights.weight])
        b = torch.cat([self.sampling_offsets.bias.view(K, 2).t().reshape(-1), self.attention_weights.bias])
        offsets, logits = F.linear(query, w, b).split([2 * K, K], dim=-1)
        offsets = at_least_float32(offsets).reshape(N, Lq, 2, M, L * P)
        weights = at_least_float32(logits).reshape(N, Lq, M, L * P).softmax(-1)
        # in the offsets' precision: float32 reference points (the encoder's) would round ref * size
        # to float32 before the float64 offsets are added, where the original's loc = ref + offset / size does not
        ref = reference_points.to(offsets.dtype)
        size = torch.tensor([(w_, h_) for h_, w_ in shapes], dtype=ref.dtype, device=ref.device)  # (L, 2)
        # (N, Lq, L, 2) -> (N, Lq, 2, 1, L*P): one value per (image, query, axis, level), repeated per point
        per_point = lambda t: t.transpose(2, 3).repeat_interleave(P, dim=-1).unsqueeze(3)  # noqa: E731
        base = per_point(ref[..., :2] * size - 0.5)
        if ref.shape[-1] == 2:
            pix = offsets + base
        else:
            pix = offsets * per_point(ref[..., 2:] * size * (self.offset_scale / P)) + base
        return pix, weights

    def _pixel_sampling_per_level(self, query: Tensor, reference_points: Tensor, shapes: list[tuple[int, int]]) -> tuple[Tensor, Tensor]:
        """:meth:`_pixel_sampling` with a count of points per level: (N, Lq, 2, M, J) and (N, Lq, M, J)."""
        N, Lq, C = query.shape
        M, J = self.n_heads, self.samples
        K = M * J
        w = torch.cat([self.sampling_offsets.weight.view(K, 2, C).transpose(0, 1).reshape(2 * K, C), self.attention_weights.weight])
        b = torch.cat([self.sampling_offsets.bias.view(K, 2).t().reshape(-1), self.attention_weights.bias])
        offsets, logits = F.linear(query, w, b).split([2 * K, K], dim=-1)
        offsets = at_least_float32(offsets).reshape(N, Lq, 2, M, J)
        weights = at_least_float32(logits).reshape(N, Lq, M, J).softmax(-1)
        ref = reference_points.to(offsets.dtype)
        levels = torch.repeat_interleave(torch.arange(self.n_levels, device=query.device),
                                         torch.tensor(self.points_per_level, device=query.device))
        size = size_table(shapes, ref.dtype, ref.device)  # (L, 2)
        # (N, Lq, L, 2) -> (N, Lq, 2, 1, J): one value per (image, query, axis, sample's level)
        per_sample = lambda t: t.transpose(2, 3)[..., levels].unsqueeze(3)  # noqa: E731
        base = per_sample(ref[..., :2] * size - 0.5)
        if ref.shape[-1] == 2:
            return offsets + base, weights
        scale = self._point_scale(offsets.dtype, query.device) * self.offset_scale
        return offsets * (per_sample(ref[..., 2:] * size) * scale) + base, weights

    def extra_repr(self) -> str:
        extra = "" if self.sampling_mode == "bilinear" else f", sampling={self.sampling_mode!r}"
        extra += "" if self.offset_scale == 0.5 else f", offset_scale={self.offset_scale}"
        extra += "" if self.projections else ", projections=False"
        return (f"d_model={self.d_model}, n_levels={self.n_levels}, n_heads={self.n_heads}, n_points={self.n_points}, "
                f"method={self.method!r}{extra}")


@contextlib.contextmanager
def recording_sampling(attn: MSDeformAttn, sampled: list[tuple[Tensor, Tensor]]) -> Iterator[None]:
    """Within it, each call of ``attn`` appends its sampling (locations, weights) to ``sampled``: its
    inputs, re-read by :meth:`MSDeformAttn.sampling`, which both attention cores compute from."""
    signature = inspect.signature(attn.forward)

    def record(module: nn.Module, args: tuple, kwargs: dict) -> None:
        call = signature.bind(*args, **kwargs).arguments
        sampled.append(module.sampling(call["query"], call["reference_points"], call["spatial_shapes"]))

    handle = attn.register_forward_pre_hook(record, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()
