"""The real-time detectors' backbones run channels-last in inference on the CPU (faster oneDNN convolutions), the same
maps up to float32 rounding; training keeps the layout they were built with."""
from __future__ import annotations

import pytest
import torch

import visiontf


def _backbone(name: str):
    """The narrow ResNet-vd of rtdetr_tiny and HGNetv2 of dfine_tiny (BatchNorms trained), built in the default layout."""
    torch.manual_seed(0)
    return visiontf.create_model({"resnet_vd": "rtdetr_tiny", "hgnetv2": "dfine_tiny"}[name], backbone={"channels_last": False}).backbone


@pytest.mark.parametrize("name", ["resnet_vd", "hgnetv2"])
def test_inference_runs_channels_last_with_the_same_maps(name):
    backbone = _backbone(name)
    images = torch.randn(2, 3, 64, 96)
    backbone.train()
    trained = backbone.forward_maps(images)  # gradients on: the layout as built
    assert all(m.is_contiguous() for m in trained)
    backbone.eval()
    with torch.enable_grad():
        reference = backbone.forward_maps(images)
    assert all(m.is_contiguous() for m in reference)
    with torch.inference_mode():
        fast = backbone.forward_maps(images)
    assert all(m.is_contiguous(memory_format=torch.channels_last) and not m.is_contiguous() for m in fast)
    for got, expected in zip(fast, reference):
        torch.testing.assert_close(got, expected.detach(), rtol=1e-5, atol=1e-5)
