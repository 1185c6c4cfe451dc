"""D-FINE's decoder (Peng et al., ICLR 2025): RT-DETR's query selection, gated layers and distribution box heads.

What it shares with RT-DETR (:class:`~visiontf.models.rtdetr.rtdetr_decoder.RTDetrDecoder`, whose parts it overrides): the
input projections (here skipped where the encoder's width is already the decoder's), IoU-aware query selection of
the top encoder positions, denoising queries, the query-position MLP of each layer's current box and a layer stack
with self-attention and multi-scale deformable cross-attention. What is its own:

* The layer (:class:`GatedDecoderLayer`): the deformable attention samples the memory as it is (no value or output
  projection, :class:`~visiontf.nn.MSDeformAttn` ``projections=False``), and its result is merged with the query by
  a gate (:class:`Gate`: two sigmoid gates from both, a weighted sum, LayerNorm) instead of a residual and a norm;
  the FFN's output is clamped to float16's range before the last norm. The query position is clamped to [-10, 10].
* Boxes (:mod:`~visiontf.models.dfine.fdr`): the first layer also predicts a box the RT-DETR way (``pre_bbox_head``,
  a refinement of the selected proposal); it is the reference of every layer's box. Each layer's box head gives
  ``4 * (reg_max + 1)`` edge logits from its output plus the previous layer's output (detached), added to the
  previous layer's logits (not detached); the box is the reference moved by the distributions' expectations.
  Each layer's next attention reference is its box, detached.
* Scores: each layer's class logits plus a location-quality estimate (:class:`QualityEstimator`, its "LQE": an MLP
  of the edge distributions' top probabilities: a sharp distribution is a confident box).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from timm.layers import Mlp
from torch import Tensor, nn

from visiontf.models.deformable_detr.deformable_transformer import inverse_sigmoid
from visiontf.models.deformable_detr.denoising import DenoisingQueries
from visiontf.models.dfine.dfine_options import FDRDecoderOptions
from visiontf.models.dfine.fdr import distance_to_box, integral, weighting_function
from visiontf.models.rtdetr.hybrid_encoder import ConvNormAct, activation
from visiontf.models.rtdetr.rtdetr_decoder import INVERSE_SIGMOID_EPS, ActMLP, DecoderOutput, RTDetrDecoder
from visiontf.nn import MSDeformAttn, MultiheadAttention

__all__ = ["ActMLP", "DFineDecoder", "FineDecoderOutput", "Gate", "GatedDecoderLayer", "QualityEstimator"]

#: the layer output's clamp before its last norm (float16's largest finite value)
HALF_MAX = 65504.0
#: the clamp of the query position embedding
QUERY_POS_CLAMP = 10.0


class Gate(nn.Module):
    """``norm(g1 * x + g2 * y)`` with ``(g1, g2) = sigmoid(gate([x, y]))``, two gates per channel. Starts even (zero
    weights and biases: both gates 0.5)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.gate = nn.Linear(2 * dim, 2 * dim)
        self.norm = nn.LayerNorm(dim)
        nn.init.zeros_(self.gate.weight)
        nn.init.zeros_(self.gate.bias)

    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        first, second = torch.sigmoid(self.gate(torch.cat([x, y], -1))).chunk(2, -1)
        return self.norm(first * x + second * y)


class GatedDecoderLayer(nn.Module):
    """D-FINE's decoder layer (see the module docstring); post-norm, the same arguments as
    :class:`~visiontf.models.deformable_detr.deformable_transformer.DeformableDecoderLayer`'s forward."""

    def __init__(self, d_model: int, n_heads: int, n_levels: int, n_points: int | tuple[int, ...], dim_feedforward: int,
                 dropout: float = 0.0, act: str = "relu", attn_method: str = "gather", sampling: str = "bilinear",
                 offset_scale: float = 0.5) -> None:
        super().__init__()
        self.self_attn = MultiheadAttention(d_model, n_heads, attn_drop=dropout)
        self.drop1 = nn.Dropout(dropout)
        self.norm1 = nn.LayerNorm(d_model)
        self.cross_attn = MSDeformAttn(d_model, n_levels, n_heads, n_points, method=attn_method, sampling=sampling,
                                       offset_scale=offset_scale, projections=False)
        self.drop2 = nn.Dropout(dropout)
        self.gateway = Gate(d_model)
        self.mlp = Mlp(d_model, dim_feedforward, act_layer=type(activation(act)), drop=dropout)
        self.norm3 = nn.LayerNorm(d_model)

    def forward(self, tgt: Tensor, query_pos: Tensor, reference_points: Tensor, memory: Tensor, spatial_shapes,
                memory_padding_mask: Tensor | None = None, self_attn_mask: Tensor | None = None) -> Tensor:
        qk = tgt + query_pos
        attn = self.self_attn(qk, qk, tgt, attn_mask=self_attn_mask)[0]
        tgt = self.norm1(tgt + self.drop1(attn))
        sampled = self.cross_attn(tgt + query_pos, reference_points, memory, spatial_shapes, memory_padding_mask)
        tgt = self.gateway(tgt, self.drop2(sampled))
        return self.norm3((tgt + self.mlp(tgt)).clamp(-HALF_MAX, HALF_MAX))


class QualityEstimator(nn.Module):
    """D-FINE's location-quality estimator (LQE): class logits plus an MLP of each edge's ``topk`` largest bin
    probabilities and their mean, ``(B, N, K) + reg_conf((B, N, 4 * (topk + 1)))``."""

    def __init__(self, topk: int, hidden: int, num_layers: int, reg_max: int, act: str = "relu") -> None:
        super().__init__()
        self.topk, self.bins = topk, reg_max + 1
        self.reg_conf = ActMLP(4 * (topk + 1), hidden, 1, num_layers, act)
        nn.init.zeros_(self.reg_conf.layers[-1].weight)
        nn.init.zeros_(self.reg_conf.layers[-1].bias)

    def forward(self, logits: Tensor, corners: Tensor) -> Tensor:
        B, N, _ = corners.shape
        prob = F.softmax(corners.reshape(B, N, 4, self.bins), dim=-1)
        top = prob.topk(self.topk, dim=-1).values
        stats = torch.cat([top, top.mean(-1, keepdim=True)], -1).reshape(B, N, -1)
        return logits + self.reg_conf(stats)


@dataclass
class FineDecoderOutput(DecoderOutput):
    """:class:`~visiontf.models.rtdetr.rtdetr_decoder.DecoderOutput` with the distribution head's outputs: each returned
    layer's edge logits ``corners`` (layers, B, N, 4 (reg_max + 1)); the reference of every layer's box,
    ``initial`` (B, N, 4), the first layer's RT-DETR-style box (detached); that box and its logits
    (``pre_boxes``, ``pre_logits``: before the quality estimate)."""

    corners: Tensor | None = None
    initial: Tensor | None = None
    pre_logits: Tensor | None = None
    pre_boxes: Tensor | None = None


class DFineDecoder(RTDetrDecoder):
    """Input projections, IoU-aware query selection and D-FINE's decoder with distribution box heads.

    Args:
        in_channels: channels of the encoder's maps, finest first (a map already ``hidden_dim`` wide is not projected).
        num_classes: K sigmoid classes.
        options: :class:`~visiontf.models.dfine.dfine_options.FDRDecoderOptions`.
        num_denoising: > 0 builds the denoising label embedding.
        tables: ``"original"`` or ``"transformers"`` (the anchors' precision, as RT-DETR's).
    """

    options: FDRDecoderOptions

    family = "D-FINE"

    def __init__(self, in_channels: list[int], num_classes: int, options: FDRDecoderOptions, num_denoising: int = 0,
                 tables: str = "original") -> None:
        if not isinstance(options, FDRDecoderOptions):
            raise TypeError(f"DFineDecoder takes FDRDecoderOptions, got {type(options).__name__}")
        if options.num_one_to_many_queries:
            raise ValueError("decoder.num_one_to_many_queries (hybrid matching) is RT-DETR's decoder's option; D-FINE's "
                             "decoder has no one-to-many branch: leave it 0")
        super().__init__(in_channels, num_classes, options, num_denoising, tables)

    # ------------------------------------------------------------------------------------ parts
    def _input_projections(self, in_channels: list[int]) -> list[nn.Module]:
        d = self.options.hidden_dim
        projections: list[nn.Module] = [nn.Identity() if c == d else ConvNormAct(c, d, 1) for c in in_channels]
        channels = in_channels[-1]
        for _ in range(self.options.num_levels - len(in_channels)):
            projections.append(nn.Identity() if channels == d else ConvNormAct(channels, d, 3, 2))
            channels = d
        return projections

    def _mlp(self, input_dim: int, hidden_dim: int, output_dim: int, num_layers: int) -> nn.Module:
        return ActMLP(input_dim, hidden_dim, output_dim, num_layers, self.options.mlp_act)

    def _layer(self) -> nn.Module:
        o = self.options
        return GatedDecoderLayer(o.hidden_dim, o.nhead, o.num_levels, o.num_points, o.dim_feedforward, o.dropout, o.activation,
                                 o.attn_method, o.sampling, o.offset_scale)

    def _box_head(self) -> nn.Module:
        d = self.options.hidden_dim
        return self._mlp(d, d, 4 * (self.options.reg_max + 1), 3)

    def _add_parts(self) -> None:
        o, d = self.options, self.options.hidden_dim
        self.pre_bbox_head = self._mlp(d, d, 4, 3)
        self.lqe_layers = nn.ModuleList(QualityEstimator(o.lqe_topk, o.lqe_hidden, o.lqe_layers, o.reg_max, o.lqe_act or o.activation)
                                        for _ in range(o.num_layers))
        # fixed numbers kept as (frozen) parameters, as the originals' checkpoints hold them
        self.up = nn.Parameter(torch.tensor([float(o.up)]), requires_grad=False)
        self.reg_scale = nn.Parameter(torch.tensor([float(o.reg_scale)]), requires_grad=False)

    def reset_parameters(self) -> None:
        super().reset_parameters()
        nn.init.zeros_(self.pre_bbox_head.layers[-1].weight)
        nn.init.zeros_(self.pre_bbox_head.layers[-1].bias)
        for lqe in self.lqe_layers:
            nn.init.zeros_(lqe.reg_conf.layers[-1].weight)
            nn.init.zeros_(lqe.reg_conf.layers[-1].bias)

    # ------------------------------------------------------------------------------------ forward
    def forward(self, feats: list[Tensor], denoising: DenoisingQueries | None = None, need_weights: bool = False) -> FineDecoderOutput:
        """Decode; ``denoising`` (training) puts its queries before the matching ones."""
        q = self.queries(feats, denoising)
        memory, shapes, selected, mask = q["memory"], q["shapes"], q["selected"], q["mask"]
        levels = self.options.num_levels
        last = self.options.num_layers - 1 if self.training else self.options.eval_idx % self.options.num_layers
        distinct = self.distinct_between_layers(denoising)
        bins = weighting_function(self.options.reg_max, self.up, self.reg_scale)
        ref = q["ref_unact"].sigmoid()  # the current attention reference, detached
        out = q["content"]
        previous_out: Tensor | float = 0.0  # the previous layer's output, detached: its box head's second input
        previous_corners: Tensor | float = 0.0  # the previous layer's edge logits (with their gradient)
        logits, boxes, corners = [], [], []
        for i, layer in enumerate(self.layers[: last + 1]):
            query_pos = self.query_pos_head(ref).clamp(-QUERY_POS_CLAMP, QUERY_POS_CLAMP)
            layer_ref = ref
            out = layer(out, query_pos, ref[:, :, None].expand(-1, -1, levels, -1), memory, shapes, None, mask)
            if i == 0:
                pre_boxes = (self.pre_bbox_head(out) + inverse_sigmoid(ref, INVERSE_SIGMOID_EPS)).sigmoid()
                pre_logits = self.score_heads[0](out)
                initial = pre_boxes.detach()
            edge_logits = self.bbox_heads[i](out + previous_out) + previous_corners
            box = distance_to_box(initial, integral(edge_logits, bins), self.reg_scale)
            layer_logits = None
            if self.training or i == last or distinct is not None:
                layer_logits = self.lqe_layers[i](self.score_heads[i](out), edge_logits)
            if self.training or i == last:
                logits.append(layer_logits)
                boxes.append(box)
                corners.append(edge_logits)
            if distinct is not None and i < last:
                mask = distinct(i, layer_logits, box.detach(), mask)
            previous_corners, previous_out, ref = edge_logits, out.detach(), box.detach()
        return FineDecoderOutput(self.suppress(distinct, logits, last), torch.stack(boxes), selected["logits"], selected["boxes"], layer_ref, shapes,
                                 corners=torch.stack(corners), initial=initial, pre_logits=pre_logits, pre_boxes=pre_boxes)
