"""RT-DETR's query selection and decoder (Zhao et al., CVPR 2024, sec. 4.3; RT-DETRv2, Lv et al., 2024).

* The encoder's maps are projected again (1x1 convolution, BatchNorm; extra levels by 3x3 stride-2
  convolutions of the last map) and flattened into the memory.
* IoU-aware query selection: every position gets an anchor box (its cell centre, side ``0.05 * 2^level``);
  positions whose anchor touches the border band (``anchor_eps``) are masked out. A linear + LayerNorm
  encoder head scores each position (class logits) and refines its anchor (a 3-layer MLP on the logit
  scale); the ``num_queries`` positions with the highest best-class score become the queries: their
  features (detached) the content, their boxes (detached) the first references. Trained with the
  varifocal loss, the score is pulled towards the IoU of the box, so selection prefers well-placed boxes.
* The decoder: post-norm layers of self-attention, multi-scale deformable cross-attention around each
  query's box and an FFN (the Deformable DETR layer of :mod:`visiontf.models.deformable_detr.deformable_transformer`,
  with RT-DETRv2's attention options); each layer's query position is an MLP of its current box, and
  each layer refines the box with its own head (``sigmoid(delta + inverse_sigmoid(box))``), detached
  before the next layer. In training, layer i's box is computed from layer i - 1's box before it was
  detached (DINO's "look forward twice"); in evaluation the decoder stops at ``eval_idx``.
* In training, denoising queries (noised copies of the ground truth, :mod:`visiontf.models.deformable_detr.denoising`
  with RT-DETR's constants) go before the matching queries, which cannot see them.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from visiontf.core.errors import UserError
from visiontf.models.deformable_detr.deformable_transformer import DeformableDecoderLayer, inverse_sigmoid
from visiontf.models.deformable_detr.denoising import DenoisingQueries
from visiontf.models.deformable_detr.distinct_queries import DistinctQueriesBetweenLayers
from visiontf.models.deformable_detr.queries import distinct_first
from visiontf.models.detr.detr import MLP
from visiontf.models.rtdetr.hybrid_encoder import ConvNormAct, activation, original_table_dtype
from visiontf.models.rtdetr.rtdetr_options import DecoderOptions
from visiontf.nn import MSDeformAttn
from visiontf.nn.indexing import gather_rows
from visiontf.nn.ms_deform_tables import tracing_shapes

__all__ = ["ActMLP", "DecoderOutput", "ImageTooSmallError", "RTDetrDecoder", "anchor_boxes"]

#: RT-DETR's inverse sigmoid clamp (``src/zoo/rtdetr/utils.py``)
INVERSE_SIGMOID_EPS = 1e-5


def _anchor_values(shapes, eps: float, dtype: torch.dtype, device: torch.device | None = None) -> tuple[Tensor, Tensor]:
    """The tables of :func:`anchor_boxes` from sizes that are ints, or traced 0-dim tensors while a graph is exported
    (row-major positions by broadcasting, so the graph follows the input's size)."""
    boxes = []
    for level, (h, w) in enumerate(shapes):
        ys, xs = torch.arange(h, dtype=dtype, device=device), torch.arange(w, dtype=dtype, device=device)
        y = (ys[:, None] + 0 * xs[None, :]).reshape(-1)
        x = (xs[None, :] + 0 * ys[:, None]).reshape(-1)
        centre = torch.stack([(x + 0.5) / w, (y + 0.5) / h], -1)
        boxes.append(torch.cat([centre, torch.full_like(centre, 0.05 * 2.0 ** level)], -1))
    anchors = torch.cat(boxes)[None]
    valid = ((anchors > eps) & (anchors < 1 - eps)).all(-1, keepdim=True)
    unact = torch.log(anchors / (1 - anchors))
    return torch.where(valid, unact, torch.inf), valid


@functools.lru_cache(maxsize=32)
def _anchors(shapes: tuple[tuple[int, int], ...], eps: float, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    return _anchor_values(shapes, eps, dtype)


def anchor_boxes(shapes: list[tuple[int, int]], eps: float = 1e-2, dtype: torch.dtype = torch.float32,
                 device: torch.device | None = None) -> tuple[Tensor, Tensor]:
    """(1, S, 4) anchor boxes of every position in inverse-sigmoid space (inf where masked) and (1, S, 1) their
    validity: centre ``((x + 0.5) / W, (y + 0.5) / H)``, side ``0.05 * 2^level``, valid when all four coordinates
    are inside ``(eps, 1 - eps)``."""
    if tracing_shapes():  # ONNX export: computed in the graph from the traced level sizes
        return _anchor_values(shapes, float(eps), dtype, device)
    unact, valid = _anchors(tuple((int(h), int(w)) for h, w in shapes), float(eps), dtype)
    return unact.to(device), valid.to(device)


class ActMLP(MLP):
    """DETR's MLP (``layers.{i}``) with another activation between the layers (``"relu"``, ``"silu"``, ...)."""

    def __init__(self, input_dim: int, hidden_dim: int, output_dim: int, num_layers: int, act: str = "relu") -> None:
        super().__init__(input_dim, hidden_dim, output_dim, num_layers)
        self.act = activation(act)

    def forward(self, x: Tensor) -> Tensor:
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            x = layer(x) if i == last else self.act(layer(x))
        return x


class ImageTooSmallError(UserError, ValueError):
    """The images give the encoder fewer positions than the decoder selects queries from; the message says how many."""


@dataclass
class DecoderOutput:
    """What the decoder computed: per returned layer, logits (layers, B, N, K) and boxes (layers, B, N, 4); the
    selected proposals' logits (B, Q, K) and boxes (B, Q, 4); in evaluation only the ``eval_idx`` layer.
    ``references``: the last returned layer's input reference boxes (B, N, 4). ``one_to_many``: in training with
    ``num_one_to_many_queries`` T, every layer's logits (layers, B, T, K) and boxes (layers, B, T, 4) of the one-to-many
    queries; else None."""

    logits: Tensor
    boxes: Tensor
    proposal_logits: Tensor
    proposal_boxes: Tensor
    references: Tensor
    spatial_shapes: list[tuple[int, int]]
    one_to_many: tuple[Tensor, Tensor] | None = None


class RTDetrDecoder(nn.Module):
    """Input projections, IoU-aware query selection, the deformable decoder and its heads.

    Args:
        in_channels: channels of the encoder's maps (``hidden_dim`` each), finest first.
        num_classes: K sigmoid classes.
        options: :class:`~visiontf.models.rtdetr.rtdetr_options.DecoderOptions`.
        num_denoising: > 0 builds the denoising label embedding (``num_classes + 1`` rows, the last the zero padding).
        tables: ``"original"`` (anchors computed in float32 whatever the model's dtype) or ``"transformers"`` (in it).
    """

    #: how messages name the model
    family = "RT-DETR"

    def __init__(self, in_channels: list[int], num_classes: int, options: DecoderOptions, num_denoising: int = 0,
                 tables: str = "original") -> None:
        super().__init__()
        d, levels = options.hidden_dim, options.num_levels
        if len(in_channels) > levels:
            raise ValueError(f"the decoder attends to num_levels={levels} levels, fewer than the encoder's {len(in_channels)} maps; "
                             f"set decoder.num_levels: {len(in_channels)} (and its num_points, one per level), or read fewer "
                             "backbone features (backbone.stages)")
        self.options, self.num_classes, self.tables = options, num_classes, tables
        self.input_proj = nn.ModuleList(self._input_projections(in_channels))
        self.enc_output = nn.Sequential()
        self.enc_output.proj = nn.Linear(d, d)
        self.enc_output.norm = nn.LayerNorm(d)
        self.enc_score_head = nn.Linear(d, num_classes)
        self.enc_bbox_head = self._mlp(d, d, 4, 3)
        self.query_pos_head = self._query_pos_head()
        self.layers = nn.ModuleList(self._layer() for _ in range(options.num_layers))
        self.score_heads = nn.ModuleList(nn.Linear(d, num_classes) for _ in range(options.num_layers))
        self.bbox_heads = nn.ModuleList(self._box_head() for _ in range(options.num_layers))
        self.denoising_class_embed = nn.Embedding(num_classes + 1, d, padding_idx=num_classes) if num_denoising > 0 else None
        self.tgt_embed = nn.Embedding(options.num_queries, d) if options.learn_query_content else None
        self._add_parts()
        self.reset_parameters()

    # ------------------------------------------------------------------------------------ parts (a subclass's own)
    def _input_projections(self, in_channels: list[int]) -> list[nn.Module]:
        """One 1x1 convolution and BatchNorm per encoder map; extra levels are 3x3 stride-2 convolutions of the last."""
        d = self.options.hidden_dim
        projections: list[nn.Module] = [ConvNormAct(c, d, 1) for c in in_channels]
        channels = in_channels[-1]
        for _ in range(self.options.num_levels - len(in_channels)):
            projections.append(ConvNormAct(channels, d, 3, 2))
            channels = d
        return projections

    def _mlp(self, input_dim: int, hidden_dim: int, output_dim: int, num_layers: int) -> nn.Module:
        """The heads' MLPs (``mlp_act`` between the layers: ReLU for RT-DETR, SiLU for DEIM's)."""
        if self.options.mlp_act == "relu":
            return MLP(input_dim, hidden_dim, output_dim, num_layers)
        return ActMLP(input_dim, hidden_dim, output_dim, num_layers, self.options.mlp_act)

    def _query_pos_head(self) -> nn.Module:
        """The MLP from a query's box to its position embedding: 4 -> 2d -> d (RT-DETR's), or 4 -> d -> d -> d
        (``query_pos_method="as_reg"``, DEIM's RT-DETRv2)."""
        d = self.options.hidden_dim
        return self._mlp(4, d, d, 3) if self.options.query_pos_method == "as_reg" else self._mlp(4, 2 * d, d, 2)

    def _layer(self) -> nn.Module:
        """One decoder layer: the Deformable DETR layer with RT-DETRv2's attention options on the shared core."""
        options, d, levels = self.options, self.options.hidden_dim, self.options.num_levels
        points = options.num_points
        layer = DeformableDecoderLayer(d, options.nhead, levels, points if isinstance(points, int) else points[0],
                                       options.dim_feedforward, options.dropout, options.attn_method)
        layer.cross_attn = MSDeformAttn(d, levels, options.nhead, points, method=options.attn_method, sampling=options.sampling,
                                        offset_scale=options.offset_scale)
        layer.mlp.act = activation(options.activation)
        return layer

    def _box_head(self) -> nn.Module:
        """A layer's box head: a 3-layer MLP to the 4 box deltas."""
        d = self.options.hidden_dim
        return self._mlp(d, d, 4, 3)

    def _add_parts(self) -> None:
        """Modules a subclass adds to these (built before :meth:`reset_parameters`); RT-DETR has none."""

    def reset_parameters(self) -> None:
        """The original's: class biases at prior 0.01, box heads' last layers zero, xavier projections."""
        prior = -math.log((1 - 0.01) / 0.01)
        for score, box in [(self.enc_score_head, self.enc_bbox_head), *zip(self.score_heads, self.bbox_heads)]:
            nn.init.constant_(score.bias, prior)
            nn.init.zeros_(box.layers[-1].weight)
            nn.init.zeros_(box.layers[-1].bias)
        nn.init.xavier_uniform_(self.enc_output.proj.weight)
        for layer in self.query_pos_head.layers[:2]:  # the originals': the first two (DEIM's third keeps PyTorch's init)
            nn.init.xavier_uniform_(layer.weight)
        for proj in self.input_proj:
            if isinstance(proj, ConvNormAct):
                nn.init.xavier_uniform_(proj.conv.weight)
        for layer in self.layers:
            nn.init.xavier_uniform_(layer.mlp.fc1.weight)
            nn.init.xavier_uniform_(layer.mlp.fc2.weight)
        if self.tgt_embed is not None:
            nn.init.xavier_uniform_(self.tgt_embed.weight)
        if self.denoising_class_embed is not None:
            nn.init.normal_(self.denoising_class_embed.weight[:-1])

    # ------------------------------------------------------------------------------------ steps
    def memory(self, feats: list[Tensor]) -> tuple[Tensor, list[tuple[int, int]]]:
        """(B, S, d) flattened projected levels and their (H_l, W_l)."""
        maps = [proj(x) for proj, x in zip(self.input_proj, feats)]
        for level in range(len(maps), self.options.num_levels):
            maps.append(self.input_proj[level](feats[-1] if level == len(feats) else maps[-1]))
        # traced sizes while a graph is exported (the graph then follows the input's size), Python ints otherwise
        shapes = [(m.shape[-2], m.shape[-1]) if tracing_shapes() else (int(m.shape[-2]), int(m.shape[-1])) for m in maps]
        return torch.cat([m.flatten(2).transpose(1, 2) for m in maps], 1), shapes

    def check_positions(self, shapes: Sequence[tuple[int, int]], positions: int | None = None) -> None:
        """Refuse feature maps of ``shapes`` (``positions`` in all: their pixels unless given) with fewer positions than
        the queries selected from them."""
        positions = sum(h * w for h, w in shapes) if positions is None else positions
        if self.options.num_queries > positions:
            raise ImageTooSmallError(
                f"{self.family} selects num_queries={self.options.num_queries} of the encoder's {positions} positions (the "
                f"pixels of its feature maps, {' + '.join(f'{h} x {w}' for h, w in shapes)} for these images); give larger "
                "images (training: data.init_args.scales, val_size; tools/export.py: --image_size; a Predictor: its "
                "min_size) or build with fewer queries (model_kwargs.decoder.num_queries)")

    def select(self, memory: Tensor, shapes: list[tuple[int, int]]) -> dict[str, Tensor]:
        """IoU-aware query selection: the top ``num_queries`` positions by best class score."""
        dtype = original_table_dtype(memory.dtype, memory.device) if self.tables == "original" else memory.dtype
        anchors, valid = anchor_boxes(shapes, self.options.anchor_eps, dtype, memory.device)
        output = self.enc_output(valid.to(memory.dtype) * memory)
        logits = self.enc_score_head(output)
        queries = self.options.num_queries
        self.check_positions(shapes, logits.shape[1])
        scores = logits.max(-1).values
        many = self._one_to_many_queries(output, anchors, scores)
        if self.options.distinct_query_iou is not None:
            with torch.no_grad():  # the ranking alone; the picked rows' boxes are computed again below, with gradients
                boxes = self.enc_bbox_head(output) + anchors
                scores = distinct_first(scores, boxes, self.options.distinct_query_iou, queries)
        index = torch.topk(scores, queries, dim=1).indices
        pick = functools.partial(gather_rows, index=index)
        picked = pick(output)
        # the box head is row-wise: run at the selected positions only, it gives what the originals pick from its run at
        # every position (8,400 at 640 x 640; the values, and the gradients, of the rows that are kept)
        boxes_unact = self.enc_bbox_head(picked) + pick(anchors.expand(memory.shape[0], -1, -1))
        content = self.tgt_embed.weight[None].expand(memory.shape[0], -1, -1) if self.tgt_embed is not None else picked.detach()
        return {"content": content, "boxes_unact": boxes_unact.detach(), "logits": pick(logits), "boxes": boxes_unact.sigmoid(),
                **many}

    def _one_to_many_queries(self, output: Tensor, anchors: Tensor, scores: Tensor) -> dict[str, Tensor]:
        """In training with ``num_one_to_many_queries`` T > 0: the content (B, T, d) and reference boxes (B, T, 4,
        inverse-sigmoid space) of the T top positions by score alone, both detached as the one-to-one queries';
        else nothing."""
        T = self.options.num_one_to_many_queries
        if not self.training or T == 0:
            return {}
        if T > scores.shape[1]:
            raise ImageTooSmallError(f"decoder.num_one_to_many_queries={T} is more than the encoder's {scores.shape[1]} "
                                     "positions; give larger images or fewer one-to-many queries")
        with torch.no_grad():
            index = torch.topk(scores, T, dim=1).indices
            picked = gather_rows(output, index)
            boxes = self.enc_bbox_head(picked) + gather_rows(anchors.expand(output.shape[0], -1, -1), index)
        return {"many_content": picked, "many_boxes_unact": boxes}

    def queries(self, feats: list[Tensor], denoising: DenoisingQueries | None = None) -> dict:
        """The decoder's inputs: ``memory`` and its ``shapes``, the ``selected`` proposals, the queries' ``content`` and
        reference boxes ``ref_unact`` (inverse-sigmoid space; ``denoising``'s queries first) and the self-attention
        ``mask`` (True = may attend; None without denoising queries)."""
        memory, shapes = self.memory(feats)
        selected = self.select(memory, shapes)
        content, ref_unact = selected["content"], selected["boxes_unact"]
        mask = None
        if denoising is not None and denoising.meta.pad_size:
            content = torch.cat([self.denoising_class_embed(denoising.labels).to(content.dtype), content], 1)
            ref_unact = torch.cat([denoising.boxes_unact.to(ref_unact.dtype), ref_unact], 1)
            mask = ~denoising.attn_mask  # the layers' attention takes True = may attend
        return {"memory": memory, "shapes": shapes, "selected": selected, "content": content, "ref_unact": ref_unact, "mask": mask}

    def distinct_between_layers(self, denoising: DenoisingQueries | None) -> DistinctQueriesBetweenLayers | None:
        """DDQ DETR's selection after each layer for one forward pass (``distinct_between_layers``), else None."""
        if not self.options.distinct_between_layers:
            return None
        P = denoising.meta.pad_size if denoising is not None else 0
        return DistinctQueriesBetweenLayers(lambda i, logits: logits.sigmoid().max(-1).values, self.options.distinct_query_iou, P)

    @staticmethod
    def suppress(distinct: DistinctQueriesBetweenLayers | None, logits: list[Tensor], last: int) -> Tensor:
        """(layers, B, N, K) the returned layers' logits, the suppressed queries' at
        :data:`~visiontf.models.deformable_detr.distinct_queries.SUPPRESSED_LOGIT` when
        ``distinct`` selected: every layer's in training, layer ``last``'s alone in evaluation."""
        stacked = torch.stack(logits)
        if distinct is None or last == 0:
            return stacked
        if len(logits) == last + 1:
            return distinct.mask_logits(stacked)
        return distinct.mask_layer(stacked[0], last)[None]

    def forward(self, feats: list[Tensor], denoising: DenoisingQueries | None = None, need_weights: bool = False) -> DecoderOutput:
        """Decode; ``denoising`` (training) puts its queries before the matching ones."""
        q = self.queries(feats, denoising)
        memory, shapes, selected, content, ref_unact, mask = (q[k] for k in ("memory", "shapes", "selected", "content", "ref_unact", "mask"))
        last = self.options.num_layers - 1 if self.training else self.options.eval_idx % self.options.num_layers
        distinct = self.distinct_between_layers(denoising)
        logits, boxes, reference = self._layers(content, ref_unact.sigmoid(), memory, shapes, mask, last, distinct)
        many = None
        if "many_content" in selected:  # hybrid matching's one-to-many queries: their own pass, so no attention across
            many_logits, many_boxes, _ = self._layers(selected["many_content"], selected["many_boxes_unact"].sigmoid(), memory,
                                                   shapes, None, last, None)
            many = (torch.stack(many_logits), torch.stack(many_boxes))
        return DecoderOutput(self.suppress(distinct, logits, last), torch.stack(boxes), selected["logits"], selected["boxes"],
                             reference, shapes, many)

    def _layers(self, content: Tensor, ref: Tensor, memory: Tensor, shapes: list[tuple[int, int]], mask: Tensor | None,
                last: int, distinct: DistinctQueriesBetweenLayers | None) -> tuple[list[Tensor], list[Tensor], Tensor]:
        """Layers 0 to ``last`` on the queries ``content`` with reference boxes ``ref`` (detached): each returned layer's
        logits and boxes (every layer's in training, layer ``last``'s in evaluation) and the last one's input
        reference boxes."""
        levels = self.options.num_levels
        undetached = ref  # the previous layer's box before detaching (training's look forward twice)
        out = content
        logits, boxes = [], []
        for i, layer in enumerate(self.layers[: last + 1]):
            query_pos = self.query_pos_head(ref)
            out = layer(out, query_pos, ref[:, :, None].expand(-1, -1, levels, -1), memory, shapes, None, mask)
            delta = self.bbox_heads[i](out)
            new = (delta + inverse_sigmoid(ref, INVERSE_SIGMOID_EPS)).sigmoid()
            layer_logits = self.score_heads[i](out) if self.training or i == last or distinct is not None else None
            if self.training or i == last:
                logits.append(layer_logits)
                boxes.append(new if i == 0 or not self.training else (delta + inverse_sigmoid(undetached, INVERSE_SIGMOID_EPS)).sigmoid())
            if i < last:
                if distinct is not None:
                    mask = distinct(i, layer_logits, new.detach(), mask)
                undetached, ref = new, new.detach()
        return logits, boxes, ref
