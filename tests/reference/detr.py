"""The ORIGINAL DETR design (facebookresearch/detr), re-implemented as a baseline for parity and speed.

The original repository cannot be imported here, so :class:`OriginalDETR` re-creates its
architecture and module tree: sequence-first tensors, ``nn.MultiheadAttention``,
``nn.Sequential(backbone, position_embedding)``, the original's elementwise
:class:`FrozenBatchNorm2d` and its parameter names, so its ``state_dict()`` has the published
checkpoints' key layout (458 keys for R50 with sine PE). ``tests/models/detr/test_detr_checkpoints.py`` uses
it for checkpoint parity, ``benchmarks/detr.py`` and ``benchmarks/memory.py`` as the speed and
memory baseline. The batch-wide matcher of the original is
:func:`benchmarks.matcher.reference_batchwide_match`; the set loss is visiontf's
``SetCriterion`` (the same maths as the original's), so the benchmarks compare the models and
the matchers, not two loss implementations.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
import torchvision
from torch import Tensor, nn
from torchvision.models._utils import IntermediateLayerGetter


class FrozenBatchNorm2d(nn.Module):
    """The original's frozen BatchNorm (``models/backbone.py``): its four buffers (weight, bias, running_mean,
    running_var; no counter) and eps 1e-5, applied as one affine map per channel, elementwise."""

    def __init__(self, n: int) -> None:
        super().__init__()
        for name, fill in (("weight", 1.0), ("bias", 0.0), ("running_mean", 0.0), ("running_var", 1.0)):
            self.register_buffer(name, torch.full((n,), fill))

    def _load_from_state_dict(self, state_dict, prefix, *args) -> None:
        state_dict.pop(prefix + "num_batches_tracked", None)  # torchvision's BatchNorm checkpoints carry one
        super()._load_from_state_dict(state_dict, prefix, *args)

    def forward(self, x: Tensor) -> Tensor:
        gain = self.weight * torch.rsqrt(self.running_var + 1e-5)
        shift = self.bias - self.running_mean * gain
        return x * gain[:, None, None] + shift[:, None, None]


class _Body(nn.Module):
    def __init__(self, name: str, dilation: bool) -> None:
        super().__init__()
        net = getattr(torchvision.models, name)(
            weights=None, replace_stride_with_dilation=[False, False, dilation], norm_layer=FrozenBatchNorm2d
        )
        # as the original's BackboneBase: stem and layer1 never train
        for pname, p in net.named_parameters():
            if not pname.startswith(("layer2", "layer3", "layer4")):
                p.requires_grad_(False)
        self.body = IntermediateLayerGetter(net, {"layer4": "0"})


class _SinePE(nn.Module):
    """Sine/cosine of each valid pixel's row and column rank, normalised to (0, 2 pi] per image (no -0.5 offset),
    over ``n`` frequencies ``10000 ** (2 (i // 2) / n)``: even channels sine, odd ones cosine; rows first."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n

    def forward(self, mask: Tensor) -> Tensor:
        valid = (~mask).float()
        index = torch.arange(self.n, device=mask.device)
        freq = 10000 ** (index.div(2, rounding_mode="floor") * 2 / self.n)
        even = index % 2 == 0
        parts = []
        for axis in (1, 2):
            rank = valid.cumsum(axis)
            total = rank.narrow(axis, rank.shape[axis] - 1, 1)
            angle = (rank / (total + 1e-6) * (2 * math.pi))[..., None] / freq
            parts.append(torch.where(even, angle.sin(), angle.cos()))
        return torch.cat(parts, dim=-1).permute(0, 3, 1, 2)


class _LearnedPE(nn.Module):
    """Two tables of 50 positions: the column's entry then the row's, per pixel."""

    def __init__(self, n: int) -> None:
        super().__init__()
        for table in ("row_embed", "col_embed"):
            setattr(self, table, nn.Embedding(50, n))

    def forward(self, mask: Tensor) -> Tensor:
        B, h, w = mask.shape
        cols = self.col_embed.weight[:w].t()[:, None, :].expand(-1, h, -1)
        rows = self.row_embed.weight[:h].t()[:, :, None].expand(-1, -1, w)
        return torch.cat((cols, rows))[None].expand(B, -1, -1, -1)


class _EncLayer(nn.Module):
    def __init__(self, d: int, h: int, ff: int) -> None:
        super().__init__()
        self.self_attn = nn.MultiheadAttention(d, h)
        self.linear1, self.linear2 = nn.Linear(d, ff), nn.Linear(ff, d)
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)

    def forward(self, src, pad, pos):
        q = src + pos
        src = self.norm1(src + self.self_attn(q, q, src, key_padding_mask=pad)[0])
        return self.norm2(src + self.linear2(F.relu(self.linear1(src))))


class _DecLayer(nn.Module):
    def __init__(self, d: int, h: int, ff: int) -> None:
        super().__init__()
        self.self_attn = nn.MultiheadAttention(d, h)
        self.multihead_attn = nn.MultiheadAttention(d, h)
        self.linear1, self.linear2 = nn.Linear(d, ff), nn.Linear(ff, d)
        self.norm1, self.norm2, self.norm3 = nn.LayerNorm(d), nn.LayerNorm(d), nn.LayerNorm(d)

    def forward(self, tgt, memory, pad, pos, qpos):
        q = tgt + qpos
        tgt = self.norm1(tgt + self.self_attn(q, q, tgt)[0])
        tgt = self.norm2(tgt + self.multihead_attn(tgt + qpos, memory + pos, memory, key_padding_mask=pad)[0])
        return self.norm3(tgt + self.linear2(F.relu(self.linear1(tgt))))


class _Stack(nn.Module):
    def __init__(self, layers, norm=None) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)
        if norm is not None:
            self.norm = norm


class _Transformer(nn.Module):
    def __init__(self, d: int, h: int, ne: int, nd: int, ff: int) -> None:
        super().__init__()
        self.encoder = _Stack([_EncLayer(d, h, ff) for _ in range(ne)])
        self.decoder = _Stack([_DecLayer(d, h, ff) for _ in range(nd)], nn.LayerNorm(d))


class OriginalDETR(nn.Module):
    """Sequence-first DETR with the original's module tree and maths (no dropout: benchmarks run it off).

    ``forward(images, mask)`` returns ``(logits, boxes)`` of every decoder layer, each
    (layers, B, Q, ·); :meth:`outputs` gives the original's ``{"pred_logits", "pred_boxes",
    "aux_outputs"}`` dict.
    """

    def __init__(self, num_classes=91, backbone="resnet50", dilation=False, d=256, h=8, ne=6, nd=6, ff=2048, nq=100, pe="sine"):
        super().__init__()
        channels = 512 if backbone in ("resnet18", "resnet34") else 2048
        self.backbone = nn.Sequential(_Body(backbone, dilation), _SinePE(d // 2) if pe == "sine" else _LearnedPE(d // 2))
        self.transformer = _Transformer(d, h, ne, nd, ff)
        self.class_embed = nn.Linear(d, num_classes + 1)
        self.bbox_embed = nn.Module()
        self.bbox_embed.layers = nn.ModuleList([nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, 4)])
        self.query_embed = nn.Embedding(nq, d)
        self.input_proj = nn.Conv2d(channels, d, 1)

    def forward(self, images: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        hs = self.transform(images, mask)["hs"]
        logits = self.class_embed(hs)
        x = hs
        for i, lin in enumerate(self.bbox_embed.layers):
            x = lin(x) if i == 2 else F.relu(lin(x))
        return logits, x.sigmoid()

    def transform(self, images: Tensor, mask: Tensor) -> dict:
        """Backbone and transformer: ``hs`` (layers, B, Q, d) normalised decoder outputs, ``memory``
        (B, d, h, w) as the original's Transformer returns it, ``src_proj`` (B, d, h, w), ``mask``
        (B, h, w) and ``features``: every map the body returns, in its order."""
        feats = list(self.backbone[0].body(images).values())
        feat = feats[-1]
        m = F.interpolate(mask[None].float(), size=feat.shape[-2:]).bool()[0]
        pos = self.backbone[1](m).flatten(2).permute(2, 0, 1)
        src_proj = self.input_proj(feat)
        src = src_proj.flatten(2).permute(2, 0, 1)
        pad = m.flatten(1)
        for layer in self.transformer.encoder.layers:
            src = layer(src, pad, pos)
        qpos = self.query_embed.weight[:, None].repeat(1, images.shape[0], 1)
        tgt, hs = torch.zeros_like(qpos), []
        for layer in self.transformer.decoder.layers:
            tgt = layer(tgt, src, pad, pos, qpos)
            hs.append(self.transformer.decoder.norm(tgt))
        hs = torch.stack(hs).transpose(1, 2)
        B, d, h, w = src_proj.shape
        memory = src.permute(1, 2, 0).view(B, d, h, w)
        return {"hs": hs, "memory": memory, "src_proj": src_proj, "mask": m, "features": feats}

    def outputs(self, images: Tensor, mask: Tensor) -> dict:
        """The original ``DETR.forward`` result with ``aux_loss`` on."""
        logits, boxes = self(images, mask)
        return {
            "pred_logits": logits[-1],
            "pred_boxes": boxes[-1],
            "aux_outputs": [{"pred_logits": a, "pred_boxes": b} for a, b in zip(logits[:-1], boxes[:-1])],
        }
