"""IDEA-Research/DINO's checkpoints load into ``dino_resnet50_4scale`` / ``_5scale`` with the original's outputs.

The baseline is recorded, not re-run: ``tests/fixtures/dino/r50_{4,5}scale.safetensors`` hold what DINO's own
code (``build_dino`` of ``DINO_{4,5}scale.py`` at the commit in each file's meta) computed with random weights
at toy widths on a narrow ResNet, for a padded batch of two images, in float32 and in float64, and
``published_layouts.txt`` the key layouts and parameter counts of the published models.
``scripts/fixtures/make_dino.py --repo PATH`` writes them from a checkout; docs/dino.md says how and what they hold.

Each test turns the fixture's weights back into the original's checkpoint file (``{"model": ..., "optimizer": ...,
"epoch": ..., "args": Namespace}``, as DINO's ``main.py`` saves it) and loads it the way a user does:
``create_model(name, pretrained=file)`` with the toy widths as keywords. The narrow ResNet is torchvision's
``ResNet`` class with fewer channels (the fixture's ``small_resnet``): while the model is built, torchvision's
``resnet50`` returns it, for the original (in the generator) as for visiontf (here).

Float32 is compared as tightly as float64 allows because the generator set the proposal class head so that the
top-20 ranking has margins far above float32 rounding (``ranking_margin`` in the meta) and selects 15 padded
positions in the padded image: DINO gives its learned content queries to the top-K proposals in rank order, so a
rank swapped by rounding at a near-tie would move every output (docs/dino.md).
"""
from __future__ import annotations

import argparse
import dataclasses
import logging
from functools import cache
from pathlib import Path

import pytest
import torch
import torchvision
from reference.fixtures import FIXTURES, Fixture, load_fixture, read_layouts
from torch import nn
from torchvision.models.resnet import Bottleneck

from visiontf.models import create_model
from visiontf.models._registry import WeightsLayoutError, load_pretrained
from visiontf.models.deformable_detr.build import merge_sections, sections_of
from visiontf.models.deformable_detr.dino_convert import DINO_MODELS, convert_state_dict
from visiontf.set_prediction import build_postprocess
from visiontf.set_prediction.set_loss import build_criterion

TOL = {"float32": 1e-4, "float64": 1e-8}
#: visiontf's post-processing returns float32 detections (its contract), also from float64 outputs
DETECTION_TOL = {"float32": 1e-4, "float64": 1e-6}
CASES = {"r50_4scale": "dino_resnet50_4scale", "r50_5scale": "dino_resnet50_5scale"}
LAYOUTS = FIXTURES / "dino" / "published_layouts.txt"
#: stored narrow dtypes and the checkpoint's (the generator's ``compact``)
WIDER = {torch.float16: torch.float32, torch.int16: torch.int64}


# ------------------------------------------------------------------------------------ fixtures as checkpoints
@cache
def fixture(case: str) -> Fixture:
    return load_fixture("dino", case)


def original_state(fx: Fixture) -> dict[str, torch.Tensor]:
    """The original's state dict: stored values widened, each repeated tensor (``weight_aliases``) restored."""
    state = {k: v.to(WIDER.get(v.dtype, v.dtype)) for k, v in fx.weights.items()}
    for key, stored in fx.meta["weight_aliases"].items():
        state[key] = state[stored]
    return state


def save_checkpoint(fx: Fixture, path: Path) -> Path:
    """``fx``'s weights in DINO's checkpoint file; ``args`` is an argparse.Namespace (weights-only loading allows it)."""
    args = argparse.Namespace(**fx.meta["settings"]["overrides"], backbone=fx.meta["settings"]["backbone"])
    torch.save({"model": original_state(fx), "optimizer": {"state": {}, "param_groups": []}, "epoch": 11, "args": args}, path)
    return path


def small_resnet50(stem: int, planes: list[int], blocks: list[int]):
    """torchvision's ``resnet50`` signature, returning a ResNet of bottlenecks with ``planes`` widths (outputs 4x)."""

    def make(*, weights=None, replace_stride_with_dilation=None, norm_layer=None):
        assert weights is None and not any(replace_stride_with_dilation or ())
        net = torchvision.models.ResNet(Bottleneck, [1, 1, 1, 1], norm_layer=norm_layer)
        net.inplanes = stem
        net.conv1 = nn.Conv2d(3, stem, kernel_size=7, stride=2, padding=3, bias=False)
        net.bn1 = norm_layer(stem)
        for i, (width, count) in enumerate(zip(planes, blocks, strict=True)):
            setattr(net, f"layer{i + 1}", net._make_layer(Bottleneck, width, count, stride=1 if i == 0 else 2))
        return net

    return make


def toy_kwargs(fx: Fixture) -> dict:
    """The fixture's widths as ``create_model`` sections. DINO's config names are visiontf's field names: the recorded
    overrides go into their sections by name (``sections_of``: ``hidden_dim`` into ``arch``, ``num_denoising`` into ``dino``)."""
    kwargs = sections_of(**{k: v for k, v in fx.meta["settings"]["overrides"].items() if k != "dn_labelbook_size"})
    if fx.meta["settings"]["backbone"].startswith("swin"):
        swin = fx.meta["settings"]["small_swin"]
        kwargs["backbone"] = {"kwargs": {k: tuple(v) if isinstance(v, list) else v for k, v in swin.items()}}
    return kwargs


def load_model(case: str, path: Path, monkeypatch, name: str | None = None, **overrides) -> nn.Module:
    """``create_model(name, pretrained=path)`` at the fixture's toy widths, as a user loads the original's file."""
    fx = fixture(case)
    with monkeypatch.context() as m:
        m.setattr(torchvision.models, "resnet50", small_resnet50(**fx.meta["settings"]["small_resnet"]))
        return create_model(name or CASES[case], pretrained=path, **merge_sections(toy_kwargs(fx), overrides)).eval()


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("dino")
    return {case: save_checkpoint(fixture(case), folder / f"checkpoint0011_{case}.pth") for case in CASES}


# ------------------------------------------------------------------------------------ comparing
def named_outputs(out: dict) -> dict[str, torch.Tensor]:
    """visiontf's outputs under the fixture's names."""
    named = {"pred_logits": out["pred_logits"], "pred_boxes": out["pred_boxes"]}
    for i, layer in enumerate(out["aux_outputs"]):
        named |= {f"aux.{i}.pred_logits": layer["pred_logits"], f"aux.{i}.pred_boxes": layer["pred_boxes"]}
    named |= {f"interm.{k}": out["interm_outputs"][k] for k in ("pred_logits", "pred_boxes")}
    return named


def differences(ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor]) -> dict[str, float]:
    assert set(ours) <= set(theirs)
    return {k: (ours[k].double() - theirs[k].double()).abs().max().item() for k in ours}


def assert_same_detections(ours: list[dict], theirs: dict[str, torch.Tensor], sizes: torch.Tensor, tol: float) -> float:
    """The original's detections (scores sorted, labels, boxes in pixels); equal scores may come in another order.
    Returns the largest score difference."""
    worst = 0.0
    for b, (a, (h, w)) in enumerate(zip(ours, sizes.tolist(), strict=True)):
        scores, labels, boxes = theirs["detections.scores"][b], theirs["detections.labels"][b], theirs["detections.boxes"][b]
        assert len(a["scores"]) == len(scores)
        worst = max(worst, (a["scores"].double() - scores.double()).abs().max().item())  # both sorted by score
        close = ((a["scores"][:, None].double() - scores[None].double()).abs() < tol) & (a["labels"][:, None] == labels[None])
        close &= ((a["boxes"][:, None].double() - boxes[None].double()).abs() < tol * max(h, w)).all(-1)
        assert close.any(1).all() and close.any(0).all(), f"image {b}: detections without a counterpart"
    assert worst < tol
    return worst


def run_case(case: str, dtype: str, path: Path, monkeypatch) -> tuple[dict, dict, nn.Module]:
    fx = fixture(case)
    model = load_model(case, path, monkeypatch).to(getattr(torch, dtype))
    images, mask = fx.inputs["images"].to(getattr(torch, dtype)), fx.inputs["mask"]
    with torch.no_grad():
        out = model(images, mask)
    return out, fx.outputs[dtype], model


# ------------------------------------------------------------------------------------ outputs
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_checkpoint_gives_the_original_outputs(case, dtype, checkpoints, monkeypatch):
    """Every decoder layer's logits and boxes, the selected proposals and the post-processed detections."""
    fx = fixture(case)
    assert fx.meta["measured"]["ranking_margin"] > 100 * 1e-6  # well above float32 rounding of the scores
    out, theirs, model = run_case(case, dtype, checkpoints[case], monkeypatch)
    assert theirs["pred_boxes"].std() > 0.05 and theirs["pred_logits"].std() > 0.1  # not degenerate
    diffs = differences(named_outputs(out), theirs)
    assert max(diffs.values()) < TOL[dtype], diffs
    sizes = fx.inputs["sizes"]
    with torch.no_grad():
        detections = build_postprocess(model)(out, sizes)
    assert_same_detections(detections, theirs, sizes, DETECTION_TOL[dtype])


@pytest.mark.parametrize("case", sorted(CASES))
def test_padded_proposals_are_ranked_as_the_original_does(case, checkpoints, monkeypatch):
    """DINO selects padded positions ((1, 1, 1, 1) anchors); visiontf's default skips them, which the original's outputs rule out."""
    fx = fixture(case)
    assert fx.meta["measured"]["padded_anchors_per_image"][1] == 15
    assert ((fx.outputs["float64"]["interm.pred_boxes"] == 1).all(-1).sum(1) == torch.tensor(fx.meta["measured"]["padded_anchors_per_image"])).all()
    model = load_model(case, checkpoints[case], monkeypatch)
    model.arch_options = dataclasses.replace(model.arch_options, select_padded_proposals=False)
    with torch.no_grad():
        out = model(fx.inputs["images"].float(), fx.inputs["mask"])
    assert (out["pred_boxes"] - fx.outputs["float32"]["pred_boxes"]).abs().max() > 0.01


@pytest.mark.parametrize("case", sorted(CASES))
def test_toy_models_have_the_originals_parameter_count(case, checkpoints, monkeypatch):
    model = load_model(case, checkpoints[case], monkeypatch)
    assert sum(p.numel() for p in model.parameters()) == fixture(case).meta["parameters"]


# ------------------------------------------------------------------------------------ published layouts
def published() -> dict[str, tuple[int, dict[str, torch.Size]]]:
    """``published_layouts.txt``: section -> (parameter count, {key: shape})."""
    return read_layouts(LAYOUTS)


def published_state(section: str, **replace: tuple[int, ...]) -> dict[str, torch.Tensor]:
    """The section's state dict as meta tensors (no values), with some shapes replaced."""
    return {k: torch.empty(replace.get(k, shape), device="meta") for k, shape in published()[section][1].items()}


@pytest.mark.parametrize("scales", [4, 5])
def test_parameter_count_and_layout_equal_the_originals(scales):
    """DINO_{4,5}scale.py (91 classes, 900 queries) at full width: same count, every tensor mapped to one of the same shape."""
    count, layout = published()[f"DINO_{scales}scale"]
    assert count == {4: 46_893_182, 5: 47_255_806}[scales]  # the counts docs/dino.md gives
    with torch.device("meta"):
        model = create_model(DINO_MODELS[scales])
    assert sum(p.numel() for p in model.parameters()) == count
    own = model.state_dict()
    converted = convert_state_dict(published_state(f"DINO_{scales}scale"), model)
    assert set(converted) == set(own)
    assert all(converted[k].shape == own[k].shape for k in own)
    assert "transformer.tgt_embed.weight" in layout and "transformer.decoder.ref_point_head.layers.0.weight" in layout


def test_key_mapping_of_the_toy_checkpoint(checkpoints, monkeypatch):
    """Each tensor of the original's toy state dict lands where visiontf reads it, with its values."""
    fx = fixture("r50_4scale")
    state = original_state(fx)
    model = load_model("r50_4scale", checkpoints["r50_4scale"], monkeypatch)
    converted = convert_state_dict(state, model)
    own = model.state_dict()
    assert set(converted) == set(own)
    expected = {
        "backbone.body.layer2.0.conv1.weight": "backbone.0.body.layer2.0.conv1.weight",
        "transformer.encoder.layers.1.mlp.fc1.weight": "transformer.encoder.layers.1.linear1.weight",
        "transformer.decoder.layers.2.self_attn.qkv.weight": "transformer.decoder.layers.2.self_attn.in_proj_weight",
        "transformer.decoder.layers.0.norm1.weight": "transformer.decoder.layers.0.norm2.weight",
        "transformer.decoder.layers.0.norm2.weight": "transformer.decoder.layers.0.norm1.weight",
        "tgt_embed.weight": "transformer.tgt_embed.weight",
        "decoder_norm.weight": "transformer.decoder.norm.weight",
        "class_embed.0.weight": "class_embed.0.weight",
        "class_embed.1.weight": "transformer.enc_out_class_embed.weight",  # the proposal head after the one shared decoder head
        "bbox_embed.1.layers.2.bias": "transformer.enc_out_bbox_embed.layers.2.bias",
    }
    for ours, theirs in expected.items():
        assert torch.equal(own[ours], state[theirs]), ours
    # the anchor MLP's input: DINO's sine features are (y, x, w, h), visiontf's (x, y, w, h)
    weight, block = state["transformer.decoder.ref_point_head.layers.0.weight"], fx.meta["settings"]["overrides"]["hidden_dim"] // 2
    assert torch.equal(own["ref_point_head.layers.0.weight"], torch.cat([weight[:, block:2 * block], weight[:, :block], weight[:, 2 * block:]], 1))


# ------------------------------------------------------------------------------------ refusals
@pytest.mark.parametrize("found, wanted", [(5, 4), (4, 5)])
def test_checkpoint_with_other_feature_levels_is_refused(found, wanted):
    with torch.device("meta"):
        model = create_model(DINO_MODELS[wanted])
    with pytest.raises(WeightsLayoutError, match=f"checkpoint0011_{found}scale.pth: this DINO checkpoint has {found} feature levels "
                       f".*it fits '{DINO_MODELS[found]}'.* has {wanted}; use create_model\\('{DINO_MODELS[found]}'"):
        load_pretrained(model, published_state(f"DINO_{found}scale"), source=f"checkpoint0011_{found}scale.pth")


def test_checkpoint_with_other_queries_is_refused():
    with torch.device("meta"):
        model = create_model("dino_resnet50_4scale", arch={"num_queries": 300})
    with pytest.raises(ValueError, match=r"has 900 queries \(transformer.tgt_embed.weight \(900, 256\)\).* has 300; build it with num_queries=900"):
        convert_state_dict(published_state("DINO_4scale"), model)


def deformable_detr_two_stage_state() -> dict[str, torch.Tensor]:
    """fundamentalvision/Deformable-DETR's two-stage layout, from DINO's: without DINO's additions (content queries,
    anchor MLP, decoder norm, proposal heads, label book), with the original's proposal-to-query projection."""
    dino_only = ("transformer.tgt_embed.", "transformer.decoder.ref_point_head.", "transformer.decoder.norm.",
                 "transformer.enc_out_", "label_enc.")
    state = {k: v for k, v in published_state("DINO_4scale").items() if not k.startswith(dino_only)}
    state |= {"transformer.pos_trans.weight": torch.empty(512, 512, device="meta"), "transformer.pos_trans.bias": torch.empty(512, device="meta"),
              "transformer.pos_trans_norm.weight": torch.empty(512, device="meta"), "transformer.pos_trans_norm.bias": torch.empty(512, device="meta")}
    return state


def test_dino_and_deformable_detr_checkpoints_are_refused_by_the_other_family():
    with torch.device("meta"):
        two_stage = create_model("deformable_detr_resnet50_two_stage")
        dino = create_model("dino_resnet50_4scale")
    with pytest.raises(WeightsLayoutError, match="IDEA-Research/DINO checkpoint.*dino_resnet50_4scale"):
        load_pretrained(two_stage, published_state("DINO_4scale"))
    with pytest.raises(WeightsLayoutError, match="Deformable DETR checkpoint.*not an IDEA-Research/DINO one.*deformable_detr_resnet50_two_stage"):
        load_pretrained(dino, deformable_detr_two_stage_state())


def test_label_book_keeps_the_classes_and_zeroes_the_padding_row(monkeypatch, checkpoints):
    """DINO's Embedding(dn_labelbook_size + 1, d) is read at labels < num_classes only: visiontf keeps those rows, its padding row is zero."""
    assert published()["DINO_4scale"][1]["label_enc.weight"] == (92, 256)  # dn_labelbook_size 91
    with torch.device("meta"):
        assert convert_state_dict(published_state("DINO_4scale"), create_model("dino_resnet50_4scale"))["label_enc.weight"].shape == (92, 256)
    fx = fixture("r50_4scale")
    state, classes = original_state(fx), fx.meta["settings"]["overrides"]["num_classes"]
    model = load_model("r50_4scale", checkpoints["r50_4scale"], monkeypatch)
    book = model.label_enc.weight
    assert book.shape == state["label_enc.weight"].shape == (classes + 1, fx.meta["settings"]["overrides"]["hidden_dim"])
    assert torch.equal(book[:classes], state["label_enc.weight"][:classes]) and not book[classes].any()
    assert state["label_enc.weight"][classes].any()  # the original's unused row is not zero


# ------------------------------------------------------------------------------------ fine-tuning
def test_finetune_from_dino_checkpoint_reinitialises_only_class_tensors(checkpoints, monkeypatch, caplog):
    expected = convert_state_dict(original_state(fixture("r50_4scale")), load_model("r50_4scale", checkpoints["r50_4scale"], monkeypatch))
    with caplog.at_level(logging.WARNING):
        model = load_model("r50_4scale", checkpoints["r50_4scale"], monkeypatch, num_classes=3)
    lines = [r.getMessage() for r in caplog.records if "class head not loaded" in r.getMessage()]
    assert len(lines) == 1
    named = {item.split(" ")[0] for item in lines[0].split("(fine-tuning): ")[1].split("; ")}
    # the decoder layers' one shared head (class_embed.0) and the proposal head (class_embed.1)
    assert named == {f"class_embed.{i}.{p}" for i in (0, 1) for p in ("weight", "bias")} | {"label_enc.weight"}
    class_dependent = {k for k in model.state_dict() if k.startswith(("class_embed.", "label_enc."))}
    assert named == class_dependent
    own = model.state_dict()
    for key, value in expected.items():
        if key in class_dependent:
            assert own[key].shape[0] in (3, 4) and not torch.equal(own[key][:3], value[:3]), key
        else:
            assert torch.equal(own[key], value), key
    assert model.label_enc.weight.shape == (4, 32) and not model.label_enc.weight[3].any()  # the padding row


def test_finetune_to_one_class_trains(checkpoints, monkeypatch):
    model = load_model("r50_4scale", checkpoints["r50_4scale"], monkeypatch, num_classes=1).train()
    images, mask = fixture("r50_4scale").inputs["images"].float(), fixture("r50_4scale").inputs["mask"]
    targets = [{"labels": torch.tensor([0, 0]), "boxes": torch.tensor([[0.3, 0.4, 0.2, 0.3], [0.7, 0.5, 0.3, 0.4]])},
               {"labels": torch.tensor([0]), "boxes": torch.tensor([[0.5, 0.5, 0.4, 0.4]])}]
    out = model(images, mask, targets=targets)
    assert out["pred_logits"].shape == (2, 20, 1) and "dn_outputs" in out
    loss = build_criterion(model, 1)(out, targets, sync_num_boxes=False)["loss"]
    assert torch.isfinite(loss)
    loss.backward()
    assert model.class_embed[0].weight.grad is not None and torch.isfinite(model.class_embed[0].weight.grad).all()
