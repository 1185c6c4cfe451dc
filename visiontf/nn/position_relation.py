"""Relation-DETR's position relation: a per-head self-attention bias from the geometry of box pairs.

Hou et al., "Relation DETR: Exploring Explicit Position Relation Prior for Object Detection"
(ECCV 2024; xiuqhou/Relation-DETR, ``models/bricks/relation_transformer.py``). A decoder's query
self-attention sees only features and position embeddings; which two queries sit on the same object
it has to learn. The relation encodes each pair's boxes (normalised centre distance and log size
ratio, as in the Relation Networks of Hu et al., 2018), and a learned projection turns it into a
non-negative bias on the attention logits of each head, so that overlapping queries can attend
to each other (and learn to suppress one another) from the first steps.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from visiontf.nn.pos_embed import sine_embedding

__all__ = ["PositionRelationEmbedding", "box_relation"]


def box_relation(src: Tensor, tgt: Tensor, eps: float = 1e-5) -> Tensor:
    """Pairwise geometry of cxcywh boxes: (B, N, 4), (B, M, 4) -> (B, N, M, 4).

    ``log(1 + |dx| / w_src)``, ``log(1 + |dy| / h_src)``, ``log(w_src / w_tgt)``, ``log(h_src / h_tgt)``
    (Relation-DETR's ``box_rel_encoding``): 0 for identical boxes, growing with distance and size ratio.
    """
    xy1, wh1 = src[..., :, None, :2], src[..., :, None, 2:]
    xy2, wh2 = tgt[..., None, :, :2], tgt[..., None, :, 2:]
    distance = torch.log((xy1 - xy2).abs() / (wh1 + eps) + 1.0)
    ratio = torch.log((wh1 + eps) / (wh2 + eps))
    return torch.cat([distance, ratio], -1)


class PositionRelationEmbedding(nn.Module):
    """(B, N, 4) and (B, M, 4) cxcywh boxes -> (B, heads, N, M) attention bias, ``relu(W sine(relation))``.

    ``num_feats`` sine features per relation coordinate at ``temperature`` and ``scale``
    (Relation-DETR: 16, 10000 and 100). The sine features are computed without gradient, so no
    gradient flows into the boxes; ``proj`` (Relation-DETR's 1x1 convolution) learns.
    """

    def __init__(self, num_heads: int, num_feats: int = 16, temperature: float = 10000.0, scale: float = 100.0) -> None:
        super().__init__()
        self.num_feats, self.temperature, self.scale = num_feats, temperature, scale
        self.proj = nn.Linear(4 * num_feats, num_heads)

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        with torch.no_grad():
            features = sine_embedding(box_relation(src.float(), tgt.float()), self.num_feats, self.temperature, self.scale)
        return F.relu(self.proj(features.to(self.proj.weight.dtype))).permute(0, 3, 1, 2)
