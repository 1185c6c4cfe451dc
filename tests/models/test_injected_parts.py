"""Detectors built from injected parts: ``DeformableDETR`` takes a backbone, a position
embedding, a neck, the transformer and the denoising generator; the registered names' builder makes them
from the typed sections (``backbone``, ``arch``, ``dino``, ``postprocess``) of ``DEFAULT_CFGS``, configs and checkpoints.
(The flat keywords of before the sections, and their warning: test_typed_sections.py, test_detr_sections.py.)

Cost: toy-sized models (ResNet-18 at d 32, 64-px images); a few seconds.
"""
from __future__ import annotations

import inspect

import pytest
import torch

import visiontf
from visiontf.models import create_model
from visiontf.models.backbones.build import build_backbone
from visiontf.models.deformable_detr.arch_options import DeformableArchOptions
from visiontf.models.deformable_detr.build import build_deformable_detr, build_deformable_transformer, level_projections
from visiontf.models.deformable_detr.deformable_detr import DeformableDETR
from visiontf.models.deformable_detr.denoising import ContrastiveDenoising
from visiontf.models.deformable_detr.dino_options import DinoOptions
from visiontf.models.postprocess_options import PostprocessOptions
from visiontf.nn import PositionEmbeddingSine2d

#: a toy DINO: refinement, two-stage, mixed query selection, denoising, shared heads, decoder norm
TOY = dict(num_classes=3, backbone="resnet18",
           arch=dict(num_feature_levels=4, hidden_dim=32, nheads=2, enc_layers=1, dec_layers=2, dim_feedforward=48, num_queries=8,
                     enc_n_points=2, dec_n_points=2, dropout=0.0, with_box_refine=True, two_stage=True, decoder_norm=True,
                     pos_temperature=20.0),
           dino=dict(mixed_query_selection=True, look_forward_twice=True, num_denoising=6, share_decoder_heads=True),
           postprocess=dict(num_top=20))


def _from_parts() -> DeformableDETR:
    """The toy DINO assembled in Python, part by part, as a user injecting their own parts would."""
    arch = DeformableArchOptions(hidden_dim=32, nheads=2, enc_layers=1, dec_layers=2, dim_feedforward=48, dropout=0.0, num_queries=8,
                                 num_feature_levels=4, enc_n_points=2, dec_n_points=2, with_box_refine=True, two_stage=True,
                                 decoder_norm=True, pos_temperature=20.0)
    dino = DinoOptions(mixed_query_selection=True, look_forward_twice=True, num_denoising=6, share_decoder_heads=True)
    backbone = build_backbone("resnet18", num_levels=3)
    position = PositionEmbeddingSine2d(16, 20.0, normalize=True, offset=0.5)
    neck = level_projections(backbone.channels, 32, 4)
    transformer = build_deformable_transformer(arch, dino)
    return DeformableDETR(backbone, position, neck, transformer, 3, arch, dino, ContrastiveDenoising(6), PostprocessOptions(20))


def test_the_constructor_takes_its_parts_and_at_most_12_parameters():
    params = inspect.signature(DeformableDETR.__init__).parameters
    assert len(params) <= 12, list(params)
    assert list(params)[1:6] == ["backbone", "position_embedding", "neck", "transformer", "num_classes"]
    # the options arrive as typed sections, read by the builder only
    assert "num_queries" not in params and {"backbone", "arch", "dino", "postprocess"} <= set(inspect.signature(build_deformable_detr).parameters)


def test_a_model_built_from_parts_equals_the_one_built_from_sections():
    torch.manual_seed(0)
    by_name = build_deformable_detr(DeformableDETR, **TOY)
    torch.manual_seed(0)
    parts = _from_parts()
    a, b = by_name.state_dict(), parts.state_dict()
    assert list(a) == list(b)
    # the builder makes the parts in the single constructor's order, so a seed gives the same initial weights
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert (parts.arch_options, parts.dino_options, parts.postprocess_options) == (
        by_name.arch_options, by_name.dino_options, by_name.postprocess_options)
    images = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        out_a, out_b = by_name.eval()(images), parts.eval()(images)
    assert torch.equal(out_a["pred_logits"], out_b["pred_logits"]) and torch.equal(out_a["pred_boxes"], out_b["pred_boxes"])
    # denoising comes from the injected generator in training
    targets = [{"labels": torch.tensor([0, 2]), "boxes": torch.tensor([[0.5, 0.5, 0.2, 0.3], [0.3, 0.6, 0.1, 0.1]])}] * 2
    train_out = parts.train()(images, targets=targets)
    assert train_out["dn_meta"].pad_size == 2 * 2 * 3  # 6 slots // 2 boxes = 3 groups of 2 positives + 2 negatives


def test_the_registered_names_keep_their_keys_when_built_by_name():
    with torch.device("meta"):
        model = create_model("dino_resnet50_4scale")
    assert model.model_kwargs == {} and model.arch_options.num_queries == 900 and model.denoising == ContrastiveDenoising(100, 0.5, 0.4)
    assert "label_enc.weight" in model.state_dict() and "input_proj.4.0.weight" not in model.state_dict()


def test_parts_that_disagree_with_the_options_are_refused_naming_both():
    arch = DeformableArchOptions(hidden_dim=32, nheads=2, enc_layers=1, dec_layers=2, num_feature_levels=4)
    backbone = build_backbone("resnet18", num_levels=3)
    neck = level_projections(backbone.channels, 32, 4)
    other = build_deformable_transformer(DeformableArchOptions(hidden_dim=64, nheads=2, enc_layers=1, dec_layers=2), DinoOptions())
    with pytest.raises(ValueError, match=r"the transformer has .* \(\(4, 64\), 1, 2\), arch_options say \(\(4, 32\), 1, 2\)"):
        DeformableDETR(backbone, PositionEmbeddingSine2d(16), neck, other, 3, arch)
    with pytest.raises(ValueError, match="the neck has 3 level projections, arch_options.num_feature_levels is 4"):
        DeformableDETR(backbone, PositionEmbeddingSine2d(16), level_projections(backbone.channels, 32, 3),
                       build_deformable_transformer(arch, DinoOptions()), 3, arch)
    with pytest.raises(TypeError, match="backbone must be a visiontf.models.backbones.backbone.Backbone, got str"):
        DeformableDETR("resnet18", PositionEmbeddingSine2d(16), neck, build_deformable_transformer(arch, DinoOptions()), 3, arch)


def test_a_config_swaps_the_backbone_and_neck_with_sections(tmp_path):
    """A config's model_kwargs sections choose another backbone and another number of neck levels; the
    saved model rebuilds from its name and those sections."""
    kwargs = dict(backbone=dict(name="timm:regnetx_002", frozen_bn=False),
                  arch=dict(num_feature_levels=4, hidden_dim=64, nheads=2, enc_layers=1, dec_layers=2, dim_feedforward=64, num_queries=10))
    model = create_model("deformable_detr_tiny", num_classes=3, **kwargs).eval()
    assert type(model.backbone.body).__name__ == "FeatureListNet"  # timm's, not the tiny model's torchvision ResNet-18
    assert len(model.input_proj) == 4 and model.input_proj[0][0].in_channels == model.backbone.channels[0]
    path = visiontf.save_model(model, tmp_path / "swapped.safetensors")
    again = visiontf.load_model(path).eval()
    images = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        assert torch.equal(model(images)["pred_boxes"], again(images)["pred_boxes"])


def test_detr_takes_its_parts_and_its_builder_the_sections():
    from visiontf.models.detr.detr import DETR, DetrTransformer, build_detr
    from visiontf.models.detr.detr_segm import DETRSegm

    params = inspect.signature(DETR.__init__).parameters
    assert len(params) <= 12 and list(params)[1:5] == ["backbone", "position_embedding", "input_proj", "transformer"], list(params)
    toy = dict(num_classes=3, backbone="resnet18", arch=dict(hidden_dim=32, nheads=2, enc_layers=1, dec_layers=2, dim_feedforward=48,
                                                            num_queries=6, dropout=0.0))
    torch.manual_seed(0)
    by_name = build_detr(DETR, **toy)
    torch.manual_seed(0)
    backbone = build_backbone("resnet18")
    parts = DETR(backbone, PositionEmbeddingSine2d(16, normalize=True), torch.nn.Conv2d(backbone.num_channels, 32, 1),
                 DetrTransformer(32, 2, 1, 2, 48, 0.0), num_classes=3, num_queries=6)
    a, b = by_name.state_dict(), parts.state_dict()
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)  # the original's order of construction
    images = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        assert torch.equal(by_name.eval()(images)["pred_boxes"], parts.eval()(images)["pred_boxes"])
    # the registered names go through the builder: create_model's keywords are its sections
    model = create_model("detr_tiny", num_classes=3, backbone="resnet18", arch={"num_queries": 7})
    assert model.num_queries == 7 and model.model_kwargs == {"num_classes": 3, "backbone": "resnet18", "arch": {"num_queries": 7}}
    with pytest.raises(ValueError, match="input_proj maps"):
        DETR(backbone, PositionEmbeddingSine2d(16, normalize=True), torch.nn.Conv2d(64, 32, 1), DetrTransformer(32, 2, 1, 1, 48, 0.0))
    with pytest.raises(TypeError, match="build_detr or create_model"):
        DETR("resnet18", None, None, DetrTransformer(32, 2, 1, 1, 48, 0.0))
    # the mask model needs the backbone's four stages; the builder asks for them
    with pytest.raises(ValueError, match="out_indices"):
        DETRSegm(backbone, PositionEmbeddingSine2d(16, normalize=True), torch.nn.Conv2d(backbone.num_channels, 32, 1),
                 DetrTransformer(32, 2, 1, 1, 48, 0.0), num_classes=3, num_queries=6)
    assert len(build_detr(DETRSegm, **{**toy, "arch": {**toy["arch"], "hidden_dim": 128}}, mask_heads=8).backbone.channels) == 4
