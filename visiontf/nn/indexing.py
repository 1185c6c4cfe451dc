"""Picking rows of batched sequences by position: the top-k step of query selection and post-processing."""
from __future__ import annotations

from torch import Tensor

__all__ = ["gather_rows"]


def gather_rows(t: Tensor, index: Tensor) -> Tensor:
    """(B, K, C) the rows of (B, S, C) ``t`` at the (B, K) positions ``index`` of each batch element.

    A gather, so gradients reach the rows picked and an exported graph keeps ``index`` as an input of its own
    (an Unsqueeze and an Expand before a GatherElements), whatever K is at run time.
    """
    return t.gather(1, index.unsqueeze(-1).expand(-1, -1, t.shape[-1]))
