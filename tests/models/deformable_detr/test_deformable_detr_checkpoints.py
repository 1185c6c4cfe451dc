"""Original fundamentalvision/Deformable-DETR and HuggingFace checkpoints load with their exact outputs.

The original's outputs are recorded fixtures (``tests/fixtures/deformable_detr/``, written by
``scripts/fixtures/make_deformable_detr.py`` from the real repository): random weights in its key layout, a
padded batch of two images of different sizes, and what its own code computed in float32 and float64. Each
checkpoint is loaded as a user loads a model-zoo file, ``create_model(name, pretrained="....pth")``. The
published R50 layouts are the original's own key list (``r50_layouts.txt``). HuggingFace's model runs here
(transformers is a dev dependency). Cost: about 10 s.
"""
from __future__ import annotations

import logging
import re

import pytest
import torch
from deformable_helpers import (
    VARIANTS,
    checkpoint,
    fixture,
    fixture_kwargs,
    flatten,
    inputs,
    load_recorded,
    max_diff,
    r50_layouts,
    save_checkpoint,
    toy,
)
from deformable_helpers import hf_deformable_detr as _hf
from safetensors.torch import save_file, save_model

from visiontf.models import create_model
from visiontf.models.deformable_detr.convert import VARIANT_MODELS, checkpoint_variant, convert_state_dict, detect_format
from visiontf.set_prediction import DeformablePostProcess

#: largest difference to the original's outputs allowed, per dtype
TOL = {torch.float32: 1e-4, torch.float64: 1e-8}
#: a registered name per variant; the fixture's keywords override its sizes
NAMES = {variant: VARIANT_MODELS[variant] for variant in VARIANTS}
#: the recorded output tensors (the other entries of a record are losses, matchings, gradients, detections)
_OUTPUTS = ("pred_logits", "pred_boxes", "aux_outputs.", "enc_outputs.")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_original_checkpoint_gives_the_original_outputs(variant, dtype, tmp_path):
    fx = fixture(variant)
    model = load_recorded(variant, save_checkpoint(fx, tmp_path / "r50_deformable_detr-checkpoint.pth"), dtype)
    recorded = fx.outputs[str(dtype)[6:]]
    with torch.no_grad():
        out = flatten(model(fx.inputs["images"].to(dtype), fx.inputs["mask"]))
    expected = {k: v for k, v in recorded.items() if k.startswith(_OUTPUTS)}
    assert set(out) == set(expected)
    diffs = {k: max_diff(out[k], v) for k, v in expected.items()}
    assert max(diffs.values()) < TOL[dtype], diffs
    # not degenerate: boxes and logits vary, the padded image differs from the other
    assert expected["pred_boxes"].std() > 0.02 and expected["pred_logits"].std() > 0.1
    assert len([k for k in expected if k.startswith("aux_outputs.")]) == 2 * (fx.meta["settings"]["dec_layers"] - 1)
    assert ("enc_outputs.pred_logits" in expected) == (variant == "two_stage")


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_postprocess_of_the_loaded_model_gives_the_original_detections(variant, tmp_path):
    """In float64 (no near-ties among the top-100 (query, class) scores) the original's PostProcess detections;
    visiontf returns them in float32 (COCO-ready), hence the float32 rounding allowed."""
    fx = fixture(variant)
    model = load_recorded(variant, save_checkpoint(fx, tmp_path / "ckpt.pth"), torch.float64)
    with torch.no_grad():
        out = model(fx.inputs["images"].double(), fx.inputs["mask"])
    detections = DeformablePostProcess()(out, fx.inputs["target_sizes"])
    recorded = fx.outputs["float64"]
    for b, det in enumerate(detections):
        assert torch.equal(det["labels"], recorded[f"detections.{b}.labels"])
        assert max_diff(det["scores"], recorded[f"detections.{b}.scores"]) < 1e-6
        assert max_diff(det["boxes"], recorded[f"detections.{b}.boxes"]) < 1e-4  # pixels


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_key_mapping_and_parameter_count(variant):
    """Every tensor of the original's checkpoint has its place; the repeated heads are dropped, nothing is left over."""
    fx = fixture(variant)
    state = checkpoint(fx)
    assert len(state) == fx.meta["state_dict_entries"]
    assert detect_format(state) == "original" and checkpoint_variant(state) == variant
    model = create_model(NAMES[variant], **fixture_kwargs(fx))
    own = model.state_dict()
    converted = convert_state_dict(state, model)
    assert set(converted) == set(own) and all(converted[k].shape == own[k].shape for k in own)
    assert sum(p.numel() for p in model.parameters()) == fx.meta["parameters"]
    # the heads: visiontf keeps one per prediction, the original repeats them (plain) or registers them twice
    repeated = {k for k in state if k.startswith(("transformer.decoder.class_embed.", "transformer.decoder.bbox_embed."))}
    assert bool(repeated) == (variant != "plain")
    heads = {"plain": 1}.get(variant, fx.meta["settings"]["dec_layers"] + (variant == "two_stage"))
    assert len(model.class_embed) == heads


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
        model = create_model(NAMES[variant], pretrained=path, **toy(variant, num_classes=5)).eval()
        with torch.no_grad():
            out = model(images, mask)
        diff = max(max_diff(out["pred_logits"], ref.logits), max_diff(out["pred_boxes"], ref.pred_boxes))
        assert diff < TOL[torch.float32], (name, diff)
        assert ref.pred_boxes.std() > 0.02 and ref.logits.std() > 0.1


@pytest.mark.parametrize("found, wanted", [("two_stage", "plain"), ("plain", "box_refine"), ("box_refine", "two_stage")])
def test_checkpoint_of_another_variant_is_refused(found, wanted, tmp_path):
    path = save_checkpoint(fixture(found), tmp_path / "other.pth")
    expected = re.escape(f"use create_model('{VARIANT_MODELS[found]}'")
    with pytest.raises(ValueError, match=f"{found.replace('_', '-')} Deformable DETR .* {expected}"):
        load_recorded(wanted, path)


def test_own_checkpoint_of_another_variant_is_refused():
    own = create_model("deformable_detr_tiny", arch={"two_stage": True})
    plain = create_model("deformable_detr_tiny", arch={"with_box_refine": False})
    with pytest.raises(ValueError, match="deformable_detr_resnet50_two_stage"):
        convert_state_dict(own.state_dict(), plain)
    assert set(convert_state_dict(own.state_dict(), own)) == set(own.state_dict())


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_r50_layouts_map_onto_every_tensor(variant):
    """The published R50 checkpoints' layout (the original's own key list) covers every tensor, shapes included."""
    transformers = pytest.importorskip("transformers")
    parameters, layout = r50_layouts()[variant]
    with torch.device("meta"):
        model = create_model(NAMES[variant])
    own = model.state_dict()
    assert sum(p.numel() for p in model.parameters()) == parameters
    states = [{k: torch.empty(shape, device="meta") for k, shape in layout.items()}]
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
    fx = fixture("box_refine")
    state = checkpoint(fx)
    with caplog.at_level(logging.WARNING):
        model = load_recorded("box_refine", save_checkpoint(fx, tmp_path / "ckpt.pth"), num_classes=3)
    dropped = [r.getMessage() for r in caplog.records if "class head not loaded" in r.getMessage()]
    assert len(dropped) == 1 and "class_embed.1.weight" in dropped[0] and "bbox_embed" not in dropped[0]
    assert model.class_embed[0].out_features == 3
    assert torch.equal(model.bbox_embed[1].layers[2].weight, state["bbox_embed.1.layers.2.weight"])


def test_unknown_layout_lists_keys():
    model = create_model("deformable_detr_tiny")
    with pytest.raises(ValueError, match="unrecognised Deformable DETR checkpoint layout.*'foo.weight'"):
        convert_state_dict({"foo.weight": torch.zeros(1), "bar.bias": torch.zeros(1)}, model)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_benchmark_baseline_reproduces_the_recorded_original(variant, monkeypatch):
    """``tests/reference/deformable_detr.py`` (the original's design, rewritten for the speed baselines) gives
    what the original computed: the checkpoint loads key for key and the float64 outputs agree."""
    import timm
    import torchvision
    from reference.deformable_detr import OriginalDeformableDETR

    fx = fixture(variant)
    settings, backbone = fx.meta["settings"], dict(fx.meta["backbone"])

    def reduced_resnet(norm_layer, **_):  # the fixture's ResNet where the baseline asks torchvision for resnet50
        return timm.create_model(backbone.pop("timm"), num_classes=0, norm_layer=lambda c, **__: norm_layer(c), **backbone)

    monkeypatch.setattr(torchvision.models, "resnet50", reduced_resnet)
    keys = ("num_queries", "enc_layers", "dec_layers", "nheads", "dim_feedforward", "enc_n_points", "dec_n_points", "with_box_refine",
            "two_stage", "num_feature_levels")
    model = OriginalDeformableDETR(num_classes=fx.meta["num_classes"], d=settings["hidden_dim"], dropout=0.0,
                                   **{k: settings[k] for k in keys})
    model.load_state_dict(checkpoint(fx))
    with torch.no_grad():
        out = flatten(model.double().eval()(fx.inputs["images"].double(), fx.inputs["mask"]))
    recorded = fx.outputs["float64"]
    assert max(max_diff(v, recorded[k]) for k, v in out.items()) < 1e-12
