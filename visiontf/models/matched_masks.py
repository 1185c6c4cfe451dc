"""A mask head run on the matched queries alone while training.

DETR's mask head runs once per query (its convolutions see every query's own attention maps), and its
losses read the matched queries' masks only. A training forward therefore leaves the head's inputs in
``outputs["mask_logits_of"]`` instead of ``pred_masks``, and the set loss calls it with the matched
(image, query) pairs: the same loss and gradients (each query's mask depends on that query alone), at the
cost of the matched queries instead of all of them (about 4 of 20 on the CPU recipe).

Evaluation and inference forwards give ``pred_masks`` for every query, as the original does.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

#: the output key of a training forward's :class:`MatchedMaskLogits`
MASK_LOGITS_OF = "mask_logits_of"


def take_images(x: Tensor, batch: Tensor) -> Tensor:
    """``x[batch]`` in ``x``'s memory format: indexing gives a contiguous tensor, and a channels-last map
    (the memory's levels, a channels-last backbone's) would then run the head's convolutions in another layout
    than the full head's, and give DDP gradients of other strides than its buckets'."""
    out = x[batch]
    if x.dim() == 4 and not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last):
        out = out.contiguous(memory_format=torch.channels_last)
    return out


class MatchedMaskLogits:
    """Mask logits of chosen queries, from one forward's mask-head inputs.

    Args:
        run: ``(batch, queries) -> (M, h, w)`` logits of the M (image, query) pairs given as two
            index tensors of length M.
        num_queries: the queries per image a full ``pred_masks`` would hold.
    """

    def __init__(self, run: Callable[[Tensor, Tensor], Tensor], num_queries: int) -> None:
        self._run = run
        self.num_queries = int(num_queries)

    def __call__(self, batch: Tensor, queries: Tensor) -> Tensor:
        """(M, h, w) mask logits of queries ``queries[i]`` of images ``batch[i]``. With no pair, the head
        still runs on one (its parameters get zero gradients, so that DDP reduces them on every rank)."""
        if batch.numel() == 0:
            return self._run(batch.new_zeros(1), queries.new_zeros(1))[:0]
        return self._run(batch, queries)
