"""Every parameter's gradient has the parameter's strides in the detectors that run channels-last (the CPU recipes'
rtdetr_tiny, dfine_tiny, dino_tiny): DDP copies each gradient into a bucket laid out in its parameter's strides, and
warned "Grad strides do not match bucket view strides ... may impair performance" in every run of the CPU recipes
when the maps reached a 1x1 convolution of contiguous weights channels-last."""
from __future__ import annotations

import pytest
import torch

import visiontf


@pytest.mark.parametrize("name", ["rtdetr_tiny", "dfine_tiny", "dino_tiny"])
def test_gradients_have_their_parameters_strides(name):
    torch.manual_seed(0)
    model = visiontf.create_model(name, num_classes=3).train()
    assert model.backbone.channels_last
    images, mask = torch.rand(2, 3, 64, 96), torch.zeros(2, 64, 96, dtype=torch.bool)
    targets = [{"labels": torch.tensor([1]), "boxes": torch.tensor([[0.5, 0.5, 0.2, 0.3]])}] * 2
    out = model(images, mask, targets=targets) if model.forward_takes_targets else model(images, mask)
    (out["pred_logits"].float().sum() + out["pred_boxes"].float().sum()).backward()
    differ = [(n, tuple(p.shape), p.stride(), p.grad.stride()) for n, p in model.named_parameters()
              if p.grad is not None and p.grad.stride() != p.stride()]
    assert not differ, differ
