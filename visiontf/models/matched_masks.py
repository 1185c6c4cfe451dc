"""A mask head run on the matched queries alone while training.

DETR's mask head runs once per query (its convolutions see every query's own attention maps), and its
losses read the matched queries' masks only. A training forward therefore leaves the head's inputs in
``outputs["mask_logits_of"]`` instead of ``pred_masks``, and the set loss calls it with the matched
(image, query) pairs: the same loss and gradients (each query's mask depends on that query alone), at the
cost of the matched queries instead of all of them (about 4 of 20 on the CPU recipe).

Evaluation and inference forwards give ``pred_masks`` for every query, as the original does.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

import torch
from torch import Tensor

#: the output key of a training forward's :class:`MatchedMaskLogits`
MASK_LOGITS_OF = "mask_logits_of"


TrainMasks = Literal["matched", "all"]


def check_train_masks(train_masks: str) -> TrainMasks:
    """``train_masks`` of a mask model, refused by name when it is neither ``"matched"`` nor ``"all"``."""
    if train_masks not in ("matched", "all"):
        raise ValueError(f"train_masks must be 'matched' or 'all', got {train_masks!r}")
    return train_masks  # type: ignore[return-value]


def take_images(x: Tensor, batch: Tensor) -> Tensor:
    """``x[batch]`` in ``x``'s memory format: indexing gives a contiguous tensor, and a channels-last map (the
    memory's levels, a channels-last backbone's) would then run the head's convolutions in another layout
    than the full head's."""
    out = x[batch]
    if x.dim() == 4 and not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last):
        out = out.contiguous(memory_format=torch.channels_last)
    return out


class MatchedMaskLogits:
    """Mask logits of chosen queries, from one forward's mask-head inputs.

    Args:
        masks_from: the model's head, ``inputs -> (B, Q, h, w)`` logits of every query of ``inputs``.
        inputs: the head's inputs of the batch: tensors (or lists of tensors) with one row per image, ``None``
            for an absent one, and under ``per_query`` the entries with one row per (image, query), ``queries``
            (B, Q, C) among them.
        per_query: the keys of ``inputs`` indexed by (image, query).
    """

    def __init__(self, masks_from: Callable[[dict], Tensor], inputs: dict, per_query: Sequence[str] = ("queries",)) -> None:
        self._masks_from = masks_from
        self._inputs = inputs
        self._per_query = tuple(per_query)
        self.num_queries = int(inputs["queries"].shape[1])

    def __call__(self, batch: Tensor, queries: Tensor) -> Tensor:
        """(M, h, w) mask logits of queries ``queries[i]`` of images ``batch[i]``: each pair runs as a one-query
        image. With no pair, the head still runs on one (its parameters get zero gradients, so that DDP reduces
        them on every rank)."""
        if batch.numel() == 0:
            return self(batch.new_zeros(1), queries.new_zeros(1))[:0]
        device = self._inputs["queries"].device
        batch, queries = batch.to(device), queries.to(device)

        def pick(key: str, value):
            if value is None:
                return None
            if key in self._per_query:
                return value[batch, queries][:, None]
            if isinstance(value, (list, tuple)):
                return [take_images(v, batch) for v in value]
            return take_images(value, batch)

        return self._masks_from({k: pick(k, v) for k, v in self._inputs.items()})[:, 0]
