"""Fine-grained distribution refinement (D-FINE, Peng et al., ICLR 2025, sec. 3.2): box edges as distributions.

D-FINE's decoder predicts, for each of a box's four edges (left, top, right, bottom), a distribution over
``reg_max + 1`` bins instead of one offset. The bins sit at the values of a fixed, non-uniform *weighting function*
``W(n)``: dense near 0 (small corrections are fine-grained), sparse towards the ends (large ones are coarse). An
edge's offset is the distribution's expectation, ``sum_n softmax(logits)_n * W(n)`` (:func:`integral`), in units of
the reference box's size divided by ``reg_scale`` (:func:`distance_to_box`). Every decoder layer adds its logits to
the previous layer's, so the distributions are refined layer by layer around one reference (the first layer's box).

``W`` (:func:`weighting_function`), with ``a = up * reg_scale`` and ``c = (a + 1) ** (2 / (reg_max - 2))``::

    W = [-2a, 1 - c^(R/2-1), ..., 1 - c^1, 0, c^1 - 1, ..., c^(R/2-1) - 1, 2a]       (R = reg_max, R + 1 values)

so its inner values run from ``-a`` to ``a`` geometrically and its two outer bins catch everything beyond, at
``+-2a``. D-FINE's published models use ``reg_max`` 32, ``up`` 0.5 and ``reg_scale`` 4 (X: 8).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["distance_to_box", "integral", "weighting_function"]


def weighting_function(reg_max: int, up: Tensor, reg_scale: Tensor) -> Tensor:
    """The ``reg_max + 1`` bin values ``W(n)`` (see the module docstring), in the dtype of ``up`` / ``reg_scale``
    (1-element tensors: the model's fixed ``up`` and ``reg_scale`` parameters)."""
    if reg_max < 4 or reg_max % 2:
        raise ValueError(f"reg_max must be an even number >= 4, got {reg_max}")
    inner = up.reshape(-1)[:1].abs() * reg_scale.reshape(-1)[:1].abs()  # (1,): the largest inner value
    step = (inner + 1) ** (2 / (reg_max - 2))
    powers = [step ** i for i in range(1, reg_max // 2)]
    right = [p - 1 for p in powers]
    left = [1 - p for p in reversed(powers)]
    return torch.cat([-2 * inner, *left, torch.zeros_like(inner), *right, 2 * inner])


def integral(corners: Tensor, weights: Tensor) -> Tensor:
    """(..., 4 * (reg_max + 1)) edge logits -> (..., 4) edge offsets: each edge's softmax over the bins, dotted with
    ``weights`` (the ``reg_max + 1`` values of :func:`weighting_function`)."""
    bins = weights.shape[0]
    prob = F.softmax(corners.reshape(-1, bins), dim=1)
    return F.linear(prob, weights.to(prob)).reshape(*corners.shape[:-1], 4)


def distance_to_box(reference: Tensor, distance: Tensor, reg_scale: Tensor) -> Tensor:
    """Boxes (..., 4) cxcywh from a ``reference`` box (..., 4) cxcywh and four edge offsets ``distance`` (..., 4)
    (left, top, right, bottom): edge ``e`` lies ``(reg_scale / 2 + d_e) * size / reg_scale`` from the centre, so zero
    offsets give the reference itself."""
    scale = reg_scale.abs()
    cx, cy, w, h = reference.unbind(-1)
    half = 0.5 * scale
    x0 = cx - (half + distance[..., 0]) * (w / scale)
    y0 = cy - (half + distance[..., 1]) * (h / scale)
    x1 = cx + (half + distance[..., 2]) * (w / scale)
    y1 = cy + (half + distance[..., 3]) * (h / scale)
    return torch.stack([(x0 + x1) / 2, (y0 + y1) / 2, x1 - x0, y1 - y0], -1)
