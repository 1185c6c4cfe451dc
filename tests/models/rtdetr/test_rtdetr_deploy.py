"""The inference form of the real-time DETRs (``visiontf.models.rtdetr.deploy.fuse_for_inference``): BatchNorms folded
into the convolutions (ordinary and frozen, backbone, encoder, decoder projections), RepVGG blocks re-parameterised.
The fused model's outputs equal the unfused model's (1e-5 float32, 1e-10 float64) for every backbone and encoder kind;
fusing twice changes nothing; a fused model refuses a forward in training mode; the ONNX export runs a fused copy and
leaves the caller's model as it was (and keeps the stem's max-pool one MaxPool node)."""
from __future__ import annotations

import copy

import pytest
import torch
from rtdetr_helpers import one_thread  # noqa: F401 (a module fixture: one torch thread)
from torch import nn

import visiontf
from visiontf.models._registry import get_entry
from visiontf.models.rtdetr.deploy import fuse_for_inference, is_fused
from visiontf.models.rtdetr.hybrid_encoder import RepVggBlock
from visiontf.nn.fold_bn import fold_batchnorms, fold_conv_bn

#: one per backbone and encoder kind: ResNet-vd with trained BatchNorm (R18) and frozen (R50), HGNetv2 with trained
#: BatchNorm and the affine blocks (D-FINE-N on 2 levels, S) and frozen (L); CSPRep and CSP-ELAN fusion blocks; the CPU
#: configs' channels-last backbones (rtdetr_tiny, dfine_tiny) and DEIM's SiLU decoder
FAMILIES = ["rtdetrv2_r18vd", "rtdetr_r50vd", "dfine_n", "dfine_s", "dfine_l", "rtdetr_tiny", "dfine_tiny", "deim_dfine_n"]


def _model(name: str, dtype: torch.dtype = torch.float32) -> nn.Module:
    """The variant at its registry test settings, 10 queries, with BatchNorm statistics and affine parameters away from
    their initial values (so that every fold has something to fold)."""
    entry = get_entry(name)
    kwargs = dict(entry.test_kwargs)
    kwargs["decoder"] = {**kwargs["decoder"], "num_queries": 10}
    torch.manual_seed(0)
    model = visiontf.create_model(name, num_classes=3, **kwargs).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for m in model.modules():
            if hasattr(m, "running_var") and m.running_var is not None:
                m.running_var.copy_(0.5 + torch.rand(m.running_var.shape, generator=g))
                m.running_mean.copy_(0.1 * torch.randn(m.running_mean.shape, generator=g))
                m.weight.copy_(1 + 0.2 * torch.randn(m.weight.shape, generator=g))
                m.bias.copy_(0.1 * torch.randn(m.bias.shape, generator=g))
    return model.to(dtype)


def _inputs(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(2)
    images = torch.randn(2, 3, 64, 96, generator=g).to(dtype)
    mask = torch.zeros(2, 64, 96, dtype=torch.bool)
    mask[1, 40:, :] = True  # the second image is padded
    return images, mask


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("dtype, atol", [(torch.float32, 1e-5), (torch.float64, 1e-10)])
def test_fused_model_equals_the_unfused_one(name, dtype, atol):
    model = _model(name, dtype)
    images, mask = _inputs(dtype)
    fused = copy.deepcopy(model)
    counts = fuse_for_inference(fused)
    assert counts["backbone"] > 0 and counts["encoder"] > 0
    assert not any(isinstance(m, nn.BatchNorm2d) or "BatchNorm" in type(m).__name__ for m in fused.modules())
    assert not any(k.endswith("running_var") for k in fused.state_dict())
    with torch.no_grad():
        ref, got = model(images, mask), fused(images, mask)
    for key in ("pred_logits", "pred_boxes"):
        assert got[key].dtype == dtype
        assert (got[key] - ref[key]).abs().max() <= atol, (key, float((got[key] - ref[key]).abs().max()))


def test_fusing_twice_changes_nothing_and_training_is_refused():
    model = _model("dfine_s")
    images, mask = _inputs(torch.float32)
    assert not is_fused(model)
    first = fuse_for_inference(model)
    with torch.no_grad():
        once = model(images, mask)
    assert is_fused(model) and sum(first.values()) > 0
    assert model.fuse_for_inference() == {"backbone": 0, "encoder": 0, "decoder": 0}  # the method is the function
    with torch.no_grad():
        twice = model(images, mask)
    assert torch.equal(once["pred_logits"], twice["pred_logits"]) and torch.equal(once["pred_boxes"], twice["pred_boxes"])
    model.train()
    with pytest.raises(RuntimeError, match="fused for inference"):
        model(images, mask)
    model.eval()
    with torch.no_grad():
        assert torch.equal(model(images, mask)["pred_logits"], once["pred_logits"])


def test_fold_conv_bn_keeps_geometry_and_memory_format():
    conv = nn.Conv2d(4, 6, 3, stride=2, padding=1, groups=2, bias=True).to(memory_format=torch.channels_last)
    bn = nn.BatchNorm2d(6).eval()
    with torch.no_grad():
        bn.running_var.uniform_(0.5, 1.5)
        bn.running_mean.normal_()
        bn.weight.normal_()
    x = torch.randn(1, 4, 9, 9).contiguous(memory_format=torch.channels_last)
    fused = fold_conv_bn(conv, bn)
    assert (fused.stride, fused.padding, fused.groups) == ((2, 2), (1, 1), 2)
    assert fused.weight.is_contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        assert (fused(x) - bn(conv(x))).abs().max() < 1e-5
    # a BatchNorm in a Sequential after something other than a convolution is left alone
    seq = nn.Sequential(nn.ReLU(), nn.BatchNorm2d(4)).eval()
    assert fold_batchnorms(seq) == 0 and isinstance(seq[1], nn.BatchNorm2d)


@pytest.mark.slow  # two exports; the fast tier exports rtdetr_tiny fused in test_realtime_export_dynamic
def test_onnx_export_runs_a_fused_copy(tmp_path):
    onnx = pytest.importorskip("onnx")
    from visiontf.inference.export import example_inputs, export_onnx
    from visiontf.inference.onnx_check import check_onnx

    model = _model("rtdetrv2_r18vd")
    path = export_onnx(model, tmp_path / "m.onnx", image_size=(64, 64))
    assert not is_fused(model) and any(isinstance(m, nn.BatchNorm2d) for m in model.modules())  # the caller's model is as it was
    plain = export_onnx(model, tmp_path / "plain.onnx", image_size=(64, 64), fuse=False)

    def convs(p):
        return sum(n.op_type == "Conv" for n in onnx.load(str(p)).graph.node)

    # the exporter folds BatchNorms itself; the fused graph also has one convolution per RepVGG block instead of two
    repvgg = sum(isinstance(m, RepVggBlock) for m in model.modules())
    assert repvgg > 0 and convs(path) == convs(plain) - repvgg
    assert "MaxPool" in {n.op_type for n in onnx.load(str(path)).graph.node}  # the stem's pool stays one node in a graph
    report = check_onnx(model, path, example_inputs(model, image_size=(64, 64), batch_size=2, pad=True))
    assert report["onnx_max_abs_diff"] < 1e-4
