"""Cross-entropy over the labelled pixels that stays finite when a batch has none.

``F.cross_entropy(..., ignore_index=255)`` averages over the pixels that are not ignored; a batch in
which every pixel is ignored (a mask all 255, or a random crop that lands in an unlabelled region)
divides 0 by 0 and gives NaN, which stops training ("non-finite loss") although nothing is wrong.
:func:`labelled_cross_entropy` sums and divides by ``max(1, number of labelled pixels)``: the same
mean when there are labelled pixels, 0 (with a zero gradient) when there are none, and no
host-device synchronisation either way.
"""
from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor


def labelled_cross_entropy(logits: Tensor, target: Tensor, ignore_index: int = 255) -> tuple[Tensor, Tensor]:
    """Mean cross-entropy over labelled pixels, and the number of labelled pixels.

    ``logits`` (B, K, H, W), ``target`` (B, H, W) int64 with ``ignore_index`` on unlabelled pixels.
    Returns ``(loss, count)``: ``loss`` is 0 when ``count`` is 0.
    """
    count = (target != ignore_index).sum()
    total = F.cross_entropy(logits, target, ignore_index=ignore_index, reduction="sum")
    return total / count.clamp(min=1), count


__all__ = ["labelled_cross_entropy"]
