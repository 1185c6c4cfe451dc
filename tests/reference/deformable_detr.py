"""The ORIGINAL Deformable DETR design (fundamentalvision/Deformable-DETR), written again as a baseline.

What the original itself computes is recorded in ``tests/fixtures/deformable_detr/`` by
``scripts/fixtures/make_deformable_detr.py``, which runs the real repository; visiontf's parity tests
read those fixtures. This module is the original's *design*, in this project's own code, for what a
fixture cannot hold: speed and memory baselines (``benchmarks/deformable_detr.py``, ``gpu_*.py``),
models of any size in the original's key layout (``tests/models/deformable_detr/test_dino_checkpoints.py``,
``tests/models/test_finetune.py``) and a second model to train beside visiontf's. It keeps:

* :func:`original_core`: the original's pure-PyTorch attention core, one ``F.grid_sample`` per
  level, the samples of every level and point stacked, weighted and summed (a module-level name:
  ``benchmarks.reference_cuda_op.routed_to`` swaps the CUDA op in);
* :class:`MSDeformAttn`: the attention module's parameters, initial values and sampling locations;
* :class:`OriginalDeformableDETR`: the module tree and therefore the checkpoints' keys, the plain
  model's one head listed once per decoder layer, the refinement and two-stage heads registered a
  second time inside the decoder; per-level loops over the levels as the original runs them;
* :func:`original_focal_cost`, :func:`original_match`: the matcher's batch-wide focal cost matrix.

Two deliberate deviations, both neutral at the published size: the backbone's channel counts are
read from the ResNet instead of fixed at ResNet-50's (so ResNet-18 test models build), and the
two-stage proposal embedding has ``d_model // 2`` sine features per coordinate where the original
fixes 128 (equal at d 256, as HF does; the original's two-stage only builds at d 256). Dropout stays
a module (benchmarks switch it off with ``dropout=0``).
"""
from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
import torchvision
from scipy.optimize import linear_sum_assignment
from torch import Tensor, nn
from torchvision.models._utils import IntermediateLayerGetter
from torchvision.ops import box_convert, generalized_box_iou

from reference.detr import FrozenBatchNorm2d


# --------------------------------------------------------------------------- attention
def original_core(value: Tensor, spatial_shapes, sampling_locations: Tensor, attention_weights: Tensor) -> Tensor:
    """The grid_sample design: value (N, S, M, D), locations (N, Q, M, L, P, 2) in [0, 1], weights (N, Q, M, L, P) -> (N, Q, M*D).

    Every head is a batch entry of its own: each level's map (N*M, D, h, w) is sampled at that level's
    points (zeros outside the map, align_corners=False), then all levels' samples are stacked and the
    weighted sum over levels and points taken at once.
    """
    batch, _, heads, channels = value.shape
    queries, levels, points = sampling_locations.shape[1], sampling_locations.shape[3], sampling_locations.shape[4]
    sizes = [(int(h), int(w)) for h, w in spatial_shapes]
    maps = value.permute(0, 2, 3, 1).reshape(batch * heads, channels, -1)
    grids = sampling_locations.mul(2).sub(1).permute(0, 2, 1, 3, 4, 5).reshape(batch * heads, queries, levels, points, 2)
    samples, first = [], 0
    for level, (h, w) in enumerate(sizes):
        level_map = maps[:, :, first:first + h * w].reshape(batch * heads, channels, h, w)
        samples.append(F.grid_sample(level_map, grids[:, :, level], mode="bilinear", padding_mode="zeros", align_corners=False))
        first += h * w
    weights = attention_weights.permute(0, 2, 1, 3, 4).reshape(batch * heads, 1, queries, levels * points)
    summed = (torch.stack(samples, dim=-2).flatten(-2) * weights).sum(-1)  # (N*M, D, Q)
    return summed.view(batch, heads * channels, queries).transpose(1, 2).contiguous()


class MSDeformAttn(nn.Module):
    """The original's multi-scale deformable attention module (parameter names, initial values, locations).

    ``forward(query, reference_points, input_flatten, input_spatial_shapes, input_level_start_index,
    input_padding_mask=None)``; references are points (..., L, 2) or boxes (..., L, 4) in [0, 1].
    """

    def __init__(self, d_model: int = 256, n_levels: int = 4, n_heads: int = 8, n_points: int = 4) -> None:
        super().__init__()
        self.d_model, self.n_levels, self.n_heads, self.n_points = d_model, n_levels, n_heads, n_points
        samples = n_heads * n_levels * n_points
        self.sampling_offsets = nn.Linear(d_model, 2 * samples)
        self.attention_weights = nn.Linear(d_model, samples)
        self.value_proj, self.output_proj = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)
        self._reset_parameters()

    def _reset_parameters(self) -> None:
        # the offsets start as a fixed star: head h looks along the angle 2*pi*h/heads (its larger coordinate
        # scaled to 1), point p of it p+1 steps out, on every level; the layers predicting offsets and weights
        # start at zero, so every query first sees that star with uniform weights
        angle = torch.arange(self.n_heads, dtype=torch.float32) * (2.0 * math.pi / self.n_heads)
        direction = torch.stack([angle.cos(), angle.sin()], -1)
        direction = direction / direction.abs().max(-1, keepdim=True).values
        steps = torch.arange(1, self.n_points + 1, dtype=torch.float32)
        star = (direction[:, None, None, :] * steps[None, None, :, None]).expand(self.n_heads, self.n_levels, self.n_points, 2)
        with torch.no_grad():
            self.sampling_offsets.weight.zero_()
            self.sampling_offsets.bias.copy_(star.reshape(-1))
            self.attention_weights.weight.zero_()
            self.attention_weights.bias.zero_()
        for projection in (self.value_proj, self.output_proj):
            nn.init.xavier_uniform_(projection.weight)
            nn.init.zeros_(projection.bias)

    def forward(self, query, reference_points, input_flatten, input_spatial_shapes, input_level_start_index, input_padding_mask=None):
        batch, queries, _ = query.shape
        value = self.value_proj(input_flatten)
        if input_padding_mask is not None:
            value = value.masked_fill(input_padding_mask.unsqueeze(-1), 0.0)
        value = value.unflatten(-1, (self.n_heads, self.d_model // self.n_heads))
        grid = (batch, queries, self.n_heads, self.n_levels, self.n_points)
        offsets = self.sampling_offsets(query).view(*grid, 2)
        weights = self.attention_weights(query).view(*grid[:3], -1).softmax(-1).view(grid)
        ref = reference_points[:, :, None, :, None]  # broadcast over heads and points
        if ref.shape[-1] == 2:  # a point: offsets are pixels of each level, divided by its (width, height)
            locations = ref + offsets / input_spatial_shapes.flip(-1)[None, None, None, :, None]
        else:  # a box: offsets are fractions of its half size, shared out over the points
            locations = ref[..., :2] + offsets / self.n_points * ref[..., 2:] * 0.5
        return self.output_proj(original_core(value, input_spatial_shapes, locations, weights))


# --------------------------------------------------------------------------- backbone, position embedding
def _mask_at(mask: Tensor, size) -> Tensor:
    """The image padding mask (B, H, W) at a feature map's size: nearest-neighbour, as the original resizes it."""
    return F.interpolate(mask[None].float(), size=size).to(torch.bool)[0]


def _sin_cos(angles: Tensor) -> Tensor:
    """Even features the sine of their angle, odd ones the cosine (the interleaved layout of the original)."""
    out = torch.empty_like(angles)
    out[..., 0::2] = angles[..., 0::2].sin()
    out[..., 1::2] = angles[..., 1::2].cos()
    return out


def _frequencies(n: int, device) -> Tensor:
    """10000^(2*floor(i/2)/n) for i < n: one frequency per sine/cosine pair."""
    return 10000 ** (torch.arange(n, dtype=torch.float32, device=device) // 2 * 2 / n)


class _Backbone(nn.Module):
    """A frozen-BN torchvision ResNet under ``body``: layer2/3/4 (strides 8/16/32) for several levels, else layer4."""

    def __init__(self, name: str, num_levels: int) -> None:
        super().__init__()
        net = getattr(torchvision.models, name)(weights=None, norm_layer=FrozenBatchNorm2d)
        stages = ["layer2", "layer3", "layer4"] if num_levels > 1 else ["layer4"]
        for pname, p in net.named_parameters():  # the stem and layer1 are never trained
            p.requires_grad_(pname.split(".")[0] in ("layer2", "layer3", "layer4"))
        self.body = IntermediateLayerGetter(net, {stage: str(i) for i, stage in enumerate(stages)})
        self.strides = [2 ** int(stage[-1]) * 2 for stage in stages]
        self.num_channels = [_out_channels(getattr(net, stage)) for stage in stages]


def _out_channels(layer: nn.Sequential) -> int:
    block = layer[-1]
    return (block.bn3 if hasattr(block, "bn3") else block.bn2).weight.numel()


class _SinePE(nn.Module):
    """Deformable DETR's sine embedding of a padding mask: positions counted from 1 along each axis of the
    unpadded area, shifted by -0.5 and scaled to (0, 2*pi] by the last count; y features first, then x."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n

    def forward(self, mask: Tensor) -> Tensor:
        inside = (~mask).to(torch.float32)
        rows, cols = inside.cumsum(1), inside.cumsum(2)
        rows = (rows - 0.5) / (rows[:, -1:, :] + 1e-6) * (2 * math.pi)
        cols = (cols - 0.5) / (cols[:, :, -1:] + 1e-6) * (2 * math.pi)
        freq = _frequencies(self.n, mask.device)
        embedding = torch.cat([_sin_cos(rows[..., None] / freq), _sin_cos(cols[..., None] / freq)], dim=-1)
        return embedding.permute(0, 3, 1, 2)


class _Joiner(nn.Sequential):
    """``backbone.0`` (the ResNet) and ``backbone.1`` (the position embedding), the original's key prefixes."""

    def __init__(self, backbone: _Backbone, pe: _SinePE) -> None:
        super().__init__(backbone, pe)
        self.strides, self.num_channels = backbone.strides, backbone.num_channels

    def forward(self, images: Tensor, mask: Tensor):
        maps = self[0].body(images)
        features = [(maps[key], _mask_at(mask, maps[key].shape[-2:])) for key in sorted(maps)]
        return features, [self[1](m).to(x.dtype) for x, m in features]


# --------------------------------------------------------------------------- transformer
def inverse_sigmoid(x: Tensor, eps: float = 1e-5) -> Tensor:
    """log(x / (1 - x)) with x clamped to [0, 1] and both terms to at least ``eps``."""
    x = x.clamp(0, 1)
    return (x.clamp(min=eps) / (1 - x).clamp(min=eps)).log()


def _refine(reference: Tensor, delta: Tensor) -> Tensor:
    """A head's delta added to a reference in logit space: a box moves; a point moves and gains the delta's size."""
    if reference.shape[-1] == 4:
        return (delta + inverse_sigmoid(reference)).sigmoid()
    return torch.cat([delta[..., :2] + inverse_sigmoid(reference), delta[..., 2:]], -1).sigmoid()


def _valid_ratios(masks: list[Tensor]) -> Tensor:
    """(B, L, 2): the unpadded fraction (width, height) of each level, counted along its first row and column."""
    ratios = []
    for m in masks:
        height, width = m.shape[1:]
        rows, cols = (~m[:, :, 0]).sum(1), (~m[:, 0, :]).sum(1)
        ratios.append(torch.stack([cols.float() / width, rows.float() / height], -1))
    return torch.stack(ratios, 1)


def _encoder_points(shapes: list[tuple[int, int]], ratios: Tensor) -> Tensor:
    """(B, S, L, 2): each position's pixel centre over its level's unpadded size, seen from every level."""
    centres = []
    for level, (h, w) in enumerate(shapes):
        ys = (torch.arange(h, dtype=torch.float32, device=ratios.device) + 0.5)[:, None].expand(h, w).reshape(1, -1)
        xs = (torch.arange(w, dtype=torch.float32, device=ratios.device) + 0.5)[None, :].expand(h, w).reshape(1, -1)
        centres.append(torch.stack([xs / (ratios[:, level, 0:1] * w), ys / (ratios[:, level, 1:2] * h)], -1))
    return torch.cat(centres, 1)[:, :, None] * ratios[:, None]


def _feed_forward(layer: nn.Module, x: Tensor, norm: nn.LayerNorm) -> Tensor:
    """The ReLU feed-forward block of a layer with ``linear1``, ``linear2`` and ``drop``, residual, then ``norm``."""
    return norm(x + layer.drop(layer.linear2(layer.drop(F.relu(layer.linear1(x))))))


class _EncoderLayer(nn.Module):
    """Deformable self-attention over all levels, then the feed-forward block; post-norm."""

    def __init__(self, d, ffn, dropout, n_levels, n_heads, n_points):
        super().__init__()
        self.self_attn = MSDeformAttn(d, n_levels, n_heads, n_points)
        self.norm1 = nn.LayerNorm(d)
        self.linear1, self.linear2 = nn.Linear(d, ffn), nn.Linear(ffn, d)
        self.norm2 = nn.LayerNorm(d)
        self.drop = nn.Dropout(dropout)

    def forward(self, src, pos, reference_points, spatial_shapes, level_start_index, padding_mask):
        attended = self.self_attn(src + pos, reference_points, src, spatial_shapes, level_start_index, padding_mask)
        return _feed_forward(self, self.norm1(src + self.drop(attended)), self.norm2)


class _DecoderLayer(nn.Module):
    """Self-attention among the queries (``norm2``), deformable cross-attention to the memory (``norm1``), feed-forward (``norm3``)."""

    def __init__(self, d, ffn, dropout, n_levels, n_heads, n_points):
        super().__init__()
        self.cross_attn = MSDeformAttn(d, n_levels, n_heads, n_points)
        self.norm1 = nn.LayerNorm(d)
        self.self_attn = nn.MultiheadAttention(d, n_heads, dropout=dropout)
        self.norm2 = nn.LayerNorm(d)
        self.linear1, self.linear2 = nn.Linear(d, ffn), nn.Linear(ffn, d)
        self.norm3 = nn.LayerNorm(d)
        self.drop = nn.Dropout(dropout)

    def forward(self, tgt, query_pos, reference_points, src, spatial_shapes, level_start_index, padding_mask):
        seq_first = (tgt + query_pos).transpose(0, 1)  # nn.MultiheadAttention without batch_first
        mixed = self.self_attn(seq_first, seq_first, tgt.transpose(0, 1))[0].transpose(0, 1)
        tgt = self.norm2(tgt + self.drop(mixed))
        read = self.cross_attn(tgt + query_pos, reference_points, src, spatial_shapes, level_start_index, padding_mask)
        return _feed_forward(self, self.norm1(tgt + self.drop(read)), self.norm3)


class _Encoder(nn.Module):
    def __init__(self, layer: _EncoderLayer, num_layers: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(copy.deepcopy(layer) for _ in range(num_layers))
        self.num_layers = num_layers

    def forward(self, src, shapes, spatial_shapes, level_start_index, valid_ratios, pos, padding_mask):
        reference = _encoder_points(shapes, valid_ratios)
        for layer in self.layers:
            src = layer(src, pos, reference, spatial_shapes, level_start_index, padding_mask)
        return src


class _Decoder(nn.Module):
    """The decoder layers; ``bbox_embed`` / ``class_embed`` are filled by :class:`OriginalDeformableDETR`
    (refinement heads; two-stage heads), which makes them a second set of keys in the state dict."""

    def __init__(self, layer: _DecoderLayer, num_layers: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(copy.deepcopy(layer) for _ in range(num_layers))
        self.num_layers = num_layers
        self.bbox_embed: nn.ModuleList | None = None
        self.class_embed: nn.ModuleList | None = None

    def forward(self, tgt, reference, src, spatial_shapes, level_start_index, valid_ratios, query_pos, padding_mask):
        hidden, references, x = [], [], tgt
        for i, layer in enumerate(self.layers):
            # the reference seen from every level (a box's size scales with the valid ratios too)
            scale = valid_ratios if reference.shape[-1] == 2 else valid_ratios.repeat(1, 1, 2)
            x = layer(x, query_pos, reference[:, :, None] * scale[:, None], src, spatial_shapes, level_start_index, padding_mask)
            if self.bbox_embed is not None:  # iterative refinement: the next layer starts from this layer's boxes
                reference = _refine(reference, self.bbox_embed[i](x)).detach()
            hidden.append(x)
            references.append(reference)
        return torch.stack(hidden), torch.stack(references)


class _Transformer(nn.Module):
    def __init__(self, d, nhead, ne, nd, ffn, dropout, n_levels, dec_points, enc_points, two_stage, num_proposals):
        super().__init__()
        self.d_model, self.nhead = d, nhead
        self.two_stage, self.two_stage_num_proposals = two_stage, num_proposals
        self.encoder = _Encoder(_EncoderLayer(d, ffn, dropout, n_levels, nhead, enc_points), ne)
        self.decoder = _Decoder(_DecoderLayer(d, ffn, dropout, n_levels, nhead, dec_points), nd)
        self.level_embed = nn.Parameter(torch.empty(n_levels, d))
        if two_stage:
            self.enc_output, self.enc_output_norm = nn.Linear(d, d), nn.LayerNorm(d)
            self.pos_trans, self.pos_trans_norm = nn.Linear(2 * d, 2 * d), nn.LayerNorm(2 * d)
        else:
            self.reference_points = nn.Linear(d, 2)
        # starting values: xavier for every weight matrix, after which each deformable attention restores its own
        # start (the offset star); the reference points' bias zero, the level embedding standard normal
        for matrix in filter(lambda p: p.dim() > 1, self.parameters()):
            nn.init.xavier_uniform_(matrix)
        for attention in [m for m in self.modules() if isinstance(m, MSDeformAttn)]:
            attention._reset_parameters()
        nn.init.normal_(self.level_embed)
        if not two_stage:
            nn.init.zeros_(self.reference_points.bias)

    def proposal_embedding(self, coords: Tensor) -> Tensor:
        """(B, K, 4) box logits -> (B, K, 4 * d/2): sine features of each coordinate's sigmoid times 2*pi."""
        angles = (coords.sigmoid() * (2 * math.pi))[..., None] / _frequencies(self.d_model // 2, coords.device)
        return _sin_cos(angles).flatten(2)

    def encoder_proposals(self, memory: Tensor, padding_mask: Tensor, shapes: list[tuple[int, int]]):
        """One box per position (its pixel centre in the unpadded area, size 0.05 * 2^level) as logits, ``inf``
        where padded or too near the border, and the memory through ``enc_output`` (zeroed at those places)."""
        batch, boxes, first = memory.shape[0], [], 0
        for level, (h, w) in enumerate(shapes):
            pad = padding_mask[:, first:first + h * w].view(batch, h, w)
            extent = torch.stack([(~pad[:, 0, :]).sum(1), (~pad[:, :, 0]).sum(1)], -1).view(batch, 1, 1, 2)
            gy, gx = torch.meshgrid(torch.arange(h, dtype=torch.float32, device=memory.device),
                                    torch.arange(w, dtype=torch.float32, device=memory.device), indexing="ij")
            centre = (torch.stack([gx, gy], -1)[None] + 0.5) / extent
            boxes.append(torch.cat([centre, torch.full_like(centre, 0.05 * 2.0 ** level)], -1).view(batch, -1, 4))
            first += h * w
        proposals = torch.cat(boxes, 1)
        blocked = padding_mask.unsqueeze(-1) | ~((proposals > 0.01) & (proposals < 0.99)).all(-1, keepdim=True)
        logits = (proposals / (1 - proposals)).log().masked_fill(blocked, float("inf"))
        return self.enc_output_norm(self.enc_output(memory.masked_fill(blocked, 0.0))), logits

    def forward(self, srcs, masks, pos_embeds, query_embed=None):
        shapes = [tuple(s.shape[-2:]) for s in srcs]
        src = torch.cat([s.flatten(2).transpose(1, 2) for s in srcs], 1)
        pos = torch.cat([p.flatten(2).transpose(1, 2) + self.level_embed[i].view(1, 1, -1) for i, p in enumerate(pos_embeds)], 1)
        padding = torch.cat([m.flatten(1) for m in masks], 1)
        spatial_shapes = torch.as_tensor(shapes, dtype=torch.long, device=src.device)
        level_start_index = torch.cat((spatial_shapes.new_zeros((1,)), spatial_shapes.prod(1).cumsum(0)[:-1]))
        valid_ratios = _valid_ratios(masks)
        memory = self.encoder(src, shapes, spatial_shapes, level_start_index, valid_ratios, pos, padding)
        batch, _, d = memory.shape
        enc_class = enc_coord = None
        if self.two_stage:
            features, proposals = self.encoder_proposals(memory, padding, shapes)
            last = self.decoder.num_layers  # the proposals' heads come after the decoder layers' ones
            enc_class = self.decoder.class_embed[last](features)
            enc_coord = self.decoder.bbox_embed[last](features) + proposals
            chosen = enc_class[..., 0].topk(self.two_stage_num_proposals, dim=1).indices
            coords = enc_coord.gather(1, chosen[..., None].expand(-1, -1, 4)).detach()
            reference = coords.sigmoid()
            query_pos, tgt = self.pos_trans_norm(self.pos_trans(self.proposal_embedding(coords))).split(d, dim=-1)
        else:
            query_pos, tgt = (t.unsqueeze(0).expand(batch, -1, -1) for t in query_embed.split(d, dim=-1))
            reference = self.reference_points(query_pos).sigmoid()
        hidden, references = self.decoder(tgt, reference, memory, spatial_shapes, level_start_index, valid_ratios, query_pos, padding)
        return hidden, reference, references, enc_class, enc_coord


class _MLP(nn.Module):
    """The box head: Linear layers ``layers.0`` .. ``layers.{n-1}`` with a ReLU between them."""

    def __init__(self, i: int, h: int, o: int, n: int) -> None:
        super().__init__()
        widths = [i] + [h] * (n - 1) + [o]
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths[:-1], widths[1:]))

    def forward(self, x: Tensor) -> Tensor:
        *hidden, last = self.layers
        for layer in hidden:
            x = F.relu(layer(x))
        return last(x)


def _level_projections(channels: list[int], d: int, num_levels: int) -> nn.ModuleList:
    """A 1x1 conv + GroupNorm(32) per backbone map; the extra levels are 3x3 stride-2 convs, each on the one before."""
    projections = [nn.Sequential(nn.Conv2d(c, d, kernel_size=1), nn.GroupNorm(32, d)) for c in channels][:num_levels]
    for i in range(num_levels - len(projections)):
        source = channels[-1] if i == 0 else d
        projections.append(nn.Sequential(nn.Conv2d(source, d, kernel_size=3, stride=2, padding=1), nn.GroupNorm(32, d)))
    return nn.ModuleList(projections)


class OriginalDeformableDETR(nn.Module):
    """``DeformableDETR`` with the original's module tree, key layout, initialisation and forward.

    Defaults are the published R50 model; ``with_box_refine`` / ``two_stage`` give the other two.
    ``forward(images, mask)`` returns the original's output dict (``pred_logits``, ``pred_boxes``,
    ``aux_outputs`` and, two-stage, ``enc_outputs``).
    """

    def __init__(self, num_classes=91, backbone="resnet50", num_feature_levels=4, d=256, nheads=8, enc_layers=6, dec_layers=6,
                 dim_feedforward=1024, dropout=0.1, num_queries=300, dec_n_points=4, enc_n_points=4,
                 with_box_refine=False, two_stage=False, aux_loss=True):
        super().__init__()
        self.num_queries, self.num_feature_levels = num_queries, num_feature_levels
        self.aux_loss, self.with_box_refine, self.two_stage = aux_loss, with_box_refine, two_stage
        self.transformer = _Transformer(d, nheads, enc_layers, dec_layers, dim_feedforward, dropout, num_feature_levels,
                                        dec_n_points, enc_n_points, two_stage, num_queries)
        class_head, box_head = nn.Linear(d, num_classes), _MLP(d, d, 4, 3)
        if not two_stage:
            self.query_embed = nn.Embedding(num_queries, 2 * d)
        self.backbone = _Joiner(_Backbone(backbone, num_feature_levels), _SinePE(d // 2))
        self.input_proj = _level_projections(self.backbone.num_channels, d, num_feature_levels)
        # starting values: a 0.01 prior class probability, zero box deltas, xavier projections
        nn.init.constant_(class_head.bias, -math.log((1 - 0.01) / 0.01))
        nn.init.zeros_(box_head.layers[-1].weight)
        nn.init.zeros_(box_head.layers[-1].bias)
        for projection in self.input_proj:
            nn.init.xavier_uniform_(projection[0].weight)
            nn.init.zeros_(projection[0].bias)
        self.class_embed, self.bbox_embed = self._prediction_heads(class_head, box_head, dec_layers)

    def _prediction_heads(self, class_head: nn.Linear, box_head: _MLP, dec_layers: int) -> tuple[nn.ModuleList, nn.ModuleList]:
        """One (class, box) head pair per decoder layer, plus the proposals' pair last for two-stage.

        Refinement gives each prediction its own copy and lends the box heads to the decoder; otherwise one
        pair serves every layer, so the checkpoint repeats its tensors under each index. The first box head's
        size logits start at -2 (small boxes), except with two-stage, where every head starts at 0 (the
        proposals already have sizes). Two-stage lends the class heads to the decoder as well.
        """
        count = dec_layers + 1 if self.two_stage else dec_layers
        if self.with_box_refine:
            class_heads = nn.ModuleList(copy.deepcopy(class_head) for _ in range(count))
            box_heads = nn.ModuleList(copy.deepcopy(box_head) for _ in range(count))
        else:
            class_heads, box_heads = nn.ModuleList([class_head] * count), nn.ModuleList([box_head] * count)
        nn.init.constant_(box_heads[0].layers[-1].bias[2:], 0.0 if self.two_stage else -2.0)
        self.transformer.decoder.bbox_embed = box_heads if self.with_box_refine else None
        if self.two_stage:
            self.transformer.decoder.class_embed = class_heads
        return class_heads, box_heads

    def forward(self, images: Tensor, mask: Tensor) -> dict:
        features, pos = self.backbone(images, mask)
        srcs = [projection(x) for projection, (x, _) in zip(self.input_proj, features)]
        masks = [m for _, m in features][:len(srcs)]
        source = features[-1][0]  # the first extra level reads the backbone's last map, later ones the level before
        for projection in self.input_proj[len(srcs):]:
            source = projection(source)
            level_mask = _mask_at(mask, source.shape[-2:])
            srcs.append(source)
            masks.append(level_mask)
            pos.append(self.backbone[1](level_mask).to(source.dtype))
        query_embeds = None if self.two_stage else self.query_embed.weight
        hidden, first_reference, references, enc_class, enc_coord = self.transformer(srcs, masks, pos, query_embeds)
        starts = [first_reference, *references[:-1]]  # the reference each layer's boxes are relative to
        logits = torch.stack([self.class_embed[i](h) for i, h in enumerate(hidden)])
        boxes = torch.stack([_refine(starts[i], self.bbox_embed[i](h)) for i, h in enumerate(hidden)])
        out = {"pred_logits": logits[-1], "pred_boxes": boxes[-1]}
        if self.aux_loss:
            out["aux_outputs"] = [{"pred_logits": a, "pred_boxes": b} for a, b in zip(logits[:-1], boxes[:-1])]
        if self.two_stage:
            out["enc_outputs"] = {"pred_logits": enc_class, "pred_boxes": enc_coord.sigmoid()}
        return out


# --------------------------------------------------------------------------- matcher
def original_focal_cost(logits: Tensor, labels: Tensor, alpha: float = 0.25, gamma: float = 2.0) -> Tensor:
    """(B*Q, T): for every query and target, the focal loss of the query's probability of the target's class
    counted as positive, minus the same counted as negative (1e-8 inside the logs)."""
    p = logits.flatten(0, 1).sigmoid()[:, labels]
    as_positive = alpha * (1 - p) ** gamma * -(p + 1e-8).log()
    as_negative = (1 - alpha) * p ** gamma * -(1 - p + 1e-8).log()
    return as_positive - as_negative


@torch.no_grad()
def original_match(outputs: dict, targets: list[dict], cost_class=2.0, cost_bbox=5.0, cost_giou=2.0):
    """The original matcher: one cost matrix between all queries and all targets of the batch, of which each
    image's own block (its queries x its targets) is solved by scipy's linear_sum_assignment."""
    logits, pred = outputs["pred_logits"], outputs["pred_boxes"].flatten(0, 1)
    batch, queries = logits.shape[:2]
    labels = torch.cat([t["labels"] for t in targets])
    gt = torch.cat([t["boxes"] for t in targets])
    overlap = generalized_box_iou(box_convert(pred, "cxcywh", "xyxy"), box_convert(gt, "cxcywh", "xyxy"))
    total = cost_bbox * torch.cdist(pred, gt, p=1) + cost_class * original_focal_cost(logits, labels) - cost_giou * overlap
    blocks = total.view(batch, queries, -1).cpu().split([len(t["boxes"]) for t in targets], -1)
    pairs = [linear_sum_assignment(block[image]) for image, block in enumerate(blocks)]
    return [(torch.as_tensor(q, dtype=torch.int64), torch.as_tensor(t, dtype=torch.int64)) for q, t in pairs]
