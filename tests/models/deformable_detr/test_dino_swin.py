"""IDEA-Research/DINO's Swin layout (visiontf.models.backbones.dino_swin) against what DINO's own code computed.

The baselines are recorded by ``scripts/fixtures/make_dino.py`` from a checkout of DINO (docs/dino.md):

* ``tests/fixtures/dino/swin_backbone_w12.safetensors``: DINO's ``SwinTransformer`` alone at window 12, every
  stage's output (``forward_raw``), on three images whose sizes are off the window grid;
* ``swin_4scale.safetensors``: DINO-4scale (``DINO_4scale_swin.py``) on a narrow Swin at window 7, with its
  backbone maps, outputs and detections for a padded batch, in float32 and float64;
* ``published_layouts.txt``: the full layouts of the published Swin models and backbones.

The DINO-Swin checkpoint is loaded as a user loads the original's (``backbone.0.*`` for the Swin):
``create_model("dino_swin_large_4scale", pretrained=file)``, with the toy widths as keywords.
"""
from __future__ import annotations

import pytest
import torch
from test_dino_checkpoints import (
    DETECTION_TOL,
    TOL,
    assert_same_detections,
    differences,
    fixture,
    load_model,
    named_outputs,
    original_state,
    published,
    published_state,
    save_checkpoint,
)

from visiontf.models import create_model
from visiontf.models.backbones.build import build_backbone
from visiontf.models.backbones.dino_swin import DINO_SWIN_NAMES, SwinTransformer
from visiontf.models.deformable_detr.dino_convert import convert_state_dict
from visiontf.set_prediction import build_postprocess

#: the published DINO-4scale Swin models visiontf registers, and their sections of published_layouts.txt
REGISTERED = {"dino_swin_large_4scale": ("DINO_4scale_swin", "swin_L_384_22k"), "dino_swin_tiny_4scale": ("DINO_4scale_swin_T", "swin_T_224_1k")}


def _spec(settings: dict) -> dict:
    return {k: tuple(v) if isinstance(v, list) else v for k, v in settings.items()}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_swin_equals_the_original_off_the_window_grid(dtype):
    """Window 12, every stage: images of 57x90, 48x48 and 35x61 (stage maps smaller than a window, odd sides merged)."""
    fx = fixture("swin_backbone_w12")
    ours = SwinTransformer(**_spec(fx.meta["settings"]["swin"])).eval()
    ours.load_state_dict(original_state(fx))
    ours.to(getattr(torch, dtype))
    theirs = fx.outputs[dtype]
    for i, (h, w) in enumerate(fx.meta["settings"]["image_sizes"]):
        image = fx.inputs[f"image{i}"].to(getattr(torch, dtype))
        assert image.shape[-2:] == (h, w)
        with torch.no_grad():
            maps = ours(image)
        assert len(maps) == 4
        for j, got in enumerate(maps):
            expected = theirs[f"image{i}.{j}"]
            assert got.shape == expected.shape
            assert (got.double() - expected.double()).abs().max() < TOL[dtype], (i, j)


@pytest.fixture(scope="module")
def swin_checkpoint(tmp_path_factory):
    return save_checkpoint(fixture("swin_4scale"), tmp_path_factory.mktemp("dino_swin") / "checkpoint0011_4scale_swin.pth")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_dino_swin_checkpoint_gives_the_original_outputs(dtype, swin_checkpoint, monkeypatch):
    """Backbone maps (window 7, a padded 48x72 batch), every decoder layer, the proposals and the detections."""
    fx = fixture("swin_4scale")
    assert fx.meta["measured"]["ranking_margin"] > 100 * 1e-6 and fx.meta["measured"]["padded_anchors_per_image"][1] == 15
    assert any(k.startswith("backbone.0.layers.") for k in fx.weights)
    model = load_model("swin_4scale", swin_checkpoint, monkeypatch, name="dino_swin_large_4scale").to(getattr(torch, dtype))
    theirs = fx.outputs[dtype]
    images, mask = fx.inputs["images"].to(getattr(torch, dtype)), fx.inputs["mask"]
    with torch.no_grad():
        maps = model.backbone.forward_maps(images)
        out = model(images, mask)
        detections = build_postprocess(model)(out, fx.inputs["sizes"])
    assert len(maps) == 3 and all(maps[i].shape == theirs[f"backbone.{i}"].shape for i in range(3))
    assert max((maps[i].double() - theirs[f"backbone.{i}"].double()).abs().max().item() for i in range(3)) < TOL[dtype]
    assert theirs["pred_boxes"].std() > 0.05
    diffs = differences(named_outputs(out), theirs)
    assert max(diffs.values()) < TOL[dtype], diffs
    assert_same_detections(detections, theirs, fx.inputs["sizes"], DETECTION_TOL[dtype])


@pytest.mark.parametrize("name", sorted(DINO_SWIN_NAMES))
def test_full_layouts_equal_the_originals(name):
    """Every Swin DINO's code names, at full width: the same tensors and shapes as its build_swin_transformer's."""
    sections = {backbone: section for section, backbone in REGISTERED.values()}
    if name in sections:  # inside the published DINO models, under backbone.0.
        layout = {k.removeprefix("backbone.0."): v for k, v in published()[sections[name]][1].items() if k.startswith("backbone.0.")}
    else:
        layout = published()[name][1]
    embed_dim = DINO_SWIN_NAMES[name][0]
    with torch.device("meta"):
        ours = build_backbone(name, num_levels=3)
    assert {k: v.shape for k, v in ours.body.state_dict().items()} == layout
    assert ours.channels == [2 * embed_dim, 4 * embed_dim, 8 * embed_dim] and ours.strides == [8, 16, 32]
    if name not in sections:
        assert sum(p.numel() for p in ours.body.parameters()) == published()[name][0]


@pytest.mark.parametrize("model_name", sorted(REGISTERED))
def test_published_dino_swin_count_and_layout_equal_the_originals(model_name):
    """DINO_4scale_swin.py (Swin-L/12; and with Swin-T/7) at full width: the parameter count, every tensor mapped."""
    section = REGISTERED[model_name][0]
    with torch.device("meta"):
        model = create_model(model_name)
    assert sum(p.numel() for p in model.parameters()) == published()[section][0]
    own = model.state_dict()
    converted = convert_state_dict(published_state(section), model)
    assert set(converted) == set(own)
    assert all(converted[k].shape == own[k].shape for k in own)


def test_release_weights_load_and_refusals(tmp_path):
    """A Swin ImageNet release (no output norms; classifier, final norm and masks, which are dropped) loads into the backbone."""
    fx = fixture("swin_4scale")
    tiny = _spec({k: v for k, v in fx.meta["settings"]["small_swin"].items() if k != "window_size"})
    swin = {k.removeprefix("backbone.0."): v for k, v in original_state(fx).items() if k.startswith("backbone.0.")}
    width = 8 * tiny["embed_dim"]
    release = {k: v for k, v in swin.items() if not k.startswith("norm")}
    release.update({"norm.weight": torch.ones(width), "head.weight": torch.zeros(5, width), "layers.0.blocks.1.attn_mask": torch.zeros(1)})
    path = tmp_path / "swin_tiny_patch4_window7_224.pth"
    torch.save({"model": release}, path)
    bb = build_backbone("swin_T_224_1k", pretrained=path, num_levels=3, window_size=7, **tiny)
    torch.testing.assert_close(bb.body.layers[2].blocks[1].attn.qkv.weight, swin["layers.2.blocks.1.attn.qkv.weight"])
    torch.save({"model": {k: v for k, v in release.items() if "layers.3" not in k}}, path)
    with pytest.raises(RuntimeError, match="missing"):
        build_backbone("swin_T_224_1k", pretrained=path, window_size=7, **tiny)
    with pytest.raises(ValueError, match=r"0 \(stride 4\), 1 \(stride 8\)"):
        build_backbone("swin_T_224_1k", out_indices=(2, 4), **tiny)
    with pytest.raises(ValueError, match="dilation"):
        build_backbone("swin_L_384_22k", dilation=True)
    frozen = build_backbone("swin_T_224_1k", frozen_stages=1, **tiny)
    assert not frozen.body.layers[1].blocks[0].attn.qkv.weight.requires_grad and frozen.body.layers[2].blocks[0].attn.qkv.weight.requires_grad
    assert all(p.requires_grad for p in build_backbone("swin_T_224_1k", freeze_stem=False, **tiny).parameters())
