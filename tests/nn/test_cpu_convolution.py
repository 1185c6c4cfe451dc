"""Inference on the CPU: the real-time detectors' backbones run channels-last, and their convolutions are oneDNN's
whatever the shape and thread count; the same values up to float32 rounding. Training keeps PyTorch's own path."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import visiontf
from visiontf.models.backbones.frozen_bn import ConvFrozenBN2d
from visiontf.models.rtdetr.deploy import fuse_for_inference
from visiontf.nn.cpu_convolution import OneDNNConv2d, use_onednn_convolutions


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


@pytest.fixture
def onednn_calls(monkeypatch):
    """How many times ``torch.mkldnn_convolution`` was called."""
    calls = []
    call = torch.mkldnn_convolution
    monkeypatch.setattr(torch, "mkldnn_convolution", lambda *a: calls.append(1) or call(*a))
    return calls


#: (in, out, kernel, stride, padding, dilation, groups): the 1 x 1 case PyTorch gives to BLAS with one thread, strided,
#: depthwise (HGNetv2's light blocks), dilated and grouped ones
GEOMETRIES = [(16, 24, 1, 1, 0, 1, 1), (16, 24, 3, 2, 1, 1, 1), (16, 16, 3, 1, 1, 1, 16), (8, 8, 3, 1, 2, 2, 1), (8, 12, 5, 1, 2, 1, 2)]


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("geometry", GEOMETRIES)
def test_inference_is_onednns_convolution_with_pytorchs_values(geometry, batch, channels_last, onednn_calls):
    cin, cout, k, stride, padding, dilation, groups = geometry
    torch.manual_seed(0)
    conv = nn.Conv2d(cin, cout, k, stride, padding, dilation, groups)
    x = torch.randn(batch, cin, 13, 17)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    expected = F.conv2d(x, conv.weight, conv.bias, stride, padding, dilation, groups)
    assert use_onednn_convolutions(conv) == 1 and type(conv) is OneDNNConv2d
    with torch.inference_mode():
        got = conv(x)
    assert onednn_calls == [1]
    torch.testing.assert_close(got, expected.detach(), rtol=1e-5, atol=1e-5)


def test_training_other_dtypes_and_autocast_take_pytorchs_path(onednn_calls):
    torch.manual_seed(0)
    plain = nn.Conv2d(8, 8, 1)
    conv = nn.Conv2d(8, 8, 1)
    conv.load_state_dict(plain.state_dict())
    use_onednn_convolutions(conv)
    x = torch.randn(2, 8, 5, 5)
    conv(x).square().sum().backward()  # gradients on
    plain(x).square().sum().backward()
    assert torch.equal(conv.weight.grad, plain.weight.grad)
    with torch.no_grad():
        assert conv.double()(x.double()).dtype == torch.float64
        conv.float()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert conv(x).dtype == torch.bfloat16
    assert onednn_calls == []


def test_only_plain_convolutions_change_and_the_state_dict_stays():
    class OwnConv(nn.Conv2d):  # a subclass with its own forward: left alone
        pass

    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ConvTranspose2d(4, 4, 2), OwnConv(4, 4, 1), nn.Sequential(nn.Conv2d(4, 2, 1)))
    keys = list(model.state_dict())
    assert use_onednn_convolutions(model) == 2
    assert [type(m).__name__ for m in model.modules() if isinstance(m, nn.modules.conv._ConvNd)] == \
        ["OneDNNConv2d", "ConvTranspose2d", "OwnConv", "OneDNNConv2d"]
    assert list(model.state_dict()) == keys
    assert use_onednn_convolutions(model) == 0


@pytest.mark.parametrize("name", ["rtdetr_tiny", "dfine_tiny", "rtdetr_r18vd", "dfine_n"])
def test_the_real_time_detectors_convolutions_are_onednns_before_and_after_fusing(name):
    with torch.device("meta"):
        model = visiontf.create_model(name, num_classes=3).eval()
    kinds = {type(m) for m in model.modules() if isinstance(m, nn.Conv2d)}
    assert kinds <= {OneDNNConv2d, ConvFrozenBN2d} and OneDNNConv2d in kinds
    if name.endswith("tiny"):
        model = visiontf.create_model(name, num_classes=3).eval()
        fuse_for_inference(model)
        assert {type(m) for m in model.modules() if isinstance(m, nn.Conv2d)} == {OneDNNConv2d}
