"""One backbone interface (visiontf.models.backbones.backbone): timm parity of every kind's feature maps, the choice of
features, frozen stages, pretrained weights through timm's own code, injected backbones and the refusals.
Every timm model is built at random (``pretrained=False``) and small."""
from __future__ import annotations

import pytest
import timm
import torch
from safetensors.torch import save_file
from torch import nn

import visiontf
from visiontf.models.backbones.backbone import Backbone, select_levels
from visiontf.models.backbones.build import build_backbone

#: timm models of each kind a detector takes, shrunk where timm lets us (``timm_kwargs``)
TIMM_CASES = {
    "convnext_atto": {},  # ConvNeXt
    "resnet18d": {},  # ResNet-D
    "regnetx_002": {},  # RegNet
    "efficientnet_b0": {},  # EfficientNet
    "swin_tiny_patch4_window7_224": dict(embed_dim=32, depths=(1, 1, 1, 1), num_heads=(1, 2, 4, 8)),  # NHWC maps
    "vit_tiny_patch16_224": dict(depth=2),  # plain ViT
    "vit_small_patch14_dinov2": dict(depth=2, embed_dim=64, num_heads=2, img_size=56),  # DINOv2, patch 14
}


def _timm_reference(name: str, indices, kwargs: dict, backbone: Backbone) -> nn.Module:
    """timm's own features_only model with the backbone's weights."""
    size = {"strict_img_size": False} if name.startswith("swin") else (
        {"dynamic_img_size": True, "dynamic_img_pad": True} if name.startswith("vit") else {})
    ref = timm.create_model(name, features_only=True, out_indices=tuple(indices), pretrained=False, **size, **kwargs).eval()
    ref.load_state_dict(backbone.body.state_dict())
    return ref


@pytest.mark.parametrize("name", sorted(TIMM_CASES))
def test_timm_feature_maps_equal_timm(name):
    kwargs = TIMM_CASES[name]
    bb = build_backbone(f"timm:{name}", num_levels=3, frozen_bn=False, **kwargs).eval()
    ref = _timm_reference(name, bb.body.feature_info.out_indices, kwargs, bb)
    x = torch.randn(2, 3, 96, 128)  # a multiple of every patch here but 14 (DINOv2 pads)
    with torch.no_grad():
        maps, expected = bb.forward_maps(x), ref(x)
    if name.startswith("swin"):
        expected = [e.permute(0, 3, 1, 2) for e in expected]  # timm's Swin features are NHWC
    assert len(maps) == len(expected) == len(bb.channels) == len(bb.strides)
    for m, e, c, s in zip(maps, expected, bb.channels, bb.strides, strict=True):
        assert m.shape[1] == c and m.shape[-1] == -(-128 // s)
        torch.testing.assert_close(m, e, rtol=0, atol=1e-5)
    assert bb.strides == (sorted(set(bb.strides)) if not name.startswith("vit") else bb.strides)


def test_visiontf_vit_maps_equal_timm_vit_at_any_size():
    bb = build_backbone("vit_tiny_patch16_224", out_indices=(0, 1), depth=2, freeze_stem=False).eval()
    ref = timm.create_model("vit_tiny_patch16_224", depth=2, features_only=True, out_indices=(0, 1), dynamic_img_size=True,
                            dynamic_img_pad=True, pretrained=False).eval()
    ref.load_state_dict(bb.body.state_dict())
    x = torch.randn(1, 3, 75, 101)
    with torch.no_grad():
        for a, b in zip(bb.forward_maps(x), ref(x), strict=True):
            assert a.shape == (1, 192, 5, 7)
            torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    assert bb.strides == [16, 16] and all(p.requires_grad for p in bb.parameters())


def test_swin_maps_at_sizes_off_the_patch_are_padded_and_masked():
    bb = build_backbone("timm:swin_tiny_patch4_window7_224", num_levels=3, **TIMM_CASES["swin_tiny_patch4_window7_224"]).eval()
    mask = torch.zeros(1, 97, 130, dtype=torch.bool)
    mask[:, :, 100:] = True
    with torch.no_grad():
        maps, masks = bb.forward_features(torch.randn(1, 3, 97, 130), mask)
    assert [tuple(m.shape[-2:]) for m in maps] == [(13, 17), (7, 9), (4, 5)]
    assert [tuple(m.shape[-2:]) for m in masks] == [(13, 17), (7, 9), (4, 5)] and masks[0][0, 0, -1] and not masks[0][0, 0, 0]


def test_default_levels_follow_the_strides():
    assert select_levels([2, 4, 8, 16, 32], 3) == [2, 3, 4]  # ResNet: layer2-4
    assert select_levels([4, 8, 16, 32], 3) == [1, 2, 3]  # ConvNeXt / Swin: stages 1-3
    assert select_levels([4, 8, 16, 32], 1) == [3]
    assert select_levels([16] * 12, 3) == [11]  # a plain ViT: its last block
    assert build_backbone("resnet18", num_levels=3).strides == [8, 16, 32]


def test_frozen_stages_and_freeze_stem():
    rn = build_backbone("resnet18", frozen_stages=2, num_levels=3)
    trained = {n.split(".")[0] for n, p in rn.body.named_parameters() if p.requires_grad}
    assert trained == {"layer3", "layer4"}
    cnx = build_backbone("timm:convnext_atto", frozen_stages=1, num_levels=3)
    frozen = {n.split(".")[0] for n, p in cnx.body.named_parameters() if not p.requires_grad}
    assert frozen == {"stem_0", "stem_1", "stages_0", "stages_1"}
    vit = build_backbone("timm:vit_tiny_patch16_224", depth=3, frozen_stages=0)
    assert not vit.body.model.blocks[0].attn.qkv.weight.requires_grad and vit.body.model.blocks[1].attn.qkv.weight.requires_grad
    assert not vit.body.model.pos_embed.requires_grad
    assert not any(p.requires_grad for p in build_backbone("timm:regnetx_002", train_backbone=False).parameters())


def test_pretrained_file_loads_through_timm(tmp_path):
    src = timm.create_model("convnext_atto", pretrained=False)
    with torch.no_grad():
        src.stem[0].weight.normal_()
    path = tmp_path / "convnext_atto.safetensors"
    save_file(src.state_dict(), str(path))  # a classifier checkpoint: timm drops its head for features_only
    bb = build_backbone("timm:convnext_atto", pretrained=path, num_levels=3)
    torch.testing.assert_close(bb.body.stem_0.weight, src.stem[0].weight)
    vit = timm.create_model("vit_tiny_patch16_224", pretrained=False, depth=2, img_size=64)  # another grid: resampled by timm
    save_file(vit.state_dict(), str(tmp_path / "vit.safetensors"))
    bb = build_backbone("timm:vit_tiny_patch16_224", pretrained=tmp_path / "vit.safetensors", depth=2)
    torch.testing.assert_close(bb.body.model.blocks[1].mlp.fc2.weight, vit.blocks[1].mlp.fc2.weight)
    assert bb.body.model.pos_embed.shape == (1, 197, 192)
    wrong = timm.create_model("resnet18", pretrained=False)
    save_file(wrong.state_dict(), str(tmp_path / "wrong.safetensors"))
    with pytest.raises(RuntimeError, match="wrong.safetensors"):
        build_backbone("timm:convnext_atto", pretrained=tmp_path / "wrong.safetensors")


def test_pretrained_true_offline_names_the_local_alternative(monkeypatch):
    def offline(*args, **kwargs):
        if kwargs.get("pretrained"):
            raise OSError("network unreachable")
        return real(*args, **kwargs)

    real = timm.create_model
    monkeypatch.setattr(timm, "create_model", offline)
    with pytest.raises(RuntimeError, match=r"save timm.create_model\('convnext_atto', pretrained=True\)"):
        build_backbone("timm:convnext_atto", pretrained=True)


class _Constant(Backbone):
    """A backbone written by hand: two maps at strides 8 and 16."""

    def __init__(self):
        super().__init__()
        self.channels, self.strides = [8, 16], [8, 16]
        self.proj8, self.proj16 = nn.Conv2d(3, 8, 8, 8), nn.Conv2d(3, 16, 16, 16)

    def forward_maps(self, images):
        return [self.proj8(images), self.proj16(images)]


def test_an_injected_backbone_is_used_as_given():
    bb = _Constant()
    model = visiontf.create_model("dino_tiny", num_classes=2, backbone=bb, arch={"num_feature_levels": 3, "num_queries": 20}).eval()
    assert model.backbone is bb and [p[0].in_channels for p in model.input_proj[:2]] == [8, 16]
    with torch.no_grad():
        assert model(torch.randn(1, 3, 64, 64))["pred_boxes"].shape[-1] == 4
    detr = visiontf.create_model("detr_tiny", num_classes=2, backbone=_Constant())
    assert detr.input_proj.in_channels == 16
    with pytest.raises(ValueError, match="num_feature_levels=2"):
        visiontf.create_model("dino_tiny", num_classes=2, backbone=_Constant(), arch={"num_feature_levels": 1, "num_queries": 20})


def test_refusals_list_what_fits():
    with pytest.raises(ValueError, match="timm:convnext_tiny"):
        build_backbone("timm:convnext_tinyy")
    with pytest.raises(ValueError, match=r"0 \(stride 4\), 1 \(stride 8\), 2 \(stride 16\), 3 \(stride 32\)"):
        build_backbone("timm:convnext_atto", out_indices=(1, 4))
    with pytest.raises(ValueError, match=r"increasing feature indices among 0 \(stride 2\)"):
        build_backbone("resnet18", out_indices=(3, 2))
    with pytest.raises(ValueError, match="timm: 'timm:<name>'"):
        build_backbone("vgg16")
    with pytest.raises(ValueError, match="dilation"):
        build_backbone("vit_tiny_patch16_224", dilation=True, depth=1)
    with pytest.raises(TypeError, match="Backbone"):
        build_backbone(nn.Conv2d(3, 3, 1))
    with pytest.raises(ValueError, match="no further keywords"):
        build_backbone("resnet18", drop_path_rate=0.1)


def test_the_issue_calls():
    """The four calls of docs/backbones.md, full size, built on the meta device (the small forwards are the matrix's)."""
    with torch.device("meta"):
        cnx = visiontf.create_model("dino_resnet50_4scale", backbone="timm:convnext_tiny", num_classes=3)
        swin = visiontf.create_model("dino_resnet50_4scale", backbone="timm:swin_tiny_patch4_window7_224", num_classes=3)
        vit = visiontf.create_model("dino_vit_small_simplefpn", num_classes=3)
        feats = visiontf.create_model("vit_base_patch16_224", features_only=True, out_indices=(3, 7, 11))
    assert cnx.backbone.strides == [8, 16, 32] and cnx.backbone.channels == [192, 384, 768]
    assert swin.backbone.nhwc and swin.backbone.channels == [192, 384, 768] and swin.backbone.pad_multiple == 4
    assert vit.backbone.strides == [8, 16, 32, 64] and len(vit.backbone.net.blocks) == 12
    assert vit.backbone.window_size == 14 and vit.backbone.global_blocks == (2, 5, 8, 11)
    assert feats.feature_info.channels() == [768] * 3 and feats.feature_info.out_indices == (3, 7, 11)


def test_a_model_with_an_injected_backbone_is_not_saved_with_a_config(tmp_path):
    model = visiontf.create_model("detr_tiny", num_classes=2, backbone=_Constant())
    with pytest.raises(ValueError, match=r"\['backbone'\] hold module instances \(_Constant\)"):
        visiontf.save_model(model, tmp_path / "m.safetensors")


def test_images_padded_to_a_multiple_have_their_padding_masked():
    """A backbone that pads its images (a window grid) pads the mask alike: the padded area is padding."""
    from visiontf.models.backbones.backbone import pad_to_multiple

    class Padded(_Constant):
        pad_multiple = 32

        def forward_maps(self, images):
            return super().forward_maps(pad_to_multiple(images, self.pad_multiple))

    maps, masks = Padded().forward_features(torch.randn(1, 3, 40, 50), torch.zeros(1, 40, 50, dtype=torch.bool))
    assert maps[0].shape[-2:] == (8, 8) and masks[0].shape == (1, 8, 8)
    assert masks[0][0, :5, :6].logical_not().all() and masks[0][0, 5:].all() and masks[0][0, :, 7:].all()
    assert build_backbone("timm:swin_tiny_patch4_window7_224", **TIMM_CASES["swin_tiny_patch4_window7_224"]).pad_multiple == 4
    with pytest.raises(ValueError, match="takes no image size but its own"):
        build_backbone("timm:hiera_tiny_224")


def test_deformable_detr_masks_the_padding_its_backbone_adds():
    from visiontf.models.backbones.backbone import pad_to_multiple

    class Padded(_Constant):
        pad_multiple = 32

        def forward_maps(self, images):
            return super().forward_maps(pad_to_multiple(images, self.pad_multiple))

    model = visiontf.create_model("dino_tiny", num_classes=2, backbone=Padded(), arch={"num_feature_levels": 3, "num_queries": 20}).eval()
    with torch.no_grad():
        odd = model.encode(torch.randn(1, 3, 40, 50))  # padded to 64 x 64 inside the backbone, no mask given
        even = model.encode(torch.randn(1, 3, 64, 64))
    assert odd.spatial_shapes == [(8, 8), (4, 4), (2, 2)] and odd.padding_mask is not None
    assert odd.padding_mask[0, :64].view(8, 8)[5:].all() and not odd.padding_mask[0, :64].view(8, 8)[:5, :6].any()
    assert even.padding_mask is None  # nothing padded: the fast path without masking
