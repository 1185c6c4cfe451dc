"""The backbone registry: a kind registers itself; build_backbone and the matrix test read the registry."""
import pytest
import torch
from torch import nn

from visiontf.models.backbones import registry
from visiontf.models.backbones.backbone import Backbone
from visiontf.models.backbones.build import build_backbone
from visiontf.models.backbones.registry import backbone_examples, find_backbone, list_backbones, register_backbone


class _TwoConvs(Backbone):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, width, 3, stride=4, padding=1), nn.Conv2d(width, width, 3, stride=2, padding=1))
        self.channels, self.strides = [width], [8]

    def forward_maps(self, images):
        return [self.body(images)]


@pytest.fixture
def fake_kind():
    @register_backbone("two_convs", names=("two_convs_s",), examples={"two_convs_s": dict(width=8)}, summary="a test's")
    def build(name, *, dilation=False, width=16, **common):
        assert not dilation and {"pretrained", "train_backbone", "frozen_bn", "out_indices"} <= set(common)
        return _TwoConvs(width)

    yield build
    del registry._BACKBONES["two_convs"]


def test_a_registered_kind_is_built_by_name_and_joins_the_matrix(fake_kind):
    assert "two_convs" in list_backbones() and backbone_examples()["two_convs_s"] == {"width": 8}
    body = build_backbone("two_convs_s", width=4)
    assert isinstance(body, _TwoConvs) and body.num_channels == 4
    assert body.forward_maps(torch.zeros(1, 3, 32, 32))[0].shape == (1, 4, 4, 4)


def test_the_same_kind_name_twice_is_refused(fake_kind):
    with pytest.raises(ValueError, match="'two_convs' is registered twice"):
        register_backbone("two_convs", names=("other",))(lambda name, **kw: None)


def test_visiontf_kinds_and_timm_names_resolve_and_an_unknown_name_lists_the_kinds():
    expected = {"resnet50": "resnet", "resnet50vd": "resnet_vd", "hgnetv2_b4": "hgnetv2", "swin_L_384_22k": "dino_swin",
                "vit_small_patch16_224": "vit", "timm:convnext_tiny": "timm", "simplefpn:timm:vit_base_patch16_224": "simplefpn"}
    assert {name: find_backbone(name).kind for name in expected} == expected
    with pytest.raises(ValueError, match=r"unknown backbone 'resnet5': the registered kinds are .*resnet: .*'resnet50'.*"
                                         r"timm: 'timm:<name>'.*register_backbone"):
        build_backbone("resnet5")
    with pytest.raises(ValueError, match=r"dilation \(DC5\) is not built for resnet18vd"):
        build_backbone("resnet18vd", dilation=True)
