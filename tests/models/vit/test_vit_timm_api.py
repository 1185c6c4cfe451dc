"""timm's ViT API on visiontf's ViT/DeiT: features_only, forward_intermediates, set_input_size,
dynamic_img_size and dynamic_img_pad give timm's numbers for the same weights."""
import pytest
import timm
import torch
from safetensors.torch import save_file

import visiontf

# depth 4 and 64-px images keep these cheap; the arithmetic is the same at full size
SMALL = dict(depth=4, img_size=64)
NAMES = ["vit_tiny_patch16_224", "deit_tiny_patch16_224", "deit_tiny_distilled_patch16_224"]


def _pair(name, **kwargs):
    ref = timm.create_model(name, pretrained=False, **SMALL, **kwargs).eval()
    ours = visiontf.create_model(name, **SMALL, **kwargs).eval()
    ours.load_state_dict(ref.state_dict())
    return ours, ref


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("size", [(64, 64), (48, 96), (50, 77), (17, 16)])
def test_dynamic_img_size_and_pad_equal_timm(name, size):
    ours, ref = _pair(name, dynamic_img_size=True, dynamic_img_pad=True)
    x = torch.randn(2, 3, *size)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), ref(x), rtol=0, atol=1e-5)
        a = ours.forward_intermediates(x, indices=[0, -1], return_prefix_tokens=True)
        b = ref.forward_intermediates(x, indices=[0, -1], return_prefix_tokens=True)
    torch.testing.assert_close(a[0], b[0], rtol=0, atol=1e-5)
    for (m1, p1), (m2, p2) in zip(a[1], b[1]):
        assert m1.shape == (2, 192, -(-size[0] // 16), -(-size[1] // 16))
        torch.testing.assert_close(m1, m2, rtol=0, atol=1e-5)
        torch.testing.assert_close(p1, p2, rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_features_only_equals_timm_and_takes_its_state_dict(name):
    ref = timm.create_model(name, pretrained=False, features_only=True, out_indices=(1, 3), dynamic_img_size=True, **SMALL).eval()
    ours = visiontf.create_model(name, features_only=True, out_indices=(1, 3), **SMALL).eval()
    assert sorted(ours.state_dict()) == sorted(ref.state_dict())
    ours.load_state_dict(ref.state_dict())
    assert ours.feature_info.channels() == ref.feature_info.channels() == [192, 192]
    assert ours.feature_info.reduction() == ref.feature_info.reduction() == [16, 16]
    for size in [(64, 64), (96, 48)]:
        x = torch.randn(1, 3, *size)
        with torch.no_grad():
            for a, b in zip(ours(x), ref(x), strict=True):
                assert a.shape == (1, 192, size[0] // 16, size[1] // 16)
                torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


def test_features_only_loads_full_weights_and_prunes(tmp_path):
    full = timm.create_model("vit_tiny_patch16_224", pretrained=False, **SMALL)
    path = tmp_path / "vit.safetensors"
    save_file(full.state_dict(), str(path))
    ours = visiontf.create_model("vit_tiny_patch16_224", features_only=True, out_indices=2, pretrained=path, **SMALL).eval()
    assert len(ours.model.blocks) == 4 and isinstance(ours.model.norm, torch.nn.Identity)
    ref = timm.create_model("vit_tiny_patch16_224", pretrained=False, features_only=True, out_indices=2, **SMALL).eval()
    ref.load_state_dict(ours.state_dict())
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        for a, b in zip(ours(x), ref(x), strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    # the last-3 default of timm's ViTs, and pruning after the last index
    assert visiontf.create_model("vit_tiny_patch16_224", features_only=True, **SMALL).feature_info.out_indices == (1, 2, 3)
    assert len(visiontf.create_model("vit_tiny_patch16_224", features_only=True, out_indices=(0,), **SMALL).model.blocks) == 1


def test_the_issue_call():
    m = visiontf.create_model("vit_base_patch16_224", features_only=True, out_indices=(3, 7, 11), depth=12, embed_dim=64, num_heads=2)
    maps = m(torch.randn(1, 3, 224, 224))
    assert [tuple(f.shape) for f in maps] == [(1, 64, 14, 14)] * 3


@pytest.mark.parametrize("name", ["vit_tiny_patch16_224", "deit_tiny_distilled_patch16_224"])
def test_set_input_size_equals_timm(name):
    ours, ref = _pair(name)
    ours.set_input_size((48, 80))
    ref.set_input_size((48, 80))
    x = torch.randn(1, 3, 48, 80)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), ref(x), rtol=0, atol=1e-5)
    assert ours.pos_embed.shape == ref.pos_embed.shape and ours.pretrained_cfg.input_size == (3, 48, 80)
    ours.set_input_size(patch_size=8)
    ref.set_input_size(patch_size=8)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), ref(x), rtol=0, atol=1e-5)


def test_refusals_name_the_fix():
    with pytest.raises(ValueError, match=r"use 0\.\.3"):
        visiontf.create_model("vit_tiny_patch16_224", features_only=True, out_indices=(1, 4), **SMALL)
    with pytest.raises(ValueError, match="features_only"):
        visiontf.create_model("detr_tiny", features_only=True)
    strict = visiontf.create_model("vit_tiny_patch16_224", dynamic_img_size=False, **SMALL)
    with pytest.raises(ValueError, match="dynamic_img_size=True"):
        strict(torch.randn(1, 3, 96, 96))
    with pytest.raises(ValueError, match="dynamic_img_pad=True"):
        visiontf.create_model("vit_tiny_patch16_224", **SMALL)(torch.randn(1, 3, 50, 64))
    with pytest.raises(ValueError, match="'NCHW' maps or 'NLC'"):
        visiontf.create_model("vit_tiny_patch16_224", **SMALL).forward_intermediates(torch.randn(1, 3, 64, 64), output_fmt="NHWC")


def test_features_only_model_saves_and_loads(tmp_path):
    m = visiontf.create_model("vit_tiny_patch16_224", features_only=True, out_indices=(1, 2), **SMALL).eval()
    again = visiontf.load_model(visiontf.save_model(m, tmp_path / "f.safetensors")).eval()
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        for a, b in zip(m(x), again(x), strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert again.feature_info.out_indices == (1, 2)
