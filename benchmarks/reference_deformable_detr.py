"""The ORIGINAL Deformable DETR design (fundamentalvision/Deformable-DETR), re-implemented as a baseline.

The original repository cannot be imported here (its attention needs a compiled CUDA extension),
so this module re-creates what parity tests and benchmarks need, written from its description:

* :func:`original_core`: the maths of ``ms_deform_attn_core_pytorch``, the original's pure-PyTorch
  attention core (one ``F.grid_sample`` per level, the samples stacked and weighted);
* :class:`OriginalDeformableDETR`: the module tree and parameter names of ``models/deformable_detr/deformable_detr.py``
  and ``models/deformable_detr/transformer.py``, with the original's "hacks" kept, so that
  ``state_dict()`` has the published checkpoints' key layout: the shared heads of the plain model
  repeated under ``class_embed.{i}`` / ``bbox_embed.{i}``, the refinement heads also registered as
  ``transformer.decoder.bbox_embed``, the two-stage class heads as
  ``transformer.decoder.class_embed``. Sequence handling, reference points, proposals, the
  decoder's refinement and the heads follow the original step by step (per-level loops and all);
* :func:`original_focal_cost`, :func:`original_sigmoid_focal_loss`, :class:`OriginalSetCriterion`,
  :func:`original_postprocess`: the original's matcher cost, loss and post-processing maths.

Two deliberate deviations, both neutral at the published size: the backbone's channel counts are
read from the ResNet instead of hard-coded (so ResNet-18 test models build), and the two-stage
proposal embedding uses ``d_model // 2`` sine features instead of a hard-coded 128 (equal at d 256,
as HF does). Dropout is kept as modules (benchmarks switch it off with ``dropout=0``).
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

from benchmarks.reference_detr import FrozenBatchNorm2d


# --------------------------------------------------------------------------- attention
def original_core(value: Tensor, spatial_shapes, sampling_locations: Tensor, attention_weights: Tensor) -> Tensor:
    """``ms_deform_attn_core_pytorch``: value (N, S, M, D), locations (N, Lq, M, L, P, 2) -> (N, Lq, M*D)."""
    N, _, M, D = value.shape
    _, Lq, _, L, P, _ = sampling_locations.shape
    shapes = [(int(h), int(w)) for h, w in spatial_shapes]
    per_level = value.split([h * w for h, w in shapes], dim=1)
    grids = 2 * sampling_locations - 1
    sampled = []
    for lvl, (h, w) in enumerate(shapes):
        v = per_level[lvl].flatten(2).transpose(1, 2).reshape(N * M, D, h, w)
        g = grids[:, :, :, lvl].transpose(1, 2).flatten(0, 1)
        sampled.append(F.grid_sample(v, g, mode="bilinear", padding_mode="zeros", align_corners=False))
    weights = attention_weights.transpose(1, 2).reshape(N * M, 1, Lq, L * P)
    out = (torch.stack(sampled, dim=-2).flatten(-2) * weights).sum(-1).view(N, M * D, Lq)
    return out.transpose(1, 2).contiguous()


class MSDeformAttn(nn.Module):
    """``models/ops/modules/ms_deform_attn.py`` with :func:`original_core` as its core."""

    def __init__(self, d_model=256, n_levels=4, n_heads=8, n_points=4):
        super().__init__()
        self.d_model, self.n_levels, self.n_heads, self.n_points = d_model, n_levels, n_heads, n_points
        self.sampling_offsets = nn.Linear(d_model, n_heads * n_levels * n_points * 2)
        self.attention_weights = nn.Linear(d_model, n_heads * n_levels * n_points)
        self.value_proj = nn.Linear(d_model, d_model)
        self.output_proj = nn.Linear(d_model, d_model)
        self._reset_parameters()

    def _reset_parameters(self):
        nn.init.constant_(self.sampling_offsets.weight, 0.0)
        thetas = torch.arange(self.n_heads, dtype=torch.float32) * (2.0 * math.pi / self.n_heads)
        grid = torch.stack([thetas.cos(), thetas.sin()], -1)
        grid = (grid / grid.abs().max(-1, keepdim=True)[0]).view(self.n_heads, 1, 1, 2).repeat(1, self.n_levels, self.n_points, 1)
        for i in range(self.n_points):
            grid[:, :, i, :] *= i + 1
        with torch.no_grad():
            self.sampling_offsets.bias = nn.Parameter(grid.view(-1))
        nn.init.constant_(self.attention_weights.weight, 0.0)
        nn.init.constant_(self.attention_weights.bias, 0.0)
        nn.init.xavier_uniform_(self.value_proj.weight)
        nn.init.constant_(self.value_proj.bias, 0.0)
        nn.init.xavier_uniform_(self.output_proj.weight)
        nn.init.constant_(self.output_proj.bias, 0.0)

    def forward(self, query, reference_points, input_flatten, input_spatial_shapes, input_level_start_index, input_padding_mask=None):
        N, Lq, _ = query.shape
        _, Lin, _ = input_flatten.shape
        value = self.value_proj(input_flatten)
        if input_padding_mask is not None:
            value = value.masked_fill(input_padding_mask[..., None], 0.0)
        value = value.view(N, Lin, self.n_heads, self.d_model // self.n_heads)
        offsets = self.sampling_offsets(query).view(N, Lq, self.n_heads, self.n_levels, self.n_points, 2)
        weights = self.attention_weights(query).view(N, Lq, self.n_heads, self.n_levels * self.n_points)
        weights = F.softmax(weights, -1).view(N, Lq, self.n_heads, self.n_levels, self.n_points)
        if reference_points.shape[-1] == 2:
            normalizer = torch.stack([input_spatial_shapes[..., 1], input_spatial_shapes[..., 0]], -1)
            loc = reference_points[:, :, None, :, None, :] + offsets / normalizer[None, None, None, :, None, :]
        else:
            loc = reference_points[:, :, None, :, None, :2] + offsets / self.n_points * reference_points[:, :, None, :, None, 2:] * 0.5
        return self.output_proj(original_core(value, input_spatial_shapes, loc, weights))


# --------------------------------------------------------------------------- backbone
class _Backbone(nn.Module):
    """``models/backbones/backbone.py`` Backbone (multi-scale): layer2/3/4 of a frozen-BN ResNet, stem and layer1 frozen."""

    def __init__(self, name: str, num_levels: int) -> None:
        super().__init__()
        net = getattr(torchvision.models, name)(weights=None, norm_layer=FrozenBatchNorm2d)
        for pname, p in net.named_parameters():
            if "layer2" not in pname and "layer3" not in pname and "layer4" not in pname:
                p.requires_grad_(False)
        widths = [_out_channels(net.layer2), _out_channels(net.layer3), _out_channels(net.layer4)]
        if num_levels > 1:
            self.body = IntermediateLayerGetter(net, {"layer2": "0", "layer3": "1", "layer4": "2"})
            self.strides, self.num_channels = [8, 16, 32], widths
        else:
            self.body = IntermediateLayerGetter(net, {"layer4": "0"})
            self.strides, self.num_channels = [32], widths[-1:]


def _out_channels(layer: nn.Sequential) -> int:
    block = layer[-1]
    return (block.bn3 if hasattr(block, "bn3") else block.bn2).weight.numel()


class _SinePE(nn.Module):
    """``PositionEmbeddingSine(d/2, normalize=True)`` of Deformable DETR: (cumsum - 0.5) / (last + eps) * 2pi."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n

    def forward(self, mask: Tensor) -> Tensor:
        not_mask = ~mask
        y = not_mask.cumsum(1, dtype=torch.float32)
        x = not_mask.cumsum(2, dtype=torch.float32)
        y = (y - 0.5) / (y[:, -1:, :] + 1e-6) * 2 * math.pi
        x = (x - 0.5) / (x[:, :, -1:] + 1e-6) * 2 * math.pi
        dim_t = torch.arange(self.n, dtype=torch.float32, device=mask.device)
        dim_t = 10000 ** (2 * (dim_t // 2) / self.n)
        px, py = x[..., None] / dim_t, y[..., None] / dim_t
        px = torch.stack((px[..., 0::2].sin(), px[..., 1::2].cos()), dim=4).flatten(3)
        py = torch.stack((py[..., 0::2].sin(), py[..., 1::2].cos()), dim=4).flatten(3)
        return torch.cat((py, px), dim=3).permute(0, 3, 1, 2)


class _Joiner(nn.Sequential):
    def __init__(self, backbone: _Backbone, pe: _SinePE) -> None:
        super().__init__(backbone, pe)
        self.strides, self.num_channels = backbone.strides, backbone.num_channels

    def forward(self, images: Tensor, mask: Tensor):
        feats = self[0].body(images)
        out, pos = [], []
        for name in sorted(feats):
            x = feats[name]
            m = F.interpolate(mask[None].float(), size=x.shape[-2:]).to(torch.bool)[0]
            out.append((x, m))
            pos.append(self[1](m).to(x.dtype))
        return out, pos


# --------------------------------------------------------------------------- transformer
def inverse_sigmoid(x: Tensor, eps: float = 1e-5) -> Tensor:
    x = x.clamp(min=0, max=1)
    return torch.log(x.clamp(min=eps) / (1 - x).clamp(min=eps))


class _EncoderLayer(nn.Module):
    def __init__(self, d, ffn, dropout, n_levels, n_heads, n_points):
        super().__init__()
        self.self_attn = MSDeformAttn(d, n_levels, n_heads, n_points)
        self.dropout1 = nn.Dropout(dropout)
        self.norm1 = nn.LayerNorm(d)
        self.linear1 = nn.Linear(d, ffn)
        self.dropout2 = nn.Dropout(dropout)
        self.linear2 = nn.Linear(ffn, d)
        self.dropout3 = nn.Dropout(dropout)
        self.norm2 = nn.LayerNorm(d)

    def forward(self, src, pos, reference_points, spatial_shapes, level_start_index, padding_mask):
        src2 = self.self_attn(src + pos, reference_points, src, spatial_shapes, level_start_index, padding_mask)
        src = self.norm1(src + self.dropout1(src2))
        src2 = self.linear2(self.dropout2(F.relu(self.linear1(src))))
        return self.norm2(src + self.dropout3(src2))


class _Encoder(nn.Module):
    def __init__(self, layer, num_layers):
        super().__init__()
        self.layers = nn.ModuleList(copy.deepcopy(layer) for _ in range(num_layers))
        self.num_layers = num_layers

    @staticmethod
    def get_reference_points(spatial_shapes, valid_ratios, device):
        refs = []
        for lvl, (H, W) in enumerate(spatial_shapes):
            ref_y, ref_x = torch.meshgrid(
                torch.linspace(0.5, H - 0.5, H, dtype=torch.float32, device=device),
                torch.linspace(0.5, W - 0.5, W, dtype=torch.float32, device=device),
                indexing="ij",
            )
            ref_y = ref_y.reshape(-1)[None] / (valid_ratios[:, None, lvl, 1] * H)
            ref_x = ref_x.reshape(-1)[None] / (valid_ratios[:, None, lvl, 0] * W)
            refs.append(torch.stack((ref_x, ref_y), -1))
        reference_points = torch.cat(refs, 1)
        return reference_points[:, :, None] * valid_ratios[:, None]

    def forward(self, src, spatial_shapes, level_start_index, valid_ratios, pos, padding_mask):
        ref = self.get_reference_points(spatial_shapes, valid_ratios, src.device)
        for layer in self.layers:
            src = layer(src, pos, ref, spatial_shapes, level_start_index, padding_mask)
        return src


class _DecoderLayer(nn.Module):
    def __init__(self, d, ffn, dropout, n_levels, n_heads, n_points):
        super().__init__()
        self.cross_attn = MSDeformAttn(d, n_levels, n_heads, n_points)
        self.dropout1 = nn.Dropout(dropout)
        self.norm1 = nn.LayerNorm(d)
        self.self_attn = nn.MultiheadAttention(d, n_heads, dropout=dropout)
        self.dropout2 = nn.Dropout(dropout)
        self.norm2 = nn.LayerNorm(d)
        self.linear1 = nn.Linear(d, ffn)
        self.dropout3 = nn.Dropout(dropout)
        self.linear2 = nn.Linear(ffn, d)
        self.dropout4 = nn.Dropout(dropout)
        self.norm3 = nn.LayerNorm(d)

    def forward(self, tgt, query_pos, reference_points, src, spatial_shapes, level_start_index, padding_mask):
        q = k = tgt + query_pos
        tgt2 = self.self_attn(q.transpose(0, 1), k.transpose(0, 1), tgt.transpose(0, 1))[0].transpose(0, 1)
        tgt = self.norm2(tgt + self.dropout2(tgt2))
        tgt2 = self.cross_attn(tgt + query_pos, reference_points, src, spatial_shapes, level_start_index, padding_mask)
        tgt = self.norm1(tgt + self.dropout1(tgt2))
        tgt2 = self.linear2(self.dropout3(F.relu(self.linear1(tgt))))
        return self.norm3(tgt + self.dropout4(tgt2))


class _Decoder(nn.Module):
    def __init__(self, layer, num_layers):
        super().__init__()
        self.layers = nn.ModuleList(copy.deepcopy(layer) for _ in range(num_layers))
        self.num_layers = num_layers
        self.bbox_embed = None
        self.class_embed = None

    def forward(self, tgt, reference_points, src, spatial_shapes, level_start_index, valid_ratios, query_pos, padding_mask):
        output, intermediate, intermediate_refs = tgt, [], []
        for lid, layer in enumerate(self.layers):
            if reference_points.shape[-1] == 4:
                ref_input = reference_points[:, :, None] * torch.cat([valid_ratios, valid_ratios], -1)[:, None]
            else:
                ref_input = reference_points[:, :, None] * valid_ratios[:, None]
            output = layer(output, query_pos, ref_input, src, spatial_shapes, level_start_index, padding_mask)
            if self.bbox_embed is not None:
                tmp = self.bbox_embed[lid](output)
                if reference_points.shape[-1] == 4:
                    new_ref = (tmp + inverse_sigmoid(reference_points)).sigmoid()
                else:
                    new_ref = tmp
                    new_ref[..., :2] = tmp[..., :2] + inverse_sigmoid(reference_points)
                    new_ref = new_ref.sigmoid()
                reference_points = new_ref.detach()
            intermediate.append(output)
            intermediate_refs.append(reference_points)
        return torch.stack(intermediate), torch.stack(intermediate_refs)


class _Transformer(nn.Module):
    def __init__(self, d, nhead, ne, nd, ffn, dropout, n_levels, dec_points, enc_points, two_stage, num_proposals):
        super().__init__()
        self.d_model, self.nhead = d, nhead
        self.two_stage, self.two_stage_num_proposals = two_stage, num_proposals
        self.encoder = _Encoder(_EncoderLayer(d, ffn, dropout, n_levels, nhead, enc_points), ne)
        self.decoder = _Decoder(_DecoderLayer(d, ffn, dropout, n_levels, nhead, dec_points), nd)
        self.level_embed = nn.Parameter(torch.empty(n_levels, d))
        if two_stage:
            self.enc_output = nn.Linear(d, d)
            self.enc_output_norm = nn.LayerNorm(d)
            self.pos_trans = nn.Linear(d * 2, d * 2)
            self.pos_trans_norm = nn.LayerNorm(d * 2)
        else:
            self.reference_points = nn.Linear(d, 2)
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)
        for m in self.modules():
            if isinstance(m, MSDeformAttn):
                m._reset_parameters()
        if not two_stage:
            nn.init.xavier_uniform_(self.reference_points.weight, gain=1.0)
            nn.init.constant_(self.reference_points.bias, 0.0)
        nn.init.normal_(self.level_embed)

    def get_proposal_pos_embed(self, proposals):
        n = self.d_model // 2
        dim_t = torch.arange(n, dtype=torch.float32, device=proposals.device)
        dim_t = 10000 ** (2 * (dim_t // 2) / n)
        pos = proposals.sigmoid() * 2 * math.pi
        pos = pos[:, :, :, None] / dim_t
        return torch.stack((pos[:, :, :, 0::2].sin(), pos[:, :, :, 1::2].cos()), dim=4).flatten(2)

    def gen_encoder_output_proposals(self, memory, padding_mask, spatial_shapes):
        N = memory.shape[0]
        proposals, cur = [], 0
        for lvl, (H, W) in enumerate(spatial_shapes):
            m = padding_mask[:, cur:cur + H * W].view(N, H, W, 1)
            valid_H = torch.sum(~m[:, :, 0, 0], 1)
            valid_W = torch.sum(~m[:, 0, :, 0], 1)
            gy, gx = torch.meshgrid(
                torch.linspace(0, H - 1, H, dtype=torch.float32, device=memory.device),
                torch.linspace(0, W - 1, W, dtype=torch.float32, device=memory.device),
                indexing="ij",
            )
            grid = torch.cat([gx.unsqueeze(-1), gy.unsqueeze(-1)], -1)
            scale = torch.cat([valid_W.unsqueeze(-1), valid_H.unsqueeze(-1)], 1).view(N, 1, 1, 2)
            grid = (grid.unsqueeze(0).expand(N, -1, -1, -1) + 0.5) / scale
            wh = torch.ones_like(grid) * 0.05 * (2.0 ** lvl)
            proposals.append(torch.cat((grid, wh), -1).view(N, -1, 4))
            cur += H * W
        props = torch.cat(proposals, 1)
        valid = ((props > 0.01) & (props < 0.99)).all(-1, keepdim=True)
        props = torch.log(props / (1 - props))
        props = props.masked_fill(padding_mask.unsqueeze(-1), float("inf"))
        props = props.masked_fill(~valid, float("inf"))
        out = memory.masked_fill(padding_mask.unsqueeze(-1), 0.0).masked_fill(~valid, 0.0)
        return self.enc_output_norm(self.enc_output(out)), props

    @staticmethod
    def get_valid_ratio(mask):
        _, H, W = mask.shape
        valid_H = torch.sum(~mask[:, :, 0], 1)
        valid_W = torch.sum(~mask[:, 0, :], 1)
        return torch.stack([valid_W.float() / W, valid_H.float() / H], -1)

    def forward(self, srcs, masks, pos_embeds, query_embed=None):
        src_flat, mask_flat, pos_flat, shapes = [], [], [], []
        for lvl, (src, mask, pos) in enumerate(zip(srcs, masks, pos_embeds)):
            shapes.append(tuple(src.shape[-2:]))
            src_flat.append(src.flatten(2).transpose(1, 2))
            mask_flat.append(mask.flatten(1))
            pos_flat.append(pos.flatten(2).transpose(1, 2) + self.level_embed[lvl].view(1, 1, -1))
        src_flat, mask_flat, pos_flat = torch.cat(src_flat, 1), torch.cat(mask_flat, 1), torch.cat(pos_flat, 1)
        spatial_shapes = torch.as_tensor(shapes, dtype=torch.long, device=src_flat.device)
        level_start_index = torch.cat((spatial_shapes.new_zeros((1,)), spatial_shapes.prod(1).cumsum(0)[:-1]))
        valid_ratios = torch.stack([self.get_valid_ratio(m) for m in masks], 1)
        memory = self.encoder(src_flat, spatial_shapes, level_start_index, valid_ratios, pos_flat, mask_flat)
        N, _, c = memory.shape
        enc_class = enc_coord = None
        if self.two_stage:
            out_mem, out_props = self.gen_encoder_output_proposals(memory, mask_flat, shapes)
            enc_class = self.decoder.class_embed[self.decoder.num_layers](out_mem)
            enc_coord = self.decoder.bbox_embed[self.decoder.num_layers](out_mem) + out_props
            topk = torch.topk(enc_class[..., 0], self.two_stage_num_proposals, dim=1)[1]
            topk_coords = torch.gather(enc_coord, 1, topk.unsqueeze(-1).repeat(1, 1, 4)).detach()
            reference_points = topk_coords.sigmoid()
            init_reference = reference_points
            pos_trans_out = self.pos_trans_norm(self.pos_trans(self.get_proposal_pos_embed(topk_coords)))
            query_pos, tgt = torch.split(pos_trans_out, c, dim=2)
        else:
            query_pos, tgt = torch.split(query_embed, c, dim=1)
            query_pos = query_pos.unsqueeze(0).expand(N, -1, -1)
            tgt = tgt.unsqueeze(0).expand(N, -1, -1)
            reference_points = self.reference_points(query_pos).sigmoid()
            init_reference = reference_points
        hs, inter_refs = self.decoder(tgt, reference_points, memory, spatial_shapes, level_start_index, valid_ratios, query_pos, mask_flat)
        return hs, init_reference, inter_refs, enc_class, enc_coord


class _MLP(nn.Module):
    def __init__(self, i, h, o, n):
        super().__init__()
        self.num_layers = n
        hs = [h] * (n - 1)
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip([i] + hs, hs + [o]))

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = F.relu(layer(x)) if i < self.num_layers - 1 else layer(x)
        return x


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
        self.num_queries = num_queries
        self.num_feature_levels = num_feature_levels
        self.aux_loss, self.with_box_refine, self.two_stage = aux_loss, with_box_refine, two_stage
        self.backbone = _Joiner(_Backbone(backbone, num_feature_levels), _SinePE(d // 2))
        self.transformer = _Transformer(d, nheads, enc_layers, dec_layers, dim_feedforward, dropout, num_feature_levels,
                                        dec_n_points, enc_n_points, two_stage, num_queries)
        self.class_embed = nn.Linear(d, num_classes)
        self.bbox_embed = _MLP(d, d, 4, 3)
        if not two_stage:
            self.query_embed = nn.Embedding(num_queries, d * 2)
        channels = self.backbone.num_channels
        projs = [nn.Sequential(nn.Conv2d(c, d, kernel_size=1), nn.GroupNorm(32, d)) for c in channels]
        in_ch = channels[-1]
        for _ in range(num_feature_levels - len(channels)):
            projs.append(nn.Sequential(nn.Conv2d(in_ch, d, kernel_size=3, stride=2, padding=1), nn.GroupNorm(32, d)))
            in_ch = d
        self.input_proj = nn.ModuleList(projs[:num_feature_levels])
        bias_value = -math.log((1 - 0.01) / 0.01)
        self.class_embed.bias.data = torch.ones(num_classes) * bias_value
        nn.init.constant_(self.bbox_embed.layers[-1].weight, 0)
        nn.init.constant_(self.bbox_embed.layers[-1].bias, 0)
        for proj in self.input_proj:
            nn.init.xavier_uniform_(proj[0].weight, gain=1)
            nn.init.constant_(proj[0].bias, 0)
        num_pred = dec_layers + 1 if two_stage else dec_layers
        if with_box_refine:
            self.class_embed = nn.ModuleList(copy.deepcopy(self.class_embed) for _ in range(num_pred))
            self.bbox_embed = nn.ModuleList(copy.deepcopy(self.bbox_embed) for _ in range(num_pred))
            nn.init.constant_(self.bbox_embed[0].layers[-1].bias.data[2:], -2.0)
            self.transformer.decoder.bbox_embed = self.bbox_embed
        else:
            nn.init.constant_(self.bbox_embed.layers[-1].bias.data[2:], -2.0)
            self.class_embed = nn.ModuleList([self.class_embed for _ in range(num_pred)])
            self.bbox_embed = nn.ModuleList([self.bbox_embed for _ in range(num_pred)])
            self.transformer.decoder.bbox_embed = None
        if two_stage:
            self.transformer.decoder.class_embed = self.class_embed
            for head in self.bbox_embed:
                nn.init.constant_(head.layers[-1].bias.data[2:], 0.0)

    def forward(self, images: Tensor, mask: Tensor) -> dict:
        features, pos = self.backbone(images, mask)
        srcs, masks = [], []
        for lvl, (src, m) in enumerate(features):
            srcs.append(self.input_proj[lvl](src))
            masks.append(m)
        for lvl in range(len(srcs), self.num_feature_levels):
            src = self.input_proj[lvl](features[-1][0] if lvl == len(features) else srcs[-1])
            m = F.interpolate(mask[None].float(), size=src.shape[-2:]).to(torch.bool)[0]
            srcs.append(src)
            masks.append(m)
            pos.append(self.backbone[1](m).to(src.dtype))
        query_embeds = None if self.two_stage else self.query_embed.weight
        hs, init_reference, inter_references, enc_class, enc_coord = self.transformer(srcs, masks, pos, query_embeds)
        classes, coords = [], []
        for lvl in range(hs.shape[0]):
            reference = inverse_sigmoid(init_reference if lvl == 0 else inter_references[lvl - 1])
            tmp = self.bbox_embed[lvl](hs[lvl])
            if reference.shape[-1] == 4:
                tmp = tmp + reference
            else:
                tmp = torch.cat([tmp[..., :2] + reference, tmp[..., 2:]], -1)
            classes.append(self.class_embed[lvl](hs[lvl]))
            coords.append(tmp.sigmoid())
        classes, coords = torch.stack(classes), torch.stack(coords)
        out = {"pred_logits": classes[-1], "pred_boxes": coords[-1]}
        if self.aux_loss:
            out["aux_outputs"] = [{"pred_logits": a, "pred_boxes": b} for a, b in zip(classes[:-1], coords[:-1])]
        if self.two_stage:
            out["enc_outputs"] = {"pred_logits": enc_class, "pred_boxes": enc_coord.sigmoid()}
        return out


# --------------------------------------------------------------------------- matcher, loss, post-processing
def original_focal_cost(logits: Tensor, labels: Tensor, alpha: float = 0.25, gamma: float = 2.0) -> Tensor:
    """``models/matcher.py``: (B*Q, T) focal class cost of every query against every target."""
    prob = logits.flatten(0, 1).sigmoid()
    neg = (1 - alpha) * (prob ** gamma) * (-(1 - prob + 1e-8).log())
    pos = alpha * ((1 - prob) ** gamma) * (-(prob + 1e-8).log())
    return pos[:, labels] - neg[:, labels]


@torch.no_grad()
def original_match(outputs: dict, targets: list[dict], cost_class=2.0, cost_bbox=5.0, cost_giou=2.0):
    """The original HungarianMatcher with the focal cost: one (B*Q) x sum(N) matrix split per image."""
    bs, nq = outputs["pred_logits"].shape[:2]
    tgt_ids = torch.cat([t["labels"] for t in targets])
    tgt_bbox = torch.cat([t["boxes"] for t in targets])
    out_bbox = outputs["pred_boxes"].flatten(0, 1)
    c_class = original_focal_cost(outputs["pred_logits"], tgt_ids)
    c_bbox = torch.cdist(out_bbox, tgt_bbox, p=1)
    c_giou = -generalized_box_iou(box_convert(out_bbox, "cxcywh", "xyxy"), box_convert(tgt_bbox, "cxcywh", "xyxy"))
    C = (cost_bbox * c_bbox + cost_class * c_class + cost_giou * c_giou).view(bs, nq, -1).cpu()
    sizes = [len(t["boxes"]) for t in targets]
    idx = [linear_sum_assignment(c[i]) for i, c in enumerate(C.split(sizes, -1))]
    return [(torch.as_tensor(i, dtype=torch.int64), torch.as_tensor(j, dtype=torch.int64)) for i, j in idx]


def original_sigmoid_focal_loss(inputs, targets, num_boxes, alpha: float = 0.25, gamma: float = 2):
    """``models/segmentation.py`` sigmoid_focal_loss: mean over queries' classes, summed, / num_boxes."""
    prob = inputs.sigmoid()
    ce = F.binary_cross_entropy_with_logits(inputs, targets, reduction="none")
    p_t = prob * targets + (1 - prob) * (1 - targets)
    loss = ce * ((1 - p_t) ** gamma)
    if alpha >= 0:
        loss = (alpha * targets + (1 - alpha) * (1 - targets)) * loss
    return loss.mean(1).sum() / num_boxes


class OriginalSetCriterion(nn.Module):
    """The original's SetCriterion (labels, boxes, cardinality; aux ``_i``; two-stage ``_enc``), unweighted terms."""

    def __init__(self, num_classes: int, matcher=original_match, focal_alpha: float = 0.25):
        super().__init__()
        self.num_classes, self.matcher, self.focal_alpha = num_classes, matcher, focal_alpha

    @staticmethod
    def _src_idx(indices):
        return (torch.cat([torch.full_like(s, i) for i, (s, _) in enumerate(indices)]), torch.cat([s for s, _ in indices]))

    def _terms(self, outputs, targets, indices, num_boxes, log=True):
        logits = outputs["pred_logits"]
        idx = self._src_idx(indices)
        tgt_o = torch.cat([t["labels"][j] for t, (_, j) in zip(targets, indices)])
        tgt = torch.full(logits.shape[:2], self.num_classes, dtype=torch.int64, device=logits.device)
        tgt[idx] = tgt_o
        onehot = torch.zeros([logits.shape[0], logits.shape[1], logits.shape[2] + 1], dtype=logits.dtype, device=logits.device)
        onehot.scatter_(2, tgt.unsqueeze(-1), 1)
        onehot = onehot[:, :, :-1]
        out = {"loss_ce": original_sigmoid_focal_loss(logits, onehot, num_boxes, alpha=self.focal_alpha, gamma=2) * logits.shape[1]}
        if log:
            out["class_error"] = 100 - (logits[idx].argmax(-1) == tgt_o).float().mean() * 100 if len(tgt_o) else torch.tensor(100.0)
        card = (logits.argmax(-1) != logits.shape[-1] - 1).sum(1)
        out["cardinality_error"] = F.l1_loss(card.float(), torch.as_tensor([len(t["labels"]) for t in targets], dtype=torch.float))
        src = outputs["pred_boxes"][idx]
        tb = torch.cat([t["boxes"][i] for t, (_, i) in zip(targets, indices)], dim=0)
        out["loss_bbox"] = F.l1_loss(src, tb, reduction="none").sum() / num_boxes
        giou = torch.diag(generalized_box_iou(box_convert(src, "cxcywh", "xyxy"), box_convert(tb, "cxcywh", "xyxy")))
        out["loss_giou"] = (1 - giou).sum() / num_boxes
        return out

    def forward(self, outputs, targets):
        main = {k: v for k, v in outputs.items() if k not in ("aux_outputs", "enc_outputs")}
        num_boxes = max(float(sum(len(t["labels"]) for t in targets)), 1.0)
        losses = dict(self._terms(main, targets, self.matcher(main, targets), num_boxes))
        for i, aux in enumerate(outputs.get("aux_outputs", [])):
            terms = self._terms(aux, targets, self.matcher(aux, targets), num_boxes, log=False)
            losses.update({f"{k}_{i}": v for k, v in terms.items()})
        if "enc_outputs" in outputs:
            bin_targets = [{**t, "labels": torch.zeros_like(t["labels"])} for t in targets]
            enc = outputs["enc_outputs"]
            terms = self._terms(enc, bin_targets, self.matcher(enc, bin_targets), num_boxes, log=False)
            losses.update({f"{k}_enc": v for k, v in terms.items()})
        return losses


@torch.no_grad()
def original_postprocess(outputs: dict, target_sizes: Tensor) -> list[dict]:
    """The original PostProcess: sigmoid, top-100 over queries x classes, xyxy boxes in pixels."""
    logits, boxes = outputs["pred_logits"], outputs["pred_boxes"]
    prob = logits.sigmoid()
    values, indexes = torch.topk(prob.view(logits.shape[0], -1), 100, dim=1)
    topk_boxes = indexes // logits.shape[2]
    labels = indexes % logits.shape[2]
    xyxy = torch.gather(box_convert(boxes, "cxcywh", "xyxy"), 1, topk_boxes.unsqueeze(-1).repeat(1, 1, 4))
    img_h, img_w = target_sizes.unbind(1)
    xyxy = xyxy * torch.stack([img_w, img_h, img_w, img_h], dim=1)[:, None, :]
    return [{"scores": s, "labels": l, "boxes": b} for s, l, b in zip(values, labels, xyxy)]
