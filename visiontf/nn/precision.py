"""The precision that locations, boxes and scores are computed in."""
from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["at_least_float32"]


def at_least_float32(x: Tensor) -> Tensor:
    """float32 for half-precision and float32 inputs, float64 kept.

    Sampling locations, boxes, sine embeddings of boxes and proposal scores never run in half
    precision (a bf16 location moves a sample by up to a quarter pixel on a 100-pixel map), and a
    float64 model stays float64 throughout: gradcheck, and the parity check against DINO's own code
    (``tests/models/deformable_detr/test_dino_checkpoints.py``, on outputs ``scripts/fixtures/make_dino.py`` recorded), which compares in float64 to resolve near-tied proposal scores.
    """
    return x if x.dtype == torch.float64 else x.float()
