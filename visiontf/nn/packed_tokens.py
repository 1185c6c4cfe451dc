"""The unpadded tokens of a batch of flattened feature maps, packed into rows (deformable attention's encoder)."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["PackedTokens"]


@dataclass(frozen=True)
class PackedTokens:
    """The unpadded positions of a (N, S) batch of flattened maps, packed into T rows.

    Deformable DETR's encoder output at padded positions is never used (those values are zeroed
    wherever they are read), so its per-token work (projections, FFN, attention queries) can skip
    them: :class:`~visiontf.models.deformable_detr.deformable_transformer.DeformableTransformerEncoder` packs the
    tokens with this and the attention reads packed queries and values.

    Attributes:
        index: (T,) flat position ``n * S + s`` of each packed token, increasing.
        image: (T,) its image n; ``position``: (T,) its position s.
        padding_mask: (N, S) the mask it was made from (True on padding).
    """

    index: Tensor
    image: Tensor
    position: Tensor
    padding_mask: Tensor

    @classmethod
    def from_mask(cls, padding_mask: Tensor) -> PackedTokens:
        N, S = padding_mask.shape
        index = (~padding_mask).flatten().nonzero().squeeze(1)
        return cls(index, torch.div(index, S, rounding_mode="floor"), index % S, padding_mask)

    def pack(self, x: Tensor) -> Tensor:
        """(N, S, ...) -> (T, ...)."""
        return x.flatten(0, 1).index_select(0, self.index)

    def unpack(self, x: Tensor) -> Tensor:
        """(T, ...) -> (N, S, ...) with zeros at padded positions."""
        N, S = self.padding_mask.shape
        # index_put, not index_copy: the same rows, without index_copy's row-by-row copy on CPU
        return x.new_zeros((N * S, *x.shape[1:])).index_put((self.index,), x).view(N, S, *x.shape[1:])
