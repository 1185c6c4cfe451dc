"""Which decoder queries may attend to which: Group DETR's groups and DINO's denoising groups.

The decoder's self-attention input is the denoising queries (DINO's contrastive denoising, in
groups of ``dn_group_size``) followed by the matching queries (Group DETR: ``num_groups`` groups
of equal size, the first the inference set). Without denoising the decoder folds the matching
groups into the batch instead, and needs no mask.
"""
from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["self_attn_mask"]


def self_attn_mask(num_denoising_queries: int, dn_group_size: int, num_matching: int, num_groups: int, device=None) -> Tensor:
    """Bool (N, N) decoder self-attention mask, True = may attend, N = denoising + matching queries.

    Each denoising group sees itself and the matching queries; matching queries see only their
    own Group DETR group, never a denoising query (they would read the answer; DINO's mask).
    """
    P = num_denoising_queries
    dn_group = torch.arange(P, device=device) // max(dn_group_size, 1)
    # the denoising groups' count from the sizes, not from dn_group (reading a CUDA tensor waits for the GPU)
    dn_groups = (P - 1) // max(dn_group_size, 1) + 1 if P else 0
    match_group = torch.arange(num_matching, device=device) // (num_matching // num_groups) + dn_groups
    group = torch.cat([dn_group, match_group])
    allowed = group[:, None] == group[None, :]
    allowed[:P, P:] = True
    return allowed
