"""Every kind of backbone in every detector family: forward, two training steps and an ONNX export that
gives PyTorch's outputs. Tiny random models (``pretrained=False`` timm models, 2-block ViTs) at 64 x 96 px."""
from __future__ import annotations

import pytest
import torch

import visiontf
from visiontf.inference.export import example_inputs, export_onnx
from visiontf.inference.onnx_check import DEFAULT_TOLERANCE, onnx_and_torch_outputs
from visiontf.models.backbones.registry import backbone_examples, find_backbone, list_backbones
from visiontf.set_prediction import build_criterion

#: one row per example of every registered backbone kind (register_backbone's ``examples``: a torchvision ResNet,
#: timm's CNN, Swin (NHWC) and ViT, visiontf's ViT, the simple feature pyramid on visiontf's ViT (windows) and on
#: timm's DINOv2 (patch 14), DINO's Swin layout, RT-DETR's ResNet-vd, D-FINE's HGNetv2): a new kind joins by registering
BACKBONES = backbone_examples()
#: the families' CPU-sized models, a little smaller still
ARCH = dict(hidden_dim=32, nheads=2, enc_layers=1, dec_layers=1, dim_feedforward=64, num_queries=8)
FAMILIES = {"detr_tiny": dict(arch=ARCH), "deformable_detr_tiny": dict(arch=ARCH), "dino_tiny": dict(arch=ARCH, dino=dict(num_denoising=4))}
SIZE = (64, 96)


def _model(family: str, backbone: str) -> torch.nn.Module:
    kwargs = dict(FAMILIES[family], backbone=dict(name=backbone, kwargs=BACKBONES[backbone], frozen_bn=False))
    if backbone.startswith("simplefpn:") and family != "detr_tiny":
        kwargs["arch"] = dict(ARCH, num_feature_levels=4)  # the pyramid's four maps
    torch.manual_seed(0)
    return visiontf.create_model(family, num_classes=3, **kwargs)


def _targets() -> list[dict]:
    return [{"labels": torch.tensor([0, 2]), "boxes": torch.tensor([[0.3, 0.4, 0.2, 0.3], [0.7, 0.5, 0.3, 0.4]])},
            {"labels": torch.tensor([1]), "boxes": torch.tensor([[0.5, 0.5, 0.4, 0.4]])}]


@pytest.mark.slow  # 30 tiny models, each trained 2 steps and exported
@pytest.mark.parametrize("backbone", sorted(BACKBONES))
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_backbone_in_family_trains_and_exports(family, backbone, tmp_path):
    model = _model(family, backbone).train()
    criterion = build_criterion(model, 3)
    trained = [p for p in model.parameters() if p.requires_grad]
    backbone_params = [p for n, p in model.named_parameters() if n.startswith("backbone.") and p.requires_grad]
    before = [p.detach().clone() for p in backbone_params]
    opt = torch.optim.AdamW(trained, lr=1e-3)
    images = torch.randn(2, 3, *SIZE)
    mask = torch.zeros(2, *SIZE, dtype=torch.bool)
    mask[1, :, 80:] = True
    for _ in range(2):
        out = model(images, mask, targets=_targets()) if model.forward_takes_targets else model(images, mask)
        loss = criterion(out, _targets(), sync_num_boxes=False)["loss"]
        assert torch.isfinite(loss), (family, backbone)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert any(not torch.equal(a, p) for a, p in zip(before, backbone_params)), "the backbone trained"
    model.eval()
    path = export_onnx(model, tmp_path / "model.onnx", image_size=SIZE)
    inputs = example_inputs(model, image_size=SIZE, batch_size=1)
    ref, got = onnx_and_torch_outputs(model, path, inputs)
    for r, g in zip(ref, got, strict=True):
        torch.testing.assert_close(g, r, rtol=DEFAULT_TOLERANCE.rtol, atol=DEFAULT_TOLERANCE.atol)


def test_every_backbone_forwards_in_every_family():
    """The quick half of the matrix (no training, no export): shapes through each family."""
    images = torch.randn(1, 3, *SIZE)
    for family in FAMILIES:
        for backbone in BACKBONES:
            model = _model(family, backbone).eval()
            with torch.no_grad():
                out = model(images)
            assert out["pred_boxes"].shape == (1, 8, 4) and torch.isfinite(out["pred_logits"]).all(), (family, backbone)


def test_every_registered_kind_has_an_example_in_the_matrix():
    kinds = {name: find_backbone(name).kind for name in BACKBONES}
    assert set(kinds.values()) == set(list_backbones())
    assert {"resnet", "resnet_vd", "hgnetv2", "dino_swin", "simplefpn", "timm", "vit"} <= set(kinds.values())

