"""DETR's mask head (Carion et al., 2020, section 4.4; facebookresearch/detr ``models/segmentation.py``).

Two modules, with the original's parameter names, initialisation and arithmetic, so its panoptic
checkpoints load unchanged and give its outputs:

* :class:`MHAttentionMap`: for every decoder query, a multi-head attention map over the encoder
  memory (the softmax only; nothing is multiplied by values);
* :class:`MaskHeadSmallConv`: a small FPN-like convolutional head that turns the projected backbone
  features stacked with a query's attention maps into that query's mask logits, upsampling through
  three finer backbone maps (stride 32 -> 16 -> 8 -> 4 for a ResNet's layer3, layer2, layer1).

Both are family-agnostic: DETR feeds them its single-scale memory and ResNet stages
(:mod:`visiontf.models.detr.segm`), the Deformable/DINO family its multi-scale memory.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def repeat_per_query(x: Tensor, num_queries: int) -> Tensor:
    """(B, C, h, w) -> (B * Q, C, h, w): each image's map repeated for each of its Q queries (image-major)."""
    return x.unsqueeze(1).repeat(1, int(num_queries), 1, 1, 1).flatten(0, 1)


class MHAttentionMap(nn.Module):
    """Attention weights of each query over a 2D map, per head: ``(B, Q, heads, h, w)``.

    The key projection is applied as a 1x1 convolution on the (B, C, h, w) map; the scores are
    scaled by ``head_dim ** -0.5``, padded positions get ``-inf``, and (the original's) one softmax
    runs over every head and position of a query's maps together.

    Args:
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
        self.peak_normalised = peak_normalised
        self.num_heads = num_heads
        self.hidden_dim = hidden_dim
        self.dropout = nn.Dropout(dropout)
        self.q_linear = nn.Linear(query_dim, hidden_dim, bias=bias)
        self.k_linear = nn.Linear(query_dim, hidden_dim, bias=bias)
        nn.init.zeros_(self.k_linear.bias)
        nn.init.zeros_(self.q_linear.bias)
        nn.init.xavier_uniform_(self.k_linear.weight)
        nn.init.xavier_uniform_(self.q_linear.weight)
        self.normalize_fact = float(hidden_dim / num_heads) ** -0.5

    def forward(self, q: Tensor, k: Tensor, mask: Tensor | None = None, bias: Tensor | None = None) -> Tensor:
        """q (B, Q, query_dim), k (B, query_dim, h, w), mask (B, h, w) True on padding, bias (B, Q, h, w)
        added to every head's scores -> (B, Q, heads, h, w)."""
        heads, head_dim = self.num_heads, self.hidden_dim // self.num_heads
        q = self.q_linear(q)
        k = F.conv2d(k, self.k_linear.weight[:, :, None, None], self.k_linear.bias)
        qh = q.view(q.shape[0], q.shape[1], heads, head_dim)
        kh = k.view(k.shape[0], heads, head_dim, k.shape[-2], k.shape[-1])
        weights = torch.einsum("bqnc,bnchw->bqnhw", qh * self.normalize_fact, kh)
        if bias is not None:
            weights = weights + bias[:, :, None]
        if mask is not None:
            weights = weights.masked_fill(mask[:, None, None], float("-inf"))
        if self.peak_normalised:
            return self.dropout((weights - weights.flatten(3).amax(-1)[..., None, None]).exp())
        weights = F.softmax(weights.flatten(2), dim=-1).view(weights.size())
        return self.dropout(weights)


class MaskHeadSmallConv(nn.Module):
    """Mask logits of every query: ``(B * Q, 1, h_4, w_4)`` at the resolution of the finest FPN map.

    Args:
        dim: channels of the input, the features plus one attention map per head (DETR: 256 + 8).
            GroupNorm's 8 groups need it (and ``context_dim / 16``) divisible by 8.
        fpn_dims: channels of the three FPN maps, coarsest first (ResNet-50 layer3, layer2, layer1:
            1024, 512, 256).
        context_dim: the transformer width; the head narrows to ``context_dim / 2, / 4, / 8, / 16``.
    """

    def __init__(self, dim: int, fpn_dims: Sequence[int], context_dim: int) -> None:
        super().__init__()
        if len(fpn_dims) != 3:
            raise ValueError(f"MaskHeadSmallConv takes three FPN maps (coarsest first), got fpn_dims={list(fpn_dims)}")
        inter = [dim, context_dim // 2, context_dim // 4, context_dim // 8, context_dim // 16]
        bad = [c for c in inter if c % 8]
        if bad:
            raise ValueError(f"MaskHeadSmallConv: GroupNorm(8, c) needs channels divisible by 8, got {bad} from dim={dim}, "
                             f"context_dim={context_dim} (DETR: dim = hidden_dim + attention heads, e.g. 256 + 8)")
        self.lay1 = nn.Conv2d(dim, dim, 3, padding=1)
        self.gn1 = nn.GroupNorm(8, dim)
        self.lay2 = nn.Conv2d(dim, inter[1], 3, padding=1)
        self.gn2 = nn.GroupNorm(8, inter[1])
        self.lay3 = nn.Conv2d(inter[1], inter[2], 3, padding=1)
        self.gn3 = nn.GroupNorm(8, inter[2])
        self.lay4 = nn.Conv2d(inter[2], inter[3], 3, padding=1)
        self.gn4 = nn.GroupNorm(8, inter[3])
        self.lay5 = nn.Conv2d(inter[3], inter[4], 3, padding=1)
        self.gn5 = nn.GroupNorm(8, inter[4])
        self.out_lay = nn.Conv2d(inter[4], 1, 3, padding=1)
        self.dim = dim
        self.adapter1 = nn.Conv2d(fpn_dims[0], inter[1], 1)
        self.adapter2 = nn.Conv2d(fpn_dims[1], inter[2], 1)
        self.adapter3 = nn.Conv2d(fpn_dims[2], inter[3], 1)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_uniform_(m.weight, a=1)
                nn.init.constant_(m.bias, 0)

    def forward(self, x: Tensor, bbox_mask: Tensor, fpns: Sequence[Tensor]) -> Tensor:
        """x (B, C, h, w) features, bbox_mask (B, Q, heads, h, w) attention maps, fpns coarsest first
        (B or B*Q, C_i, h_i, w_i) -> (B * Q, 1, h_3, w_3) mask logits (the last FPN map's size)."""
        x = torch.cat([repeat_per_query(x, bbox_mask.shape[1]), bbox_mask.flatten(0, 1)], 1)
        x = F.relu(self.gn1(self.lay1(x)))
        x = F.relu(self.gn2(self.lay2(x)))
        for adapter, lay, gn, fpn in ((self.adapter1, self.lay3, self.gn3, fpns[0]), (self.adapter2, self.lay4, self.gn4, fpns[1]),
                                      (self.adapter3, self.lay5, self.gn5, fpns[2])):
            # the adapter runs once per image, before its map is repeated for the queries
            cur = adapter(fpn)
            if cur.shape[0] != x.shape[0]:
                cur = repeat_per_query(cur, x.shape[0] // cur.shape[0])
            x = cur + F.interpolate(x, size=cur.shape[-2:], mode="nearest")
            x = F.relu(gn(lay(x)))
        return self.out_lay(x)
