"""The backbones' stem max-pools run as maxima of shifted views in inference: equal to ``F.max_pool2d`` bit for bit."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import visiontf
from visiontf.models.backbones.fast_pool import ShiftedMaxPool, replace_max_pool


@pytest.mark.parametrize(("k", "s", "p", "ceil"), [(3, 2, 1, False), (2, 1, 0, True), (3, 1, 1, False), (2, 2, 0, False)])
@pytest.mark.parametrize("shape", [(2, 5, 17, 23), (1, 3, 8, 8), (1, 4, 2, 3)])
def test_equals_max_pool_bit_for_bit(k, s, p, ceil, shape):
    x = torch.relu(torch.randn(shape))  # ReLU's zeros: ties in many windows
    x[0, 0, 0, 0] = -5.0  # a negative corner: the padding must not win
    pool = ShiftedMaxPool(k, s, p).eval()
    assert torch.equal(pool(x), F.max_pool2d(x, k, s, p, ceil_mode=ceil))


def test_training_keeps_the_pool_and_its_gradient():
    x = torch.zeros(1, 1, 4, 4, requires_grad=True)  # every window a tie
    ShiftedMaxPool(2, 2).train()(x).sum().backward()
    ref = torch.zeros(1, 1, 4, 4, requires_grad=True)
    F.max_pool2d(ref, 2, 2).sum().backward()
    assert torch.equal(x.grad, ref.grad)  # one element per window, not a quarter each


def test_the_stems_use_it_and_other_pools_stay():
    assert isinstance(visiontf.create_model("rtdetr_tiny").backbone.body.maxpool, ShiftedMaxPool)
    holder = nn.Module()
    holder.pool = nn.MaxPool2d(3, 2, 1, ceil_mode=True)  # ceil mode at stride 2: another size, left alone
    assert not replace_max_pool(holder, "pool") and isinstance(holder.pool, nn.MaxPool2d)
