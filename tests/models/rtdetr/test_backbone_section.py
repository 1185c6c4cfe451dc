"""The real-time DETRs' backbone is a BackboneSpec (``backbone: {name: resnet18vd, ...}`` / ``{name: hgnetv2_b0, ...}``),
as the DETR line's; the former ResNetVdOptions / HGNetV2Options spelling of old configs and checkpoints still builds the
same network, with one FutureWarning."""
from __future__ import annotations

import warnings

import pytest
import torch

from visiontf.io.weights import save_model
from visiontf.models import create_model, load_model
from visiontf.models.backbones.spec import BackboneSpec
from visiontf.models.dfine.dfine import DEFAULT_CFGS as DFINE_CFGS
from visiontf.models.rtdetr.rtdetr import DEFAULT_CFGS as RTDETR_CFGS
from visiontf.models.rtdetr.rtdetr import build_rtdetr

HEADS = dict(encoder={"hidden_dim": 32, "nhead": 2, "dim_feedforward": 32},
             decoder={"hidden_dim": 32, "nhead": 2, "dim_feedforward": 32, "num_layers": 2, "num_queries": 5},
             denoising={"num_denoising": 4}, num_select=5, num_classes=3)
RESNET = {"stem_width": 4, "widths": (8, 16, 32, 64), "blocks": (1, 1, 1, 1)}
HGNET = {"stem": (4, 4), "stages": ((4, 4, 8, 1, False, False, 3, 1), (8, 4, 16, 1, True, False, 3, 1),
                                    (16, 8, 32, 1, True, True, 5, 1), (32, 8, 32, 1, True, True, 5, 1))}


def _build(name: str, **kwargs):
    """(the model built from seed 0, its FutureWarnings)."""
    torch.manual_seed(0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = create_model(name, **{**HEADS, **kwargs})
    return model, [str(w.message) for w in caught if issubclass(w.category, FutureWarning)]


def _same(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    frozen = [{k for k, p in m.named_parameters() if not p.requires_grad} for m in (a, b)]
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa) and frozen[0] == frozen[1]


def test_the_variants_name_registered_backbones():
    assert RTDETR_CFGS["rtdetr_r18vd"].kwargs["backbone"]["name"] == "resnet18vd"
    assert RTDETR_CFGS["rtdetrv2_r101vd"].kwargs["backbone"]["name"] == "resnet101vd"
    assert DFINE_CFGS["dfine_n"].kwargs["backbone"] == {"name": "hgnetv2_b0", "frozen_bn": False, "freeze_stem": False, "stages": (3, 4)}
    model, warned = _build("rtdetr_r50vd", backbone={"kwargs": RESNET})
    assert warned == [] and model.options["backbone"] == BackboneSpec("resnet50vd", stages=(2, 3, 4), kwargs={"frozen_stages": 0, **RESNET})
    # R50-vd freezes its stem alone and keeps FrozenBatchNorm; R18-vd trains everything
    assert not any(p.requires_grad for n, p in model.backbone.named_parameters() if n.startswith("body.conv1"))
    assert all(p.requires_grad for n, p in model.backbone.named_parameters() if n.startswith("body.layer1"))
    assert all(p.requires_grad for p in _build("rtdetr_r18vd", backbone={"kwargs": RESNET})[0].backbone.parameters())


@pytest.mark.parametrize(("name", "former", "spec"), [
    ("rtdetr_r18vd", {"depth": 34, "freeze_at": 0, **RESNET},
     {"name": "resnet34vd", "frozen_bn": False, "kwargs": {"frozen_stages": 0, **RESNET}}),
    ("rtdetr_r50vd", {"freeze_at": -1, "frozen_bn": False, "out_stages": (1, 2, 3), **RESNET},
     {"frozen_bn": False, "stages": (1, 2, 3), "kwargs": {"frozen_stages": -1, **RESNET}}),  # the variant sets frozen_stages
    ("dfine_s", {"arch": "B2", "use_lab": False, "freeze_at": 1, **HGNET},
     {"name": "hgnetv2_b2", "frozen_bn": False, "kwargs": {"use_lab": False, "frozen_stages": 1, **HGNET}}),
    ("deim_dfine_l", {"out_stages": (1, 2, 3), "frozen_bn": True, **HGNET}, {"frozen_bn": True, "stages": (1, 2, 3), "kwargs": HGNET}),
])
def test_the_former_spelling_builds_the_same_network_with_one_warning(name, former, spec):
    old, warned = _build(name, backbone=former)
    new, quiet = _build(name, backbone=spec)
    assert _same(old, new)
    assert quiet == [] and len(warned) == 1 and "backbone: {name: " in warned[0] and "will be removed" in warned[0]


def test_a_checkpoint_saved_with_the_former_spelling_loads(tmp_path):
    model, _ = _build("rtdetr_r18vd", backbone={"kwargs": RESNET})
    path = save_model(model, tmp_path / "old.safetensors", "rtdetr_r18vd", **HEADS, backbone=RESNET)  # as files saved before
    with pytest.warns(FutureWarning, match="ResNetVdOptions spelling") as caught:
        loaded = load_model(path)
    assert len([w for w in caught if issubclass(w.category, FutureWarning)]) == 1
    assert _same(model, loaded)


def test_any_registered_backbone_fits_a_real_time_detr():
    # one section type: D-FINE's HGNetv2 under RT-DETR's encoder and decoder
    model, warned = _build("rtdetr_r18vd", backbone={"name": "hgnetv2_b0", "kwargs": HGNET})
    assert warned == [] and type(model.backbone).__name__ == "HGNetV2Backbone"
    model.eval()
    with torch.no_grad():
        assert model(torch.rand(1, 3, 64, 64))["pred_boxes"].shape == (1, 5, 4)


def test_the_former_spelling_over_another_kind_of_backbone_is_refused():
    with pytest.raises(ValueError, match="describe a ResNet-vd, but the backbone is 'hgnetv2_b0'"):
        build_rtdetr(**HEADS, backbone={"depth": 18}, base={"backbone": {"name": "hgnetv2_b0"}})
    with pytest.raises(ValueError, match="backbone.depth must be 18, 34, 50 or 101"):
        create_model("rtdetr_r18vd", **HEADS, backbone={"depth": 20, **RESNET})


def test_a_missing_backbone_file_names_the_field_and_how_to_train_without_it(tmp_path):
    """The recipes name the originals' ImageNet files at their authors' paths: without them, the error says which
    setting to change (a one-line FileNotFoundError in the tools), before any model is built."""
    missing = tmp_path / "ResNet18_vd_pretrained_from_paddle.pth"
    with pytest.raises(FileNotFoundError, match=r"model_kwargs\.backbone\.pretrained: weights file not found: .*ResNet18_vd"
                                                r"_pretrained_from_paddle\.pth; give the path of the resnet18vd backbone's "
                                                r"ImageNet file, or set model_kwargs: \{backbone: \{pretrained: null\}\}"):
        BackboneSpec(name="resnet18vd", pretrained=str(missing)).build()


@pytest.mark.parametrize("backbone", ["timm:resnet18", {"name": "timm:convnext_atto"}, "resnet18"])
def test_another_backbone_reads_its_own_strides_8_16_32_at_any_image_size(backbone):
    """Another name keeps none of the variant's stages (the ResNet-vd numbering: a ConvNeXt has no feature 4), and
    images are padded to the coarsest stride whatever the backbone's own multiple (timm's and torchvision's are 1):
    before, sides that were not multiples of 32 failed in the fusion (``Expected size 14 but got size 13``)."""
    model, _ = _build("rtdetr_r18vd", backbone=backbone)
    assert list(model.backbone.strides) == [8, 16, 32] and model.pad_multiple == 32
    images = torch.rand(2, 3, 200, 224)
    model.eval()
    with torch.no_grad():
        out = model(images)
        # the padding the model adds is padding: the same image padded by hand (masked) gives the same detections
        padded = torch.zeros(2, 3, 224, 224)
        padded[..., :200, :] = images
        mask = torch.zeros(2, 224, 224, dtype=torch.bool)
        mask[:, 200:] = True
        by_hand = model(padded, mask)
    torch.testing.assert_close(out["pred_logits"], by_hand["pred_logits"])
    torch.testing.assert_close(out["pred_boxes"], by_hand["pred_boxes"])
    model.train()
    targets = [{"labels": torch.tensor([1]), "boxes": torch.tensor([[0.5, 0.5, 0.2, 0.3]])}] * 2
    assert torch.isfinite(model(torch.rand(2, 3, 161, 97), targets=targets)["pred_boxes"]).all()


def test_features_whose_strides_do_not_double_are_refused_naming_the_field():
    with pytest.raises(ValueError, match=r"strides \(8, 32\).*backbone\.stages"):
        _build("rtdetr_r18vd", backbone={"name": "timm:resnet18", "stages": [2, 4]}, decoder={**HEADS["decoder"], "num_levels": 2})


def test_a_plain_vit_is_pointed_to_its_simple_feature_pyramid_which_then_fits():
    """One map gives the hybrid encoder nothing to fuse; the message names the pyramid that fits (strides 8, 16, 32)."""
    vit = "timm:vit_tiny_patch16_224"
    with pytest.raises(ValueError, match=r"1 backbone levels; a backbone of one map \(a plain ViT\).*"
                                         r"simplefpn:<the ViT>', kwargs: \{top_block: false\}"):
        _build("rtdetr_r18vd", backbone={"name": vit})
    model, _ = _build("rtdetr_r18vd", backbone={"name": f"simplefpn:{vit}", "kwargs": {"top_block": False, "depth": 1}})
    assert list(model.backbone.strides) == [8, 16, 32]
    with torch.no_grad():
        assert model.eval()(torch.rand(1, 3, 96, 128))["pred_boxes"].shape == (1, 5, 4)


@pytest.mark.parametrize("name", ["rtdetr_tiny", "dfine_tiny"])
def test_a_simple_feature_pyramid_with_its_top_block_is_pointed_to_either_fix_which_then_fits(name):
    """The pyramid keeps its four maps whatever the decoder's three ask for: the decoder refused the count and pointed to
    backbone.stages, which the pyramid does not read. Each fix the message gives builds a model that detects."""
    pyramid = {"name": "simplefpn:timm:vit_tiny_patch16_224", "kwargs": {"depth": 1}}
    with pytest.raises(ValueError, match=r"simplefpn:timm:vit_tiny_patch16_224 gives 4 maps \(strides \(8, 16, 32, 64\): its "
                                         r"top block adds the last\), but the decoder attends to num_levels=3; build the "
                                         r"pyramid without it, .*kwargs: \{top_block: false\}.*or set decoder\.num_levels: 4"):
        create_model(name, num_classes=3, backbone=pyramid)
    without_top = create_model(name, num_classes=3, backbone={**pyramid, "kwargs": {"depth": 1, "top_block": False}})
    four_levels = create_model(name, num_classes=3, backbone=pyramid, decoder={"num_levels": 4, "num_points": [4, 4, 4, 4]})
    assert list(without_top.backbone.strides) == [8, 16, 32] and list(four_levels.backbone.strides) == [8, 16, 32, 64]
    with torch.no_grad():
        for model in (without_top, four_levels):
            assert model.eval()(torch.rand(1, 3, 96, 128))["pred_boxes"].shape[-1] == 4


def test_a_section_field_of_another_type_is_one_line_naming_it():
    with pytest.raises(ValueError, match=r"decoder\.num_queries: 'ten' is not int"):
        _build("rtdetr_r18vd", backbone={"kwargs": RESNET}, decoder={**HEADS["decoder"], "num_queries": "ten"})
    model, _ = _build("rtdetr_r18vd", backbone={"kwargs": RESNET}, decoder={**HEADS["decoder"], "num_queries": 5.0})
    assert type(model.decoder.options.num_queries) is int  # a YAML 5.0 is the count 5


@pytest.mark.parametrize("name", ["rtdetr_tiny", "dfine_tiny"])
def test_option_values_that_leave_no_position_or_no_attention_level_are_named_with_the_fix(name):
    """An anchor margin of 0.06 masked the finest level's positions (0.2 every one: every box came out (1, 1, 1, 1));
    two levels gave aifi_levels (2,) with no value to use instead."""
    with pytest.raises(ValueError, match=r"decoder\.anchor_eps=0\.06: give a margin in \[0, 0\.05\)"):
        create_model(name, num_classes=3, decoder={"anchor_eps": 0.06})
    two = {"decoder": {"num_levels": 2, "num_points": [4, 4]}, "backbone": {"stages": [3, 4]}}
    with pytest.raises(ValueError, match=r"aifi_levels \(2,\) must index the 2 backbone levels \(0\.\.1, finest first: .*"
                                         r"encoder\.aifi_levels: \[1\]\)"):
        create_model(name, num_classes=3, **two)
    model = create_model(name, num_classes=3, encoder={"aifi_levels": [1]}, **two)
    with torch.no_grad():
        assert model.eval()(torch.rand(1, 3, 192, 256))["pred_boxes"].shape[-1] == 4
