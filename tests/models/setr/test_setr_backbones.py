"""SETR's heads on other backbones than its own ViT (visiontf.models.setr.setr_backbone): timm CNNs, timm's DINOv2
ViT, DINO's Swin; the heads read the backbone's own maps, and MLA refuses maps of several widths."""
from __future__ import annotations

import pytest
import timm
import torch

import visiontf

TINY_SWIN = dict(embed_dim=32, depths=(1, 1, 1, 1), num_heads=(1, 2, 4, 8))
DINOV2 = dict(depth=4, embed_dim=64, num_heads=2, img_size=56)


@pytest.mark.parametrize("name,encoder,kwargs,out_indices,strides", [
    ("setr_pup_vit_tiny_patch16", "timm:convnext_atto", dict(depths=(1, 1, 1, 1), dims=(16, 32, 64, 128)), None, [4, 8, 16, 32]),
    ("setr_naive_vit_tiny_patch16", "swin_T_224_1k", TINY_SWIN, (1, 2, 3), [8, 16, 32]),
    ("setr_mla_vit_tiny_patch16", "timm:vit_small_patch14_dinov2", DINOV2, (0, 1, 2, 3), [14] * 4),
])
def test_setr_on_other_backbones_trains_and_infers(name, encoder, kwargs, out_indices, strides):
    model = visiontf.create_model(name, encoder={"name": encoder, "kwargs": kwargs, "out_indices": out_indices}, num_classes=5).train()
    assert model.encoder.strides == strides
    images = torch.randn(2, 3, 64, 96)
    out = model(images)
    assert out["out"].shape == (2, 5, 64, 96) and all(a.shape == (2, 5, 64, 96) for a in out["aux"])
    (out["out"].logsumexp(1).mean() + sum(a.logsumexp(1).mean() for a in out["aux"])).backward()
    assert all(p.grad is not None for p in model.encoder.parameters() if p.requires_grad)
    model.eval()
    with torch.no_grad():
        maps = model.features(images)
        for t, m in maps.items():
            torch.testing.assert_close(m, model.encoder.forward_maps(images)[t])
        assert model.inference(torch.randn(1, 3, 100, 140), mode="slide", crop=64, stride=40).shape == (1, 5, 100, 140)


def test_dinov2_maps_are_timms():
    model = visiontf.create_model("setr_mla_vit_tiny_patch16", num_classes=5, encoder={
        "name": "timm:vit_small_patch14_dinov2", "kwargs": DINOV2, "out_indices": (1, 3)}).eval()
    ref = timm.create_model("vit_small_patch14_dinov2", features_only=True, out_indices=(1, 3), dynamic_img_size=True,
                            dynamic_img_pad=True, pretrained=False, **DINOV2).eval()
    ref.load_state_dict(model.encoder.body.state_dict())
    x = torch.randn(1, 3, 70, 100)
    with torch.no_grad():
        for t, m in model.features(x).items():
            torch.testing.assert_close(m, ref(x)[t], rtol=0, atol=1e-5)
    assert model.no_weight_decay() == {"encoder.body.model.pos_embed", "encoder.body.model.cls_token"}


def test_mla_refuses_maps_of_several_widths():
    with pytest.raises(ValueError, match="decoder='naive' or 'pup'"):
        visiontf.create_model("setr_mla_vit_tiny_patch16", encoder="timm:convnext_atto", num_classes=5)
