"""Deformable DETR's encoder and decoder (Zhu et al., 2021), batch-first, on visiontf's shared blocks.

The encoder's self-attention and the decoder's cross-attention are :class:`~visiontf.nn.MSDeformAttn`;
the decoder's self-attention is the shared SDPA :class:`~visiontf.nn.MultiheadAttention` and the
FFNs are timm's ``Mlp``, as in DETR. Layers are post-norm, as the original.

Everything that depends only on the level shapes (which level a flattened position belongs to,
its pixel coordinates, the first row and column used for the valid ratios) is computed once per
set of shapes by :func:`level_layout`, so reference points, valid ratios and two-stage proposals
are single vectorised expressions rather than the original's per-level loops.

The decoder is written for the DINO-style options built on it later: it takes any
target queries, 2-d reference points or 4-d reference boxes and a self-attention mask, folds query
groups into the batch for self-attention (``num_groups``), and returns every layer's input
references (detached between layers, as the original) and, when refining, the undetached new ones
(the predicted boxes; "look forward twice" uses them).
"""
from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from timm.layers import Mlp
from torch import Tensor, nn

from visiontf.nn import MSDeformAttn, MultiheadAttention
from visiontf.nn.attention import restrict_attn_mask
from visiontf.nn.packed_tokens import PackedTokens
from visiontf.nn.pos_embed import sine_embedding
from visiontf.nn.precision import at_least_float32
from visiontf.nn.tensor_cache import tensor_cache


def inverse_sigmoid(x: Tensor, eps: float = 1e-5) -> Tensor:
    """log(x / (1 - x)) with x clamped to [eps, 1 - eps] (the original's ``util.misc.inverse_sigmoid``)."""
    x = x.clamp(min=0, max=1)
    return torch.log(x.clamp(min=eps) / (1 - x).clamp(min=eps))


@dataclass(frozen=True)
class LevelLayout:
    """Per-position facts of a flattened multi-level sequence, computed once per set of shapes.

    Attributes:
        shapes: (H_l, W_l) of each level.
        level: (S,) level of each flattened position.
        xy: (S, 2) float pixel coordinates (x, y) of each position in its level.
        size: (L, 2) float (W_l, H_l).
        first_col: (sum H_l,) positions in the first column of their level (x == 0).
        first_row: (sum W_l,) positions in the first row of their level (y == 0).
    """

    shapes: tuple[tuple[int, int], ...]
    level: Tensor
    xy: Tensor
    size: Tensor
    first_col: Tensor
    first_row: Tensor


@tensor_cache(maxsize=64)
def level_layout(shapes: tuple[tuple[int, int], ...], device: torch.device) -> LevelLayout:
    hw = torch.tensor(shapes, dtype=torch.int64)
    counts = hw[:, 0] * hw[:, 1]
    level = torch.repeat_interleave(torch.arange(len(shapes)), counts)
    local = torch.arange(int(counts.sum())) - (counts.cumsum(0) - counts)[level]
    w = hw[level, 1]
    x, y = local % w, torch.div(local, w, rounding_mode="floor")
    positions = torch.arange(len(level))
    return LevelLayout(
        shapes=shapes,
        level=level.to(device),
        xy=torch.stack((x, y), -1).float().to(device),
        size=hw.flip(-1).float().to(device),
        first_col=positions[x == 0].to(device),
        first_row=positions[y == 0].to(device),
    )


def valid_counts(padding_mask: Tensor | None, layout: LevelLayout, batch: int) -> Tensor:
    """(B, L, 2): valid (unpadded) columns and rows of each level, counted on its first row and column."""
    L = len(layout.shapes)
    if padding_mask is None:
        return layout.size.unsqueeze(0).expand(batch, L, 2)
    valid = (~padding_mask).float()

    def per_level(positions: Tensor) -> Tensor:
        # a sum against the positions' one-hot levels, not index_add_: the ONNX exporter writes
        # index_add_ as a scatter that drops repeated indices (every count would be 0 or 1);
        # elementwise, so it stays float32 and exact under autocast
        return (valid[:, positions, None] * F.one_hot(layout.level[positions], L).to(valid.dtype)).sum(1)

    return torch.stack((per_level(layout.first_row), per_level(layout.first_col)), -1)


def encoder_reference_points(layout: LevelLayout, valid_ratios: Tensor) -> Tensor:
    """(B, S, L, 2): each position's pixel centre in its level's valid area, scaled into every level.

    The original's ``get_reference_points``: ``(i + 0.5) / (valid_ratio_l * H_l)``, then times the
    valid ratios of all levels, in the same float operations.
    """
    denom = valid_ratios[:, layout.level] * layout.size[layout.level]  # (B, S, 2)
    ref = (layout.xy + 0.5) / denom
    return ref[:, :, None] * valid_ratios[:, None]


@dataclass
class MultiScaleMemory:
    """The encoder's output and what the decoder needs to attend to it.

    Attributes:
        memory: (B, S, C), all levels flattened and concatenated, finest first.
        padding_mask: (B, S) True on padding, or None when no image is padded.
        spatial_shapes: (H_l, W_l) of each level.
        valid_ratios: (B, L, 2) unpadded fraction (w, h) of each level.
        valid_counts: (B, L, 2) unpadded columns and rows of each level.
        layout: per-position tables of these shapes (:class:`LevelLayout`).
    """

    memory: Tensor
    padding_mask: Tensor | None
    spatial_shapes: list[tuple[int, int]]
    valid_ratios: Tensor
    valid_counts: Tensor
    layout: LevelLayout


class DeformableEncoderLayer(nn.Module):
    """Post-norm: deformable self-attention over all levels, then the FFN."""

    def __init__(self, d_model: int, n_heads: int, n_levels: int, n_points: int, dim_feedforward: int, dropout: float, attn_method: str) -> None:
        super().__init__()
        self.self_attn = MSDeformAttn(d_model, n_levels, n_heads, n_points, method=attn_method)
        self.drop1 = nn.Dropout(dropout)
        self.norm1 = nn.LayerNorm(d_model)
        self.mlp = Mlp(d_model, dim_feedforward, act_layer=nn.ReLU, drop=dropout)
        self.norm2 = nn.LayerNorm(d_model)

    def forward(
        self, src: Tensor, pos: Tensor, reference_points: Tensor, spatial_shapes, padding_mask: Tensor | None, packed: PackedTokens | None = None
    ) -> Tensor:
        attn = self.self_attn(src + pos, reference_points, src, spatial_shapes, padding_mask, packed)
        src = self.norm1(src + self.drop1(attn))
        return self.norm2(src + self.mlp(src))


class DeformableTransformerEncoder(nn.Module):
    """Deformable encoder stack.

    With padding it runs on the unpadded tokens only (:class:`~visiontf.nn.packed_tokens.PackedTokens`):
    the original's output at padded positions is never read (every reader zeroes it), so its
    projections, FFN and attention queries there are wasted work, a quarter or more of it in
    batches of mixed aspect ratios. The returned memory is zero at padded positions.
    """

    def __init__(self, layer: DeformableEncoderLayer, num_layers: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(copy.deepcopy(layer) for _ in range(num_layers))

    def forward(self, src: Tensor, pos: Tensor, reference_points: Tensor, spatial_shapes, padding_mask: Tensor | None) -> Tensor:
        """src/pos (B, S, C), reference_points (B, S, L, 2), padding_mask (B, S) or None -> (B, S, C)."""
        packed = None
        if padding_mask is not None and all(layer.self_attn.takes_packed_tokens for layer in self.layers):
            packed = PackedTokens.from_mask(padding_mask)
            src, pos, reference_points = (packed.pack(t).unsqueeze(0) for t in (src, pos, reference_points))
            padding_mask = None
        for layer in self.layers:
            src = layer(src, pos, reference_points, spatial_shapes, padding_mask, packed)
        return src if packed is None else packed.unpack(src[0])


class DeformableDecoderLayer(nn.Module):
    """Post-norm: query self-attention, deformable cross-attention to the memory, FFN."""

    def __init__(self, d_model: int, n_heads: int, n_levels: int, n_points: int, dim_feedforward: int, dropout: float, attn_method: str) -> None:
        super().__init__()
        self.self_attn = MultiheadAttention(d_model, n_heads, attn_drop=dropout)
        self.drop1 = nn.Dropout(dropout)
        self.norm1 = nn.LayerNorm(d_model)
        self.cross_attn = MSDeformAttn(d_model, n_levels, n_heads, n_points, method=attn_method)
        self.drop2 = nn.Dropout(dropout)
        self.norm2 = nn.LayerNorm(d_model)
        self.mlp = Mlp(d_model, dim_feedforward, act_layer=nn.ReLU, drop=dropout)
        self.norm3 = nn.LayerNorm(d_model)

    def forward(
        self,
        tgt: Tensor,
        query_pos: Tensor,
        reference_points: Tensor,
        memory: Tensor,
        spatial_shapes,
        memory_padding_mask: Tensor | None,
        self_attn_mask: Tensor | None = None,
        num_groups: int = 1,
    ) -> Tensor:
        B, Q, C = tgt.shape
        qk = tgt + query_pos
        v = tgt
        if num_groups > 1:
            # Group DETR: each group of Q / G queries attends only to itself, as a batch of B * G
            qk, v = qk.reshape(B * num_groups, Q // num_groups, C), v.reshape(B * num_groups, Q // num_groups, C)
        attn = self.self_attn(qk, qk, v, attn_mask=self_attn_mask)[0].reshape(B, Q, C)
        tgt = self.norm1(tgt + self.drop1(attn))
        attn = self.cross_attn(tgt + query_pos, reference_points, memory, spatial_shapes, memory_padding_mask)
        tgt = self.norm2(tgt + self.drop2(attn))
        return self.norm3(tgt + self.mlp(tgt))


class DeformableTransformerDecoder(nn.Module):
    """Decoder stack with optional iterative box refinement (heads passed in, owned by the model)."""

    def __init__(self, layer: DeformableDecoderLayer, num_layers: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(copy.deepcopy(layer) for _ in range(num_layers))
        self.num_layers = num_layers
        #: the clamp of the refinement's inverse sigmoid (see :func:`refine_boxes`); the model sets it
        self.inverse_sigmoid_eps = 1e-5
        #: Relation-DETR's position relation (:class:`~visiontf.nn.position_relation.PositionRelationEmbedding`),
        #: set by the model: every layer after the first adds it to its self-attention logits
        self.position_relation: nn.Module | None = None

    def forward(
        self,
        tgt: Tensor,
        reference_points: Tensor,
        memory: Tensor,
        spatial_shapes,
        valid_ratios: Tensor,
        query_pos: Tensor,
        memory_padding_mask: Tensor | None = None,
        self_attn_mask: Tensor | None = None,
        box_heads: Sequence[nn.Module] | None = None,
        num_groups: int = 1,
        query_pos_head: nn.Module | None = None,
        after_layer: Callable[[int, Tensor, Tensor, Tensor | None], Tensor | None] | None = None,
    ) -> dict:
        """Decode ``tgt`` against ``memory``.

        Args:
            tgt, query_pos: (B, Q, C) content queries and their position embeddings; ``query_pos``
                may be None when ``query_pos_head`` is given.
            reference_points: (B, Q, 2) normalised points or (B, Q, 4) cxcywh boxes, relative to
                the unpadded image; scaled by ``valid_ratios`` (B, L, 2) for the attention.
            memory: (B, S, C) encoder output; ``memory_padding_mask`` (B, S) True on padding.
            self_attn_mask: for the query self-attention, bool True = may attend or additive
                float; (Q, Q), or per group (Q / G, Q / G), or (B * G, heads, ., .). With
                ``position_relation`` set, layers after the first add its bias inside this mask.
            box_heads: one head per layer for iterative refinement: layer i's reference becomes
                ``sigmoid(head_i(out_i) + inverse_sigmoid(reference_i))``, detached for layer i + 1.
            num_groups: query groups G (Group DETR) folded into the batch for self-attention;
                Q must be a multiple of G.
            query_pos_head: DINO's (DAB-DETR's) dynamic positional queries: before every layer,
                ``query_pos = query_pos_head(sine_embedding(reference))`` of that layer's (detached)
                4-d reference box, scaled to the first level's valid area (``ref_point_head`` in
                DINO's ``deformable_transformer.py``), (B, Q, 2C) -> (B, Q, C).
            after_layer: called after every layer but the last, with box refinement, as
                ``after_layer(i, out_i, boxes_i, mask)`` (boxes detached); it returns the
                self-attention mask of the next layer (DDQ DETR's distinct queries:
                :class:`~visiontf.models.deformable_detr.distinct_queries.DistinctQueriesBetweenLayers`).

        Returns:
            ``hidden`` (num_layers, B, Q, C); ``references``: the reference each layer used
            (list, detached between layers); with ``box_heads``, ``new_references``: each layer's
            refined boxes (B, Q, 4) float32 (float64 kept), not detached (= its predicted boxes), and ``deltas``:
            each head's raw output (B, Q, 4) float32, so that "look forward twice" can predict
            layer i's boxes as ``refine_boxes(new_references[i - 1], deltas[i])``; else None.
        """
        if num_groups < 1 or tgt.shape[1] % num_groups:
            raise ValueError(f"num_groups={num_groups} must divide the number of queries {tgt.shape[1]}")
        if box_heads is not None and len(box_heads) < self.num_layers:
            raise ValueError(f"box refinement needs {self.num_layers} box heads, got {len(box_heads)}")
        if self.position_relation is not None and (box_heads is None or reference_points.shape[-1] != 4):
            raise ValueError("the position relation needs 4-d reference boxes refined by box_heads (two_stage=True)")
        hidden, references, new_references, deltas = [], [], [], []
        ref = reference_points
        attn_mask = self_attn_mask
        for i, layer in enumerate(self.layers):
            scale = valid_ratios if ref.shape[-1] == 2 else torch.cat([valid_ratios, valid_ratios], -1)
            ref_input = ref[:, :, None] * scale[:, None]
            if query_pos_head is not None:
                query_pos = query_pos_head(sine_embedding(ref_input[:, :, 0], tgt.shape[-1] // 2).to(tgt.dtype))
            tgt = layer(tgt, query_pos, ref_input, memory, spatial_shapes, memory_padding_mask, attn_mask, num_groups)
            hidden.append(tgt)
            references.append(ref)
            if box_heads is not None:
                deltas.append(at_least_float32(box_heads[i](tgt)))
                new_references.append(refine_boxes(ref, deltas[-1], self.inverse_sigmoid_eps))
                if self.position_relation is not None and i + 1 < self.num_layers:
                    # Relation-DETR: the relation of this layer's input boxes to its output boxes
                    attn_mask = self._relation_mask(ref, new_references[-1].detach(), self_attn_mask, num_groups)
                ref = new_references[-1].detach()
                if after_layer is not None and i + 1 < self.num_layers:
                    attn_mask = after_layer(i, tgt, ref, attn_mask)
        refined = box_heads is not None
        return {
            "hidden": torch.stack(hidden),
            "references": references,
            "new_references": new_references if refined else None,
            "deltas": deltas if refined else None,
        }

    def _relation_mask(self, src: Tensor, tgt: Tensor, self_attn_mask: Tensor | None, num_groups: int) -> Tensor:
        """The position relation of (B, Q, 4) boxes, per group, as an additive mask that keeps ``self_attn_mask``'s blocks."""
        B, Q, _ = src.shape
        bias = self.position_relation(src.reshape(B * num_groups, Q // num_groups, 4), tgt.reshape(B * num_groups, Q // num_groups, 4))
        if self_attn_mask is None:
            return bias
        if self_attn_mask.dtype == torch.bool:
            return restrict_attn_mask(bias, self_attn_mask)
        return bias + self_attn_mask


def refine_boxes(reference: Tensor, delta: Tensor, eps: float = 1e-5) -> Tensor:
    """``sigmoid(delta + inverse_sigmoid(reference, eps))`` in float32 (float64 kept); a 2-d reference offsets (cx, cy) only.

    ``eps``: Deformable DETR clamps at 1e-5, DINO's code at 1e-3 (which matters for saturated
    references, such as the (1, 1, 1, 1) boxes of padded proposals).
    """
    delta, reference = at_least_float32(delta), at_least_float32(reference)
    if reference.shape[-1] == 4:
        return (delta + inverse_sigmoid(reference, eps)).sigmoid()
    return torch.cat([delta[..., :2] + inverse_sigmoid(reference, eps), delta[..., 2:]], -1).sigmoid()


class DeformableTransformer(nn.Module):
    """Encoder, decoder, level embeddings and the query-side projections of Deformable DETR.

    The original's parameter names: ``level_embed`` (L, d), ``reference_points`` Linear(d, 2)
    (single-stage), or ``enc_output``, ``enc_output_norm``, ``pos_trans``, ``pos_trans_norm``
    (two-stage). Initialisation as the original: xavier on every matrix, then each attention's own
    reset, ``reference_points`` xavier with zero bias, ``level_embed`` standard normal.
    ``proposal_queries=False`` (two-stage with DINO's mixed query selection) leaves out ``pos_trans``:
    the queries' content is learned and their positions come from the anchor boxes.
    """

    def __init__(
        self,
        d_model: int = 256,
        nhead: int = 8,
        num_encoder_layers: int = 6,
        num_decoder_layers: int = 6,
        dim_feedforward: int = 1024,
        dropout: float = 0.1,
        num_feature_levels: int = 4,
        enc_n_points: int = 4,
        dec_n_points: int = 4,
        two_stage: bool = False,
        attn_method: str = "gather",
        proposal_queries: bool = True,
    ) -> None:
        super().__init__()
        self.d_model = d_model
        self.two_stage = two_stage
        self.encoder = DeformableTransformerEncoder(
            DeformableEncoderLayer(d_model, nhead, num_feature_levels, enc_n_points, dim_feedforward, dropout, attn_method), num_encoder_layers
        )
        self.decoder = DeformableTransformerDecoder(
            DeformableDecoderLayer(d_model, nhead, num_feature_levels, dec_n_points, dim_feedforward, dropout, attn_method), num_decoder_layers
        )
        self.level_embed = nn.Parameter(torch.empty(num_feature_levels, d_model))
        if two_stage:
            self.enc_output = nn.Linear(d_model, d_model)
            self.enc_output_norm = nn.LayerNorm(d_model)
            if proposal_queries:  # the original's pure query selection; DINO's mixed selection has none
                self.pos_trans = nn.Linear(2 * d_model, 2 * d_model)
                self.pos_trans_norm = nn.LayerNorm(2 * d_model)
        else:
            self.reference_points = nn.Linear(d_model, 2)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # every matrix xavier-uniform first, in parameter order (the random draws a seed gives the original),
        # then each deformable attention its own scheme and each self-attention nn.MultiheadAttention's zero biases
        matrices = [p for p in self.parameters() if p.dim() > 1]
        for weight in matrices:
            nn.init.xavier_uniform_(weight)
        for module in self.modules():
            if isinstance(module, MSDeformAttn):
                module.reset_parameters()
            elif isinstance(module, MultiheadAttention):
                nn.init.zeros_(module.qkv.bias)
                nn.init.zeros_(module.proj.bias)
        if not self.two_stage:
            nn.init.xavier_uniform_(self.reference_points.weight, gain=1.0)
            nn.init.zeros_(self.reference_points.bias)
        nn.init.normal_(self.level_embed)

    def proposals(self, memory: Tensor, padding_mask: Tensor | None, layout: LevelLayout, counts: Tensor) -> tuple[Tensor, Tensor]:
        """Two-stage: one proposal per position (its pixel centre, size 0.05 * 2^level) and its features.

        Returns ``(features, proposals)``: features (B, S, C) = ``enc_output_norm(enc_output(memory))``
        with padded and out-of-range positions zeroed; proposals (B, S, 4) in inverse-sigmoid space,
        ``inf`` where padded or too close to the border (cx, cy, w or h outside (0.01, 0.99)).
        """
        B = memory.shape[0]
        centre = (layout.xy + 0.5) / counts[:, layout.level]  # (B, S, 2)
        wh = (0.05 * 2.0 ** layout.level.to(torch.float64)).float()  # = float32(0.05) * 2^l, exactly
        boxes = torch.cat([centre, wh[None, :, None].expand(B, -1, 2)], -1)
        valid = ((boxes > 0.01) & (boxes < 0.99)).all(-1, keepdim=True)
        boxes = torch.log(boxes / (1 - boxes))
        invalid = ~valid if padding_mask is None else (~valid | padding_mask.unsqueeze(-1))
        boxes = boxes.masked_fill(invalid, float("inf"))
        features = self.enc_output_norm(self.enc_output(memory.masked_fill(invalid, 0.0)))
        return features, boxes

    def proposal_queries(self, boxes: Tensor) -> tuple[Tensor, Tensor]:
        """Two-stage: (B, Q, 4) reference boxes in [0, 1] -> ``(query_pos, tgt)``, each (B, Q, C)."""
        embedding = sine_embedding(boxes, self.d_model // 2).to(self.pos_trans.weight.dtype)
        return self.pos_trans_norm(self.pos_trans(embedding)).split(self.d_model, dim=-1)
