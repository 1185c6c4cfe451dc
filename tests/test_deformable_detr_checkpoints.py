"""Original fundamentalvision/Deformable-DETR and HuggingFace checkpoints load with their exact outputs.

The original repository needs a compiled extension, so ``benchmarks/reference_deformable_detr.py``
re-implements its module tree (same key layout, heads registered twice as the original does) with
its pure-PyTorch attention core. Toy sizes (ResNet-18, d 64, 2+2 layers) of all three variants;
the R50 layouts are checked key by key on the meta device. Cost: about 15 s.
"""
from __future__ import annotations

import logging
import re

import pytest
import torch
from deformable_helpers import TOY, VARIANTS, inputs, max_diff, original, randomize
from safetensors.torch import save_file, save_model

from visiontf.models import create_model
from visiontf.models.deformable_detr.convert import VARIANT_MODELS, checkpoint_variant, convert_state_dict, detect_format

TOL = 1e-4
#: a registered name per variant; the toy arguments override its sizes
NAMES = {variant: VARIANT_MODELS[variant] for variant in VARIANTS}


def _ours(variant: str, path, **kw):
    return create_model(NAMES[variant], pretrained=path, **{**TOY, **VARIANTS[variant], **kw}).eval()


def _compare(out: dict, ref: dict) -> float:
    """Max difference over final, auxiliary and two-stage outputs; checks they are not degenerate."""
    diffs = [max_diff(out["pred_logits"], ref["pred_logits"]), max_diff(out["pred_boxes"], ref["pred_boxes"])]
    assert len(out["aux_outputs"]) == len(ref["aux_outputs"])
    for a, b in zip(out["aux_outputs"], ref["aux_outputs"]):
        diffs += [max_diff(a["pred_logits"], b["pred_logits"]), max_diff(a["pred_boxes"], b["pred_boxes"])]
    if "enc_outputs" in ref:
        diffs += [max_diff(out["enc_outputs"][k], ref["enc_outputs"][k]) for k in ("pred_logits", "pred_boxes")]
    boxes = ref["pred_boxes"]
    assert boxes.std() > 0.02 and ref["pred_logits"].std() > 0.1
    return max(diffs)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_original_checkpoint_parity(variant, tmp_path):
    ref = original(variant)
    state = ref.state_dict()
    assert detect_format(state) == "original" and checkpoint_variant(state) == variant
    path = tmp_path / "r50_deformable_detr-checkpoint.pth"
    torch.save({"model": state, "epoch": 49}, path)
    model = _ours(variant, path)
    images, mask = inputs()
    with torch.no_grad():
        diff = _compare(model(images, mask), ref(images, mask))
    assert diff < TOL, diff


def _hf(variant: str, **cfg):
    transformers = pytest.importorskip("transformers")
    config = transformers.DeformableDetrConfig(
        backbone="resnet18", num_labels=5, encoder_layers=2, decoder_layers=2, d_model=64, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=96, decoder_ffn_dim=96, num_queries=12, two_stage_num_proposals=12,
        num_feature_levels=4, encoder_n_points=3, decoder_n_points=2, dropout=0.0, **VARIANTS[variant], **cfg,
    )
    hf = transformers.DeformableDetrForObjectDetection(config).eval()
    randomize(hf)
    return hf


def _v5_to_v4(state: dict) -> dict:
    """Undo transformers v5's run-time renames: the names of the checkpoints on the Hub."""
    out = {}
    for k, v in state.items():
        k = k.replace("model.backbone.model.", "model.backbone.conv_encoder.model.").replace(".o_proj.", ".out_proj.")
        out[re.sub(r"layers\.(\d+)\.mlp\.fc([12])\.", r"layers.\1.fc\2.", k)] = v
    return out


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_hf_checkpoint_parity(variant, tmp_path):
    hf = _hf(variant)
    installed = hf.state_dict()
    assert checkpoint_variant(installed) == variant
    images, mask = inputs(H=96, W=128)
    with torch.no_grad():
        ref = hf(pixel_values=images, pixel_mask=(~mask).long())  # HF: 1 on valid pixels
    # save_model (as save_pretrained) stores tied heads once; the other files hold every key
    save_model(hf, str(tmp_path / "hf_deduplicated.safetensors"))
    for name, state in (("installed", installed), ("v4", _v5_to_v4(installed)), ("deduplicated", None)):
        path = tmp_path / f"hf_{name}.safetensors"
        if state is not None:
            save_file({k: v.clone() for k, v in state.items()}, str(path))
        model = _ours(variant, path, num_classes=5)
        with torch.no_grad():
            out = model(images, mask)
        diff = max(max_diff(out["pred_logits"], ref.logits), max_diff(out["pred_boxes"], ref.pred_boxes))
        assert diff < TOL, (name, diff)
        assert ref.pred_boxes.std() > 0.02 and ref.logits.std() > 0.1


@pytest.mark.parametrize("found, wanted", [("two_stage", "plain"), ("plain", "box_refine"), ("box_refine", "two_stage")])
def test_checkpoint_of_another_variant_is_refused(found, wanted, tmp_path):
    path = tmp_path / "other.pth"
    torch.save({"model": original(found).state_dict()}, path)
    expected = re.escape(f"use create_model('{VARIANT_MODELS[found]}'")
    with pytest.raises(ValueError, match=f"{found.replace('_', '-')} Deformable DETR .* {expected}"):
        _ours(wanted, path)


def test_own_checkpoint_of_another_variant_is_refused():
    own = create_model("deformable_detr_tiny", two_stage=True)
    plain = create_model("deformable_detr_tiny", with_box_refine=False)
    with pytest.raises(ValueError, match="deformable_detr_resnet50_two_stage"):
        convert_state_dict(own.state_dict(), plain)
    assert set(convert_state_dict(own.state_dict(), own)) == set(own.state_dict())


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_r50_layouts_map_onto_every_tensor(variant):
    """The published R50 checkpoints' layout (built on the meta device) covers every tensor, shapes included."""
    from benchmarks.reference_deformable_detr import OriginalDeformableDETR

    transformers = pytest.importorskip("transformers")
    model = create_model(NAMES[variant])
    own = model.state_dict()
    with torch.device("meta"):
        ref = OriginalDeformableDETR(**VARIANTS[variant])
    states = [ref.state_dict()]
    if variant != "plain":  # the HF default (a timm R50) on the meta device; plain ties heads at init
        with torch.device("meta"):
            hf = transformers.DeformableDetrForObjectDetection(
                transformers.DeformableDetrConfig(use_pretrained_backbone=False, num_labels=91, **VARIANTS[variant])
            )
        states += [hf.state_dict(), _v5_to_v4(hf.state_dict())]
    for state in states:
        converted = convert_state_dict(state, model)
        assert set(converted) == set(own)
        assert all(converted[k].shape == own[k].shape for k in own)


def test_finetune_other_num_classes_drops_only_class_heads(tmp_path, caplog):
    ref = original("box_refine")
    path = tmp_path / "ckpt.pth"
    torch.save({"model": ref.state_dict()}, path)
    with caplog.at_level(logging.WARNING):
        model = _ours("box_refine", path, num_classes=3)
    dropped = [r.getMessage() for r in caplog.records if "class head not loaded" in r.getMessage()]
    assert len(dropped) == 1 and "class_embed.1.weight" in dropped[0] and "bbox_embed" not in dropped[0]
    assert model.class_embed[0].out_features == 3
    assert torch.equal(model.bbox_embed[1].layers[2].weight, ref.bbox_embed[1].layers[2].weight)


def test_unknown_layout_lists_keys():
    model = create_model("deformable_detr_tiny")
    with pytest.raises(ValueError, match="unrecognised Deformable DETR checkpoint layout.*'foo.weight'"):
        convert_state_dict({"foo.weight": torch.zeros(1), "bar.bias": torch.zeros(1)}, model)
