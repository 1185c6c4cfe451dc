"""DETR's mask head: the original panoptic layout and HF ``DetrForSegmentation`` load strictly and give their
outputs (logits, boxes, mask logits).

The original's are recorded: ``tests/fixtures/detr/detr_panoptic.safetensors`` (written by
``scripts/fixtures/make_detr.py`` from a checkout of facebookresearch/detr) holds a toy ``DETRsegm`` with random
weights in the original's panoptic layout and what the original computed with them, in float32 and float64, on a
padded batch of two images, on its DC5 body, and on the first image alone. The published layouts (R50, R50-DC5,
R101 panoptic) are checked key for key against the original's listing in ``tests/fixtures/detr/published_layouts.txt``.
"""
from __future__ import annotations

import logging
import re
from itertools import product

import pytest
import torch
from detr_helpers import _randomize
from reference.fixtures import load_fixture
from safetensors.torch import save_file
from test_detr_checkpoints import (
    DTYPES,
    PUBLISHED,
    _inputs,
    _max_diff,
    _v5_to_v4,
    assert_outputs,
    flat_outputs,
    load_original,
    original_checkpoint,
    published_layouts,
    toy_kwargs,
)

from visiontf.models import create_model
from visiontf.models.detr.convert import convert_state_dict
from visiontf.models.detr.detr_segm import MASK_HEAD_PREFIXES

#: the model each run of the fixture was made with, and its outputs' prefix there
_RUNS = {"r50": ("detr_resnet50_panoptic", "", {}), "dc5": ("detr_resnet50_dc5_panoptic", "dc5.", {"backbone": {"dilation": True}})}


def _recorded(fixture, dtype: str, prefix: str) -> dict[str, torch.Tensor]:
    out = fixture.outputs[dtype]
    if prefix:
        return {k[len(prefix):]: v for k, v in out.items() if k.startswith(prefix)}
    return {k: v for k, v in out.items() if "." not in k}


@pytest.mark.parametrize("run,dtype", list(product(_RUNS, DTYPES)))
def test_original_panoptic_outputs(tmp_path, run, dtype):
    """The original's panoptic layout on a plain and a DC5 body: ``pred_logits``, ``pred_boxes``, ``pred_masks``."""
    fixture = load_fixture("detr", "detr_panoptic")
    name, prefix, overrides = _RUNS[run]
    model = load_original(fixture, name, tmp_path / "panoptic.pth", dtype, **overrides)
    assert model.mask_options.thing_classes == tuple(range(91))
    with torch.no_grad():
        got = flat_outputs(model(fixture.inputs["images"].to(DTYPES[dtype]), fixture.inputs["mask"]))
    want = _recorded(fixture, dtype, prefix)
    assert set(want) == {"pred_logits", "pred_boxes", "pred_masks"}
    h, w = fixture.inputs["images"].shape[-2:]
    assert got["pred_masks"].shape == (2, model.num_queries, h // 4, w // 4)
    assert_outputs(got, want, dtype)
    # meaningful: the masks vary, and differ from query to query (the attention maps' path shows)
    assert want["pred_masks"].std() > 0.1 and want["pred_masks"].std(1).mean() > 0.005


@pytest.mark.parametrize("dtype", DTYPES)
def test_original_panoptic_without_padding(tmp_path, dtype):
    """One image and no mask (the attention's unmasked path) gives what the original computed for it alone."""
    fixture = load_fixture("detr", "detr_panoptic")
    model = load_original(fixture, "detr_resnet50_panoptic", tmp_path / "panoptic.pth", dtype)
    h, w = fixture.meta["image_sizes"][0]
    with torch.no_grad():
        got = flat_outputs(model(fixture.inputs["images"][:1, :, :h, :w].to(DTYPES[dtype])))
    assert_outputs(got, _recorded(fixture, dtype, "single."), dtype)


def test_original_panoptic_counts_and_key_mapping():
    fixture = load_fixture("detr", "detr_panoptic")
    weights = {k: v.float() for k, v in fixture.weights.items()}
    assert {k.split(".")[0] for k in weights} == {"detr", "bbox_attention", "mask_head"}
    model = create_model("detr_resnet50_panoptic", **toy_kwargs(fixture))
    assert sum(p.numel() for p in model.parameters()) == fixture.meta["counts"]["parameters"]
    converted = convert_state_dict(weights, model)
    assert set(converted) == set(model.state_dict())
    sources = {id(v): k for k, v in weights.items()}
    names = {sources[id(v)]: k for k, v in converted.items()}
    assert sorted(names) == sorted(weights)
    # the detector loses the wrapper's "detr." prefix, the heads keep the original's names
    assert names["detr.query_embed.weight"] == "query_embed.weight"
    assert all(names[k] == k for k in weights if k.startswith(MASK_HEAD_PREFIXES))


@pytest.mark.parametrize("layout", [k for k in PUBLISHED if "panoptic" in k])
def test_published_panoptic_layout(layout):
    """Every published panoptic model (built on the meta device) takes the original's full layout, exactly: R50's
    490 keys (DETR's 458, bbox_attention 4, mask_head 28), 250 classes, with the original's parameter count."""
    listed = published_layouts()[layout]
    with torch.device("meta"):
        model = create_model(PUBLISHED[layout])
        original = {k: torch.empty(shape) for k, shape in listed["keys"].items()}
    if layout == "detr-r50-panoptic":
        assert listed["entries"] == 490
        assert sum(k.startswith("bbox_attention.") for k in original) == 4
        assert sum(k.startswith("mask_head.") for k in original) == 28
    state = model.state_dict()
    converted = convert_state_dict(original, model)
    assert set(converted) == set(state), layout
    assert all(converted[k].shape == state[k].shape for k in state), layout
    assert sum(p.numel() for p in model.parameters()) == listed["parameters"]
    assert model.num_classes == 250 and model.class_embed.out_features == 251
    assert state["mask_head.adapter1.weight"].shape == (128, 1024, 1, 1)
    assert state["mask_head.lay1.weight"].shape == (264, 264, 3, 3)


# --------------------------------------------------------------------------- HuggingFace
_HF_SMALL = dict(backbone="resnet18", num_labels=9, encoder_layers=2, decoder_layers=2, d_model=128, encoder_attention_heads=8,
                 decoder_attention_heads=8, encoder_ffn_dim=160, decoder_ffn_dim=160, num_queries=10)
_OURS = dict(num_classes=9, arch=dict(hidden_dim=128, nheads=8, enc_layers=2, dec_layers=2, dim_feedforward=160, num_queries=10))


def _v5_mask_head_to_v4(state: dict) -> dict:
    """transformers v5's run-time names of the mask head back to the Hub's (the original's)."""
    rules = [(r"bbox_attention\.([qk])_proj\.", r"bbox_attention.\1_linear."),
             (r"mask_head\.conv([12])\.conv\.", r"mask_head.lay\1."), (r"mask_head\.conv([12])\.norm\.", r"mask_head.gn\1."),
             (r"mask_head\.fpn_stages\.(\d)\.fpn_adapter\.", lambda m: f"mask_head.adapter{int(m.group(1)) + 1}."),
             (r"mask_head\.fpn_stages\.(\d)\.refine\.conv\.", lambda m: f"mask_head.lay{int(m.group(1)) + 3}."),
             (r"mask_head\.fpn_stages\.(\d)\.refine\.norm\.", lambda m: f"mask_head.gn{int(m.group(1)) + 3}."),
             (r"mask_head\.output_conv\.", "mask_head.out_lay.")]
    out = {}
    for k, v in state.items():
        for pattern, repl in rules:
            k = re.sub(pattern, repl, k)
        out[k] = v
    return out


@pytest.mark.slow
def test_hf_detr_for_segmentation(tmp_path):
    transformers = pytest.importorskip("transformers")
    hf = transformers.DetrForSegmentation(transformers.DetrConfig(use_pretrained_backbone=False, **_HF_SMALL)).eval()
    _randomize(hf)
    installed = hf.state_dict()
    hub = _v5_mask_head_to_v4({("detr." + k[len("detr."):] if k.startswith("detr.") else k): v
                               for k, v in _v5_to_v4({k.removeprefix("detr."): v for k, v in installed.items()}).items()})
    hub = {(k if k.startswith(MASK_HEAD_PREFIXES) else "detr." + k): v for k, v in hub.items()}
    assert "mask_head.lay1.weight" in hub and "detr.model.backbone.conv_encoder.model.conv1.weight" in hub
    images, mask = _inputs(H=64, W=96)
    with torch.no_grad():
        ref = hf(pixel_values=images, pixel_mask=(~mask).long())
    for name, state in (("installed", installed), ("hub", hub)):
        path = tmp_path / f"hf_{name}.safetensors"
        save_file({k: v.contiguous() for k, v in state.items()}, str(path))
        model = create_model("detr_tiny_masks", pretrained=path, backbone="resnet18", mask_heads=None, **_OURS).eval()
        with torch.no_grad():
            out = model(images, mask)
        for key, want in (("pred_logits", ref.logits), ("pred_boxes", ref.pred_boxes), ("pred_masks", ref.pred_masks)):
            assert _max_diff(out[key], want) < 1e-4, (name, key, _max_diff(out[key], want))
    assert ref.pred_masks.std() > 0.05


# --------------------------------------------------------------------------- detector weights, freezing
def test_detector_weights_leave_the_mask_head_at_init(tmp_path, caplog):
    detector = create_model("detr_tiny", num_classes=4)
    path = tmp_path / "detector.pth"
    torch.save(detector.state_dict(), path)
    torch.manual_seed(3)
    with caplog.at_level(logging.WARNING):
        model = create_model("detr_tiny_masks", pretrained=path, num_classes=4, freeze_detector=True)
    assert any("no mask head" in r.getMessage() for r in caplog.records)
    assert torch.equal(model.query_embed.weight, detector.query_embed.weight)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(n.startswith(MASK_HEAD_PREFIXES) for n in trainable)
    assert any(n.startswith("mask_head.") for n in trainable) and any(n.startswith("bbox_attention.") for n in trainable)


def test_panoptic_weights_into_a_detector_drop_the_head(tmp_path, caplog):
    fixture = load_fixture("detr", "detr_panoptic")
    path = original_checkpoint(fixture, tmp_path / "panoptic.pth")
    with caplog.at_level(logging.WARNING):
        model = create_model("detr_resnet50", pretrained=path, **toy_kwargs(fixture))
    assert any("dropped 32 tensors of the segmentation head" in r.getMessage() for r in caplog.records)
    assert torch.equal(model.query_embed.weight, fixture.weights["detr.query_embed.weight"].float())


def test_frozen_detector_keeps_batchnorm_statistics():
    model = create_model("detr_tiny_masks", num_classes=3, backbone={"frozen_bn": False}, freeze_detector=True).train()
    bn = model.backbone.body.bn1
    assert not bn.training and model.mask_head.training and model.transformer.training
    before = bn.running_mean.clone()
    model(torch.randn(1, 3, 64, 64))
    assert torch.equal(bn.running_mean, before)


def test_group_norm_channels_are_checked():
    with pytest.raises(ValueError, match="divisible by 8"):
        create_model("detr_tiny_masks", num_classes=3, mask_heads=4)
