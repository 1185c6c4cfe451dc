"""Loading original facebookresearch/detr and HuggingFace DETR weights gives their exact outputs.

The original repository cannot be imported here; ``benchmarks/reference_detr.py`` re-implements
its architecture (sequence-first, ``nn.MultiheadAttention``, the original parameter names), so its
``state_dict()`` has the published checkpoints' key layout (458 keys for R50 with sine PE). The
benchmarks time visiontf against the same reference.
"""
from __future__ import annotations

import logging
import math
import re
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from visiontf.models import create_model
from visiontf.models.detr.convert import convert_state_dict, detect_format

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ is not an installed package
from benchmarks.reference_detr import OriginalDETR  # noqa: E402

TOL = 1e-4


# --------------------------------------------------------------------------- helpers
_TABLES = ("query_embed.weight", "row_embed.weight", "col_embed.weight", "query_position_embeddings.weight",
           "row_embeddings.weight", "column_embeddings.weight")


def _randomize(module: nn.Module) -> None:
    """Non-trivial values everywhere (LayerNorm/BN affine and BN statistics too), with moderate activations."""
    with torch.no_grad():
        for name, t in list(module.named_parameters()) + list(module.named_buffers()):
            if not t.is_floating_point():
                continue
            if name.endswith("running_var"):
                t.uniform_(0.5, 1.5)
            elif name.endswith("running_mean"):
                t.normal_(0, 0.1)
            elif t.dim() == 1 and ("norm" in name or "bn" in name or "downsample.1" in name or "normalization" in name):
                t.copy_((0.5 if name.endswith("weight") else 0.0) + 0.1 * torch.randn_like(t))
            elif name.endswith(_TABLES):
                t.normal_(0, 1)
            else:
                t.normal_(0, 1.0 / math.sqrt(max(1, t[0].numel() if t.dim() > 1 else 16)))


def _inputs(B=2, H=96, W=128):
    images = torch.randn(B, 3, H, W)
    mask = torch.zeros(B, H, W, dtype=torch.bool)
    mask[1, :, 3 * W // 4 :] = True  # the second image is padded on the right
    mask[1, 5 * H // 6 :, :] = True  # ... and at the bottom
    images[mask[:, None].expand_as(images)] = 0
    return images, mask


def _max_diff(a, b):
    return (a - b).abs().max().item()


# --------------------------------------------------------------------------- original checkpoints
@pytest.mark.slow
def test_original_r50_checkpoint_parity(tmp_path):
    ref = OriginalDETR().eval()
    _randomize(ref)
    state = ref.state_dict()
    assert len(state) == 458  # the published R50 checkpoint's key count (REFERENCE.md)
    assert detect_format(state) == "original"
    path = tmp_path / "detr-r50-e632da11.pth"
    torch.save({"model": state}, path)

    model = create_model("detr_resnet50", pretrained=path).eval()
    images, mask = _inputs()
    with torch.no_grad():
        ref_logits, ref_boxes = ref(images, mask)
        out = model(images, mask)
    assert _max_diff(out["pred_logits"], ref_logits[-1]) < TOL
    assert _max_diff(out["pred_boxes"], ref_boxes[-1]) < TOL
    assert len(out["aux_outputs"]) == 5
    for i, aux in enumerate(out["aux_outputs"]):
        assert _max_diff(aux["pred_logits"], ref_logits[i]) < TOL
        assert _max_diff(aux["pred_boxes"], ref_boxes[i]) < TOL
    # the comparison is meaningful only if boxes are not saturated and logits vary
    assert 0.02 < ref_boxes.median() < 0.98 and ref_boxes.std() > 0.02 and ref_logits.std() > 0.1


@pytest.mark.slow
def test_original_dc5_learned_pe_checkpoint_parity(tmp_path):
    """Small original-layout model: DC5 dilation and the learned position embedding (``backbone.1.*``)."""
    kw = dict(num_classes=7, backbone="resnet50", dilation=True, d=64, h=4, ne=2, nd=2, ff=96, nq=10, pe="learned")
    ref = OriginalDETR(**kw).eval()
    _randomize(ref)
    state = ref.state_dict()
    assert "backbone.1.row_embed.weight" in state
    path = tmp_path / "small.pth"
    torch.save({"model": state, "epoch": 3}, path)
    model = create_model(
        "detr_tiny", pretrained=path, num_classes=7, backbone="resnet50", dilation=True, hidden_dim=64, nheads=4, enc_layers=2,
        dec_layers=2, dim_feedforward=96, num_queries=10, position_embedding="learned",
    ).eval()
    images, mask = _inputs(H=64, W=64)
    with torch.no_grad():
        ref_logits, ref_boxes = ref(images, mask)
        out = model(images, mask)
    assert out["pred_logits"].shape == (2, 10, 8)
    assert _max_diff(out["pred_logits"], ref_logits[-1]) < TOL
    assert _max_diff(out["pred_boxes"], ref_boxes[-1]) < TOL
    assert _max_diff(out["aux_outputs"][0]["pred_boxes"], ref_boxes[0]) < TOL
    assert 0.02 < ref_boxes.median() < 0.98 and ref_boxes.std() > 0.02


# --------------------------------------------------------------------------- HuggingFace
def _hf_model(**cfg):
    transformers = pytest.importorskip("transformers")
    config = transformers.DetrConfig(use_pretrained_backbone=False, **cfg)
    hf = transformers.DetrForObjectDetection(config).eval()
    _randomize(hf)
    return hf


def _v5_to_v4(state: dict) -> dict:
    """Undo transformers v5's run-time renames, giving the names of checkpoints on the Hub."""
    out = {}
    for k, v in state.items():
        k = k.replace("model.backbone.model.", "model.backbone.conv_encoder.model.")
        k = k.replace("model.position_embedding.", "model.backbone.position_embedding.")
        k = k.replace(".o_proj.", ".out_proj.")
        k = re.sub(r"layers\.(\d+)\.mlp\.fc([12])\.", r"layers.\1.fc\2.", k)
        out[k] = v
    return out


_SMALL = dict(backbone="resnet18", num_labels=5, encoder_layers=2, decoder_layers=2, d_model=64, encoder_attention_heads=4,
              decoder_attention_heads=4, encoder_ffn_dim=96, decoder_ffn_dim=96, num_queries=12)
_OURS = dict(num_classes=5, hidden_dim=64, nheads=4, enc_layers=2, dec_layers=2, dim_feedforward=96, num_queries=12)


def _compare_hf(hf, model):
    images, mask = _inputs(H=64, W=96)
    with torch.no_grad():
        ref = hf(pixel_values=images, pixel_mask=(~mask).long())  # HF: 1 on valid pixels
        out = model(images, mask)
    d_logits = _max_diff(out["pred_logits"], ref.logits)
    d_boxes = _max_diff(out["pred_boxes"], ref.pred_boxes)
    assert d_logits < TOL and d_boxes < TOL, (d_logits, d_boxes)
    assert 0.02 < ref.pred_boxes.median() < 0.98 and ref.pred_boxes.std() > 0.02 and ref.logits.std() > 0.1


def test_hf_timm_backbone_parity(tmp_path):
    """The installed transformers' names and the v4 names of Hub checkpoints."""
    hf = _hf_model(**_SMALL)
    installed = hf.state_dict()
    v4 = _v5_to_v4(installed) if any(".o_proj." in k for k in installed) else installed
    assert any(k.startswith("model.backbone.conv_encoder.model.") for k in v4)
    for name, state in (("installed", installed), ("v4", v4)):
        path = tmp_path / f"hf_{name}.safetensors"
        save_file({k: v.contiguous() for k, v in state.items()}, str(path))
        model = create_model("detr_tiny", pretrained=path, **_OURS).eval()
        _compare_hf(hf, model)


def test_hf_learned_position_embedding_v4_names(tmp_path):
    hf = _hf_model(**_SMALL, position_embedding_type="learned")
    state = _v5_to_v4(hf.state_dict())
    assert "model.backbone.position_embedding.row_embeddings.weight" in state
    path = tmp_path / "hf.pth"
    torch.save(state, path)
    model = create_model("detr_tiny", pretrained=path, position_embedding="learned", **_OURS).eval()
    _compare_hf(hf, model)


def test_hf_resnet_backbone_parity(tmp_path):
    """``use_timm_backbone=False`` checkpoints (HF ResNet: ``embedder``/``encoder.stages`` names)."""
    transformers = pytest.importorskip("transformers")
    rc = transformers.ResNetConfig(layer_type="basic", depths=[2, 2, 2, 2], hidden_sizes=[64, 128, 256, 512], out_features=["stage4"])
    small = {k: v for k, v in _SMALL.items() if k != "backbone"}
    hf = _hf_model(**small, use_timm_backbone=False, backbone_config=rc)
    path = tmp_path / "hf.safetensors"
    save_file({k: v.contiguous() for k, v in hf.state_dict().items()}, str(path))
    model = create_model("detr_tiny", pretrained=path, **_OURS).eval()
    _compare_hf(hf, model)


@pytest.mark.slow
def test_hf_default_r50_key_mapping():
    """The default HF R50 (the layout of facebook/detr-resnet-50) maps onto every detr_resnet50 tensor."""
    transformers = pytest.importorskip("transformers")
    with torch.device("meta"):
        hf = transformers.DetrForObjectDetection(transformers.DetrConfig(use_pretrained_backbone=False, num_labels=91))
    model = create_model("detr_resnet50")
    own = model.state_dict()
    for state in (hf.state_dict(), _v5_to_v4(hf.state_dict())):
        converted = convert_state_dict(state, model)
        assert set(converted) == set(own)
        assert all(converted[k].shape == own[k].shape for k in own)


# --------------------------------------------------------------------------- fine-tuning and errors
def test_finetune_other_num_classes_drops_only_class_head(tmp_path, caplog):
    kw = dict(num_classes=7, backbone="resnet18", d=64, h=4, ne=1, nd=1, ff=96, nq=10)
    ref = OriginalDETR(**kw)
    _randomize(ref)
    path = tmp_path / "small.pth"
    torch.save({"model": ref.state_dict()}, path)
    ours = dict(hidden_dim=64, nheads=4, enc_layers=1, dec_layers=1, dim_feedforward=96, num_queries=10)
    with caplog.at_level(logging.WARNING):
        model = create_model("detr_tiny", pretrained=path, num_classes=3, **ours)
    dropped = [r.getMessage() for r in caplog.records if "class head not loaded" in r.getMessage()]
    assert len(dropped) == 1 and "class_embed.weight" in dropped[0] and "class_embed.bias" in dropped[0]
    assert "bbox_embed" not in dropped[0]
    assert model.class_embed.out_features == 4
    assert torch.equal(model.bbox_embed.layers[2].weight, ref.bbox_embed.layers[2].weight)
    assert torch.equal(model.query_embed.weight, ref.query_embed.weight)


def test_unknown_layout_error_lists_keys():
    model = create_model("detr_tiny")
    with pytest.raises(ValueError, match="unrecognised DETR checkpoint layout.*'foo.weight'"):
        convert_state_dict({"foo.weight": torch.zeros(1), "bar.bias": torch.zeros(1)}, model)


def test_own_keys_pass_through_and_counters_dropped():
    model = create_model("detr_tiny")
    state = dict(model.state_dict())
    state["backbone.body.bn1.num_batches_tracked"] = torch.tensor(5)
    converted = convert_state_dict(state, model)
    assert set(converted) == set(model.state_dict())
