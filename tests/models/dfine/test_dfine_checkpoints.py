"""Peterande/D-FINE's and ShihuaHuang95/DEIM's checkpoints load into visiontf's D-FINE models with the originals' outputs.

The baseline is recorded, not re-run: ``tests/fixtures/dfine/*.safetensors`` and ``tests/fixtures/deim/*.safetensors``
hold what the originals' own code (at the commit in each file's meta) computed with random weights at toy widths
(``scripts/fixtures/make_dfine.py --repo PATH`` and ``make_deim.py`` write them; docs/realtime_detr.md says how), and
``published_layouts.txt`` the key layouts and parameter counts of the published models.

Each test turns the fixture's weights back into the original's checkpoint file (``{"model": ..., "ema": {"module":
..., "updates": ...}}``) and loads it as a user does, ``create_model(name, pretrained=file)`` with the toy widths as
sections. Compared: evaluation outputs at two input sizes in float32 (1e-4) and float64 (1e-8) with the
post-processed detections, and a training step with the denoising queries the original drew: every decoder layer's
logits and boxes, the last layer's edge logits and their reference, the first layer's extra box, the proposals, the
denoising queries' outputs (float32 with the BatchNorms' running statistics, float64 with the batch's, as recorded),
each weighted loss term (visiontf's criterion against the original's) and the matching.
"""
from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest
import torch
from reference.fixtures import FIXTURES, Fixture, load_fixture, read_layouts
from rtdetr_helpers import assert_eval_outputs_match, one_thread, recorded_settings  # noqa: F401 (one_thread: a module fixture, one torch thread)

from visiontf.models import create_model
from visiontf.models.backbones.hgnetv2 import HGNetV2Backbone
from visiontf.models.deformable_detr.denoising import DenoisingQueries, build_contrastive_denoising
from visiontf.models.dfine.convert import convert_state_dict
from visiontf.models.rtdetr.convert import checkpoint_entry
from visiontf.set_prediction.set_loss import build_criterion

TOL = {"float32": 1e-4, "float64": 1e-8}
#: float64: the originals' criterion scored the float64 outputs rounded to float32, as visiontf's does; float32: the outputs
#: it reads already differ by float32 rounding of the network
LOSS_TOL = {"float32": 5e-5, "float64": 1e-5}
#: case -> (fixture family, registered name)
CASES = {"dfine_s": ("dfine", "dfine_s"), "dfine_n": ("dfine", "dfine_n"), "dfine_x": ("dfine", "dfine_x"), "deim_s": ("deim", "deim_dfine_s")}
#: the published parameter counts in millions (the originals' READMEs)
PUBLISHED_MILLIONS = {"n": 4, "s": 10, "m": 19, "l": 31, "x": 62}
WIDER = {torch.float16: torch.float32, torch.int16: torch.int64}


@cache
def fixture(case: str) -> Fixture:
    return load_fixture(CASES[case][0], case)


def original_state(fx: Fixture) -> dict[str, torch.Tensor]:
    return {k: v.to(WIDER.get(v.dtype, v.dtype)) for k, v in fx.weights.items()}


def images(fx: Fixture, name: str, dtype: str) -> torch.Tensor:
    return (fx.inputs[f"{name}.images"].float() / 256).to(getattr(torch, dtype))  # bytes: pixels k / 256


class Checkpoints(dict):
    """Each case as the originals' solvers save a checkpoint (both entries), written when first asked for."""

    def __init__(self, folder: Path) -> None:
        super().__init__()
        self.folder = folder

    def __missing__(self, case: str) -> Path:
        state = original_state(fixture(case))
        path = self[case] = self.folder / f"{case}.pth"
        torch.save({"model": state, "ema": {"module": state, "updates": 1000}, "last_epoch": 71}, path)
        return path


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> Checkpoints:
    return Checkpoints(tmp_path_factory.mktemp("dfine"))


def load(case: str, path: Path) -> torch.nn.Module:
    settings = recorded_settings(fixture(case).meta["settings"], CASES[case][1])
    return create_model(CASES[case][1], pretrained=str(path), input_norm="none", **settings).eval()


def diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.double() - b.double()).abs().max().item()


# ------------------------------------------------------------------------------------ evaluation
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_eval_outputs_equal_the_originals(case, dtype, checkpoints):
    fx = fixture(case)
    assert fx.meta["ranking_margin"] > 100 * 1e-6  # float32 rounding cannot reorder the selected queries
    model = load(case, checkpoints[case]).to(getattr(torch, dtype))
    inputs = {name: images(fx, name, dtype) for name in ("batch", "single")}
    assert_eval_outputs_match(model, fx.outputs[dtype], inputs, TOL[dtype], box_tol=1e-4)  # boxes: pixels, visiontf's float32


# ------------------------------------------------------------------------------------ training
def recorded_denoising(fx: Fixture, targets: list[dict]) -> DenoisingQueries:
    """The original's denoising queries (its labels, boxes and mask) in visiontf's layout, checked against it."""
    settings = fx.meta["settings"]
    layout = build_contrastive_denoising(targets, settings["num_classes"], settings["decoder"]["num_queries"],
                                         settings["denoising"]["num_denoising"], 0.5, 1.0, inverse_sigmoid_eps=1e-5, pad_box="zero")
    assert layout.meta.num_groups == fx.meta["dn"]["num_groups"] and layout.meta.pad_size == fx.meta["dn"]["split"][0]
    assert torch.equal(layout.attn_mask, fx.inputs["dn.attn_mask"])
    for i, idx in enumerate(layout.meta.positive_idx):
        assert torch.equal(idx, fx.inputs[f"dn.positive_idx.{i}"].long())
    labels = fx.inputs["dn.labels"].long()
    assert torch.equal(labels == settings["num_classes"], ~layout.meta.valid)
    return DenoisingQueries(labels, fx.inputs["dn.boxes_unact"], layout.attn_mask, layout.meta)


def fixture_targets(fx: Fixture) -> list[dict[str, torch.Tensor]]:
    return [{"labels": fx.inputs[f"targets.{i}.labels"].long(), "boxes": fx.inputs[f"targets.{i}.boxes"].float()} for i in range(2)]


def train_outputs(case: str, path: Path, dtype: str) -> tuple[dict, torch.nn.Module]:
    """visiontf's training step as recorded: float32 with the BatchNorms' running statistics, float64 with the batch's."""
    fx = fixture(case)
    model = load(case, path).to(getattr(torch, dtype)).train()
    if dtype == "float32":
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.eval()
    targets = fixture_targets(fx)
    dn = recorded_denoising(fx, targets)
    model.denoising = lambda *args: dn
    return model(images(fx, "batch", dtype), targets=targets), model


def named_train_outputs(out: dict) -> dict[str, torch.Tensor]:
    """visiontf's training outputs under the fixtures' names (the originals' structure)."""
    named: dict[str, torch.Tensor] = {}

    def put(prefix: str, layer: dict) -> None:
        for key in ("pred_logits", "pred_boxes", "pred_corners", "ref_points"):
            if key in layer:
                named[prefix + key] = layer[key]

    put("", out)
    for i, layer in enumerate(out["aux_outputs"]):
        put(f"aux.{i}.", layer)
    put("pre.", out["pre_outputs"])
    put("enc.0.", out["interm_outputs"])
    dn = [*out["dn_outputs"]["aux_outputs"], out["dn_outputs"]]
    for i, layer in enumerate(dn):
        put(f"dn.{i}.", layer)
    put("dn_pre.", out["dn_outputs"]["pre_outputs"])
    return named


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_training_outputs_equal_the_originals(case, dtype, checkpoints):
    out, _ = train_outputs(case, checkpoints[case], dtype)
    theirs = fixture(case).outputs[dtype]
    recorded = {k[len("train."):] for k in theirs if k.startswith("train.") and not k.startswith(("train.loss.", "train.match."))}
    named = named_train_outputs(out)
    assert recorded <= set(named) and {"pred_corners", "ref_points", "pre.pred_boxes", "enc.0.pred_logits", "dn.0.pred_boxes"} & recorded
    worst = {k: diff(named[k], theirs[f"train.{k}"]) for k in recorded}
    assert max(worst.values()) < TOL[dtype], worst


def original_loss_name(ours: str, layers: int, class_term: str) -> str:
    """visiontf's term name (``loss_ce_1``, ``loss_fgl_interm``, ``loss_giou_dn``) -> the original's."""
    m = re.fullmatch(r"loss_(ce|bbox|giou|fgl|ddf)(?:_(\d+|interm|pre|dn)(?:_(\d+|pre))?)?", ours)
    base = class_term if m[1] == "ce" else f"loss_{m[1]}"
    if m[2] is None:
        return base
    if m[2] in ("interm", "pre"):
        return base + ("_enc_0" if m[2] == "interm" else "_pre")
    if m[2] == "dn":
        return f"{base}_dn_{layers - 1 if m[3] is None else m[3]}"
    return f"{base}_aux_{m[2]}"


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_loss_terms_and_matching_equal_the_originals(case, dtype, checkpoints):
    """visiontf's criterion for the family (D-FINE's or DEIM's) on its own outputs against the original's weighted terms."""
    out, model = train_outputs(case, checkpoints[case], dtype)
    criterion = build_criterion(model, model.num_classes)
    targets = fixture_targets(fixture(case))
    terms = criterion(out, targets, sync_num_boxes=False)
    layers = len(out["aux_outputs"]) + 1
    class_term = "loss_mal" if criterion.class_loss == "mal" else "loss_vfl"
    compared = {}
    for name, value in terms.items():
        if not re.fullmatch(r"loss_(ce|bbox|giou|fgl|ddf).*", name):
            continue
        base = "_".join(name.split("_")[:2])
        compared[original_loss_name(name, layers, class_term)] = (criterion.weight_dict[base] * value).item()
    theirs = {k[len("train.loss."):]: v.item() for k, v in fixture(case).outputs[dtype].items() if k.startswith("train.loss.")}
    # the one term visiontf leaves out: D-FINE's distillation of the last denoising layer towards itself, zero
    assert {k: v for k, v in theirs.items() if k not in compared} in ({}, {f"loss_ddf_dn_{layers - 1}": 0.0})
    assert set(compared) <= set(theirs)
    worst = {k: abs(v - theirs[k]) for k, v in compared.items()}
    assert max(worst.values()) < LOSS_TOL[dtype], worst
    indices = criterion.matcher(out, targets)
    for b, (q, t) in enumerate(indices):
        recorded = fixture(case).outputs[dtype]
        assert torch.equal(q, recorded[f"train.match.{b}.query"].long()) and torch.equal(t, recorded[f"train.match.{b}.target"].long())


# ------------------------------------------------------------------------------------ checkpoints and counts
@pytest.mark.parametrize("case", sorted(CASES))
def test_toy_models_have_the_originals_parameter_count(case, checkpoints):
    model = load(case, checkpoints[case])
    assert sum(p.numel() for p in model.parameters()) == fixture(case).meta["parameters"]


def test_the_ema_entry_loads_as_the_model_entry(checkpoints):
    checkpoint = torch.load(checkpoints["dfine_s"], weights_only=True)
    ema = checkpoint_entry(checkpoint, "ema")
    model = load("dfine_s", checkpoints["dfine_s"])
    assert convert_state_dict(ema, model).keys() == model.state_dict().keys()


def published(family: str) -> dict[str, tuple[int, dict[str, torch.Size]]]:
    return read_layouts(FIXTURES / family / "published_layouts.txt")


@pytest.mark.parametrize("size", list("nsmlx"))
def test_published_models_have_the_originals_layout_and_parameter_count(size):
    """The originals' own builds at full width (80 classes): the same count, every tensor mapped to one of the same shape;
    DEIM's builds (its BatchNorms trained, so their affine parameters count) the same count as visiontf's DEIM names."""
    count, layout = published("dfine")[f"dfine_{size}"]
    assert abs(count / 1e6 - PUBLISHED_MILLIONS[size]) < 1  # the READMEs' millions (rounded either way: N 3.78 is 4, M 19.59 is 19)
    with torch.device("meta"):
        model = create_model(f"dfine_{size}")
        deim = create_model(f"deim_dfine_{size}")
    assert sum(p.numel() for p in model.parameters()) == count
    assert sum(p.numel() for p in deim.parameters()) == published("deim")[f"deim_dfine_{size}"][0]
    own = model.state_dict()
    converted = convert_state_dict({k: torch.empty(s, device="meta") for k, s in layout.items()}, model)
    assert set(converted) == set(own)
    assert all(converted[k].shape == own[k].shape for k in own)


def test_imagenet_file_in_the_originals_layout_loads_as_the_backbones_pretrained(tmp_path, checkpoints):
    """A random-weight file in the original's HGNetv2 layout (its ``PPHGNetV2_*_stage1.pth``: the case's backbone) and the
    same weights in transformers' ``HGNetV2Backbone`` layout give the detector's backbone."""
    fx = fixture("dfine_s")
    state = {k[len("backbone."):]: v for k, v in original_state(fx).items() if k.startswith("backbone.")}
    torch.save(state, tmp_path / "PPHGNetV2_B0_stage1.pth")
    hf = {("embedder." + k[len("stem."):] if k.startswith("stem.") else "encoder." + k).replace(".conv.", ".convolution.")
          .replace(".bn.", ".normalization."): v for k, v in state.items()}
    torch.save(hf, tmp_path / "hf_hgnetv2.pth")
    settings = fx.meta["settings"]["backbone"]
    model = load("dfine_s", checkpoints["dfine_s"])
    x = images(fx, "batch", "float32")
    for file in ("PPHGNetV2_B0_stage1.pth", "hf_hgnetv2.pth"):
        backbone = HGNetV2Backbone("B0", use_lab=True, frozen_bn=False, freeze_at=-1, stem=settings["stem"], stages=settings["stages"],
                                   pretrained=tmp_path / file).eval()
        with torch.no_grad():
            for a, b in zip(backbone.forward_maps(x), model.backbone.forward_maps(x)):
                assert torch.equal(a, b)
