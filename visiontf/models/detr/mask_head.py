"""DETR's mask head (Carion et al., 2020, section 4.4), with the parameter names of facebookresearch/detr's
``models/segmentation.py`` so that its panoptic checkpoints load unchanged and give its outputs.

Two modules:

* :class:`MHAttentionMap` scores every decoder query against every position of the encoder memory, per
  attention head, and returns the normalised scores themselves as maps (no values are read);
* :class:`MaskHeadSmallConv` stacks those maps (one channel per head) under each query's copy of the projected
  features and decodes them into one mask logit map per query: two 3x3 conv-GroupNorm-ReLU blocks at the
  coarse resolution, then three refinement steps that each upsample (nearest) to the next finer backbone map,
  add it through a 1x1 adapter and run another block, then a 3x3 convolution to one channel. For a ResNet the
  finer maps are layer3, layer2 and layer1 (strides 16, 8, 4).

Both are family-agnostic: DETR feeds them its single-scale memory and ResNet stages
(:mod:`visiontf.models.detr.detr_segm`), the Deformable/DINO family its multi-scale memory.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def repeat_per_query(x: Tensor, num_queries: int) -> Tensor:
    """(B, C, h, w) -> (B * Q, C, h, w): each image's map once for each of its Q queries, image-major.

    Only Q is a constant: the batch stays a traced size (ONNX export with a dynamic batch)."""
    keep = [-1] * (x.dim() - 1)
    return x.unsqueeze(1).expand(-1, int(num_queries), *keep).flatten(0, 1)


class MHAttentionMap(nn.Module):
    """Attention maps of each query over a 2D map, one per head: ``(B, Q, heads, h, w)``.

    Queries and keys go through their own linear projections (the keys at every position of the map); the
    dot product of a query's and a key's slice of one head, times ``1 / sqrt(hidden_dim / heads)``, is that
    head's score at that position. Padded positions score ``-inf``. The original's normalisation is one
    softmax per query over all its heads and positions together, so that a query's maps sum to 1.

    Args:
        query_dim: width of the queries and of the map's channels.
        hidden_dim: width of the projections, split evenly between the heads.
        num_heads: attention heads (maps per query).
        dropout: on the maps.
        bias: the projections have biases (the original's checkpoints do).
        peak_normalised: each head's map is its own softmax divided by its maximum (``exp(s - max s)``),
            so that every map peaks at 1 instead of summing to 1 with the other heads'. Not the
            original's: its maps are of order ``1 / (heads * h * w)`` beside features of order 1, so a
            head trained from scratch on a fresh detector hardly sees which query it draws and
            predicts the same mask for all (measured in ``docs/segmentation.md``).
    """

    def __init__(self, query_dim: int, hidden_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 peak_normalised: bool = False) -> None:
        super().__init__()
        if hidden_dim % num_heads:
            raise ValueError(f"MHAttentionMap: hidden_dim {hidden_dim} is not divisible by num_heads {num_heads}")
        self.num_heads = num_heads
        self.hidden_dim = hidden_dim
        self.peak_normalised = peak_normalised
        self.scale = (hidden_dim // num_heads) ** -0.5
        # the original's names and initialisation: Xavier-uniform matrices, zero biases
        self.q_linear = nn.Linear(query_dim, hidden_dim, bias=bias)
        self.k_linear = nn.Linear(query_dim, hidden_dim, bias=bias)
        self.dropout = nn.Dropout(dropout)
        for proj in (self.k_linear, self.q_linear):
            if proj.bias is not None:
                nn.init.zeros_(proj.bias)
        for proj in (self.k_linear, self.q_linear):
            nn.init.xavier_uniform_(proj.weight)

    def forward(self, q: Tensor, k: Tensor, mask: Tensor | None = None, bias: Tensor | None = None) -> Tensor:
        """q (B, Q, query_dim) queries, k (B, query_dim, h, w) map, mask (B, h, w) True on padding, bias (B, Q, h, w)
        added to every head's scores -> (B, Q, heads, h, w) maps."""
        # (B, Q, heads, d) and (B, h*w, heads, d): each head's slice of the projections (views of traced sizes, which
        # an ONNX export with dynamic axes keeps dynamic)
        queries = self.q_linear(q)
        queries = queries.view(*queries.shape[:-1], self.num_heads, -1) * self.scale
        keys = self.k_linear(k.flatten(2).transpose(1, 2))
        keys = keys.view(*keys.shape[:-1], self.num_heads, -1)
        scores = torch.einsum("bqnd,bpnd->bqnp", queries, keys)
        if bias is not None:
            scores = scores + bias.flatten(2).unsqueeze(2)
        if mask is not None:
            scores = scores.masked_fill(mask.flatten(1)[:, None, None, :], float("-inf"))
        if self.peak_normalised:
            maps = torch.exp(scores - scores.amax(dim=-1, keepdim=True))
        else:
            maps = scores.flatten(2).softmax(dim=-1).view_as(scores)
        return self.dropout(maps.view(*maps.shape[:-1], *k.shape[-2:]))


class MaskHeadSmallConv(nn.Module):
    """Mask logits of every query: ``(B * Q, 1, h_4, w_4)`` at the resolution of the finest FPN map.

    The widths narrow from ``dim`` through ``context_dim / 2, / 4, / 8, / 16``; the parameters keep the
    original's names: ``lay1``..``lay5`` with ``gn1``..``gn5`` (each block's convolution and GroupNorm of 8
    groups), ``out_lay``, and ``adapter1``..``adapter3`` (the 1x1 convolutions of the three FPN maps).

    Args:
        dim: channels of the input, the features plus one attention map per head (DETR: 256 + 8).
            GroupNorm's 8 groups need it (and ``context_dim / 16``) divisible by 8.
        fpn_dims: channels of the three FPN maps, coarsest first (ResNet-50 layer3, layer2, layer1:
            1024, 512, 256).
        context_dim: the transformer width.
    """

    def __init__(self, dim: int, fpn_dims: Sequence[int], context_dim: int) -> None:
        super().__init__()
        if len(fpn_dims) != 3:
            raise ValueError(f"MaskHeadSmallConv takes three FPN maps (coarsest first), got fpn_dims={list(fpn_dims)}")
        # block i maps widths[i - 1] -> widths[i]; the adapter of FPN level j gives block j + 2's input width
        widths = [dim, dim] + [context_dim // 2**i for i in range(1, 5)]
        bad = [c for c in widths if c % 8]
        if bad:
            raise ValueError(f"MaskHeadSmallConv: GroupNorm(8, c) needs channels divisible by 8, got {bad} from dim={dim}, "
                             f"context_dim={context_dim} (DETR: dim = hidden_dim + attention heads, e.g. 256 + 8)")
        for i in range(1, 6):
            self.add_module(f"lay{i}", nn.Conv2d(widths[i - 1], widths[i], 3, padding=1))
            self.add_module(f"gn{i}", nn.GroupNorm(8, widths[i]))
        self.out_lay = nn.Conv2d(widths[5], 1, 3, padding=1)
        for level, channels in enumerate(fpn_dims, start=1):
            self.add_module(f"adapter{level}", nn.Conv2d(channels, widths[level + 1], 1))
        # the original's initialisation of every convolution
        convs = [m for m in self.modules() if isinstance(m, nn.Conv2d)]
        for conv in convs:
            nn.init.kaiming_uniform_(conv.weight, a=1)
        for conv in convs:
            nn.init.zeros_(conv.bias)

    def _block(self, i: int, x: Tensor) -> Tensor:
        """Block ``i``: ``lay{i}``, ``gn{i}``, ReLU."""
        return F.relu(getattr(self, f"gn{i}")(getattr(self, f"lay{i}")(x)))

    def forward(self, x: Tensor, bbox_mask: Tensor, fpns: Sequence[Tensor]) -> Tensor:
        """x (B, C, h, w) features, bbox_mask (B, Q, heads, h, w) attention maps, fpns coarsest first
        (B or B*Q, C_i, h_i, w_i) -> (B * Q, 1, h_3, w_3) mask logits (the last FPN map's size)."""
        num_queries = bbox_mask.shape[1]
        y = torch.cat([repeat_per_query(x, num_queries), bbox_mask.flatten(0, 1)], dim=1)
        y = self._block(2, self._block(1, y))
        for level, fpn in enumerate(fpns, start=1):
            # each image's map is adapted once, then shared by its queries
            lateral = getattr(self, f"adapter{level}")(fpn)
            if lateral.shape[0] != y.shape[0]:
                lateral = repeat_per_query(lateral, y.shape[0] // lateral.shape[0])
            y = self._block(level + 2, lateral + F.interpolate(y, size=lateral.shape[-2:], mode="nearest"))
        return self.out_lay(y)
