"""DETR's mask head: the original panoptic layout and HF ``DetrForSegmentation`` load strictly and give
their outputs (logits, boxes, mask logits) within 1e-4.

The original cannot be imported here: ``benchmarks/reference_detr_segm.py`` re-creates its
``DETRsegm`` (checked against the fetched original by ``benchmarks/detr_segm_parity.py``, result in
docs/segmentation.md).
"""
from __future__ import annotations

import logging
import re
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from visiontf.models import create_model
from visiontf.models.detr.convert import convert_state_dict
from visiontf.models.detr.segm import MASK_HEAD_PREFIXES

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ is not an installed package
from benchmarks.reference_detr_segm import OriginalDETRsegm  # noqa: E402
from tests.test_detr_checkpoints import _inputs, _max_diff, _randomize, _v5_to_v4  # noqa: E402

TOL = 1e-4
#: a small transformer the mask head accepts (GroupNorm: 128 + 8 and 128 / 16 divisible by 8)
_REF = dict(d=128, h=8, ne=2, nd=2, ff=160, nq=10, num_classes=9)
_OURS = dict(num_classes=9, hidden_dim=128, nheads=8, enc_layers=2, dec_layers=2, dim_feedforward=160, num_queries=10)


def _compare(want: dict, got: dict) -> None:
    for key in ("pred_logits", "pred_boxes", "pred_masks"):
        assert got[key].shape == want[key].shape, key
        assert _max_diff(got[key], want[key]) < TOL, (key, _max_diff(got[key], want[key]))
    for a, b in zip(got["aux_outputs"], want["aux_outputs"]):
        assert _max_diff(a["pred_boxes"], b["pred_boxes"]) < TOL
    # meaningful only if the masks vary and the boxes are not saturated
    assert want["pred_masks"].std() > 0.05 and 0.02 < want["pred_boxes"].median() < 0.98


def _original_checkpoint(tmp_path, name="segm.pth", **kw):
    ref = OriginalDETRsegm(**{**_REF, **kw}).eval()
    _randomize(ref)
    path = tmp_path / name
    torch.save({"model": ref.state_dict()}, path)
    return ref, path


def test_original_layout_resnet18(tmp_path):
    ref, path = _original_checkpoint(tmp_path, backbone="resnet18")
    assert {k.split(".")[0] for k in ref.state_dict()} == {"detr", "bbox_attention", "mask_head"}
    model = create_model("detr_tiny_masks", pretrained=path, backbone="resnet18", mask_heads=None, **_OURS).eval()
    images, mask = _inputs(H=96, W=128)
    with torch.no_grad():
        want, got = ref(images, mask), model(images, mask)
    assert got["pred_masks"].shape == (2, 10, 24, 32)
    _compare(want, got)
    # without padding (no mask: the fused attention path) the same numbers as an all-valid mask
    with torch.no_grad():
        unpadded = model(images[:1])
        ref_unpadded = ref(images[:1], torch.zeros_like(mask[:1]))
    assert _max_diff(unpadded["pred_masks"], ref_unpadded["pred_masks"]) < TOL


@pytest.mark.slow
@pytest.mark.parametrize("name,dilation", [("detr_resnet50_panoptic", False), ("detr_resnet50_dc5_panoptic", True)])
def test_original_panoptic_checkpoint_layout(tmp_path, name, dilation):
    """R50 and R50-DC5 bodies under the original's panoptic layout (a small transformer)."""
    ref, path = _original_checkpoint(tmp_path, backbone="resnet50", dilation=dilation)
    model = create_model(name, pretrained=path, **_OURS).eval()
    assert model.mask_options.thing_classes == tuple(range(91))
    images, mask = _inputs(H=64, W=96)
    with torch.no_grad():
        _compare(ref(images, mask), model(images, mask))


def test_registered_panoptic_names_have_the_original_layout():
    """Every published variant (built on the meta device) takes the full-size original layout: R50's
    490 keys (DETR's 458, bbox_attention 4, mask_head 28), exactly."""
    for name, backbone, dilation in (("detr_resnet50_panoptic", "resnet50", False),
                                     ("detr_resnet50_dc5_panoptic", "resnet50", True),
                                     ("detr_resnet101_panoptic", "resnet101", False)):
        with torch.device("meta"):
            model = create_model(name)
            ref = OriginalDETRsegm(backbone=backbone, dilation=dilation, num_classes=250)
        original = ref.state_dict()
        if backbone == "resnet50":
            assert len(original) == 490
        state = model.state_dict()
        converted = convert_state_dict(original, model)
        assert set(converted) == set(state), name
        assert all(converted[k].shape == state[k].shape for k in state), name
        assert model.num_classes == 250 and model.class_embed.out_features == 251
        assert state["mask_head.adapter1.weight"].shape == (128, 1024, 1, 1)
        assert state["mask_head.lay1.weight"].shape == (264, 264, 3, 3)


# --------------------------------------------------------------------------- HuggingFace
_HF_SMALL = dict(backbone="resnet18", num_labels=9, encoder_layers=2, decoder_layers=2, d_model=128, encoder_attention_heads=8,
                 decoder_attention_heads=8, encoder_ffn_dim=160, decoder_ffn_dim=160, num_queries=10)


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
            assert _max_diff(out[key], want) < TOL, (name, key, _max_diff(out[key], want))
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
    ref, path = _original_checkpoint(tmp_path, backbone="resnet18")
    with caplog.at_level(logging.WARNING):
        model = create_model("detr_tiny", pretrained=path, backbone="resnet18", **{k: v for k, v in _OURS.items()})
    assert any("dropped 32 tensors of the segmentation head" in r.getMessage() for r in caplog.records)
    assert torch.equal(model.query_embed.weight, ref.detr.query_embed.weight)


def test_frozen_detector_keeps_batchnorm_statistics():
    model = create_model("detr_tiny_masks", num_classes=3, frozen_bn=False, freeze_detector=True).train()
    bn = model.backbone.body.bn1
    assert not bn.training and model.mask_head.training and model.transformer.training
    before = bn.running_mean.clone()
    model(torch.randn(1, 3, 64, 64))
    assert torch.equal(bn.running_mean, before)


def test_group_norm_channels_are_checked():
    with pytest.raises(ValueError, match="divisible by 8"):
        create_model("detr_tiny_masks", num_classes=3, mask_heads=4)
