"""lyuwenyu/RT-DETR's checkpoints (v1 and v2) load into visiontf's RT-DETR models with the original's outputs.

The baseline is recorded, not re-run: ``tests/fixtures/rtdetr/*.safetensors`` hold what the original's own code
(both its trees, at the commit in each file's meta) computed with random weights at toy widths
(``scripts/fixtures/make_rtdetr.py --repo PATH`` writes them; docs/realtime_detr.md says how), and
``published_layouts.txt`` the key layouts and parameter counts of the published models.

Each test turns the fixture's weights back into the original's checkpoint file (``{"model": ..., "ema": {"module":
..., "updates": ...}, ...}`` as its solver saves it) and loads it as a user does, ``create_model(name,
pretrained=file)`` with the toy widths as sections. Compared: evaluation outputs at two input sizes (a padded batch
of two images and a single image) in float32 (1e-4) and float64 (1e-8), the post-processed detections, and a
training step with the denoising queries the original drew: every decoder layer's outputs, the selected
proposals, each loss term (visiontf's criterion against the original's, 1e-5 in float64) and the matching.
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
from visiontf.models.backbones.resnet_vd import ResNetVdBackbone, resnet_vd_state
from visiontf.models.deformable_detr.denoising import DenoisingQueries, build_contrastive_denoising
from visiontf.models.rtdetr.convert import checkpoint_entry, convert_state_dict
from visiontf.set_prediction.set_loss import build_criterion

TOL = {"float32": 1e-4, "float64": 1e-8}
#: float64: visiontf's criterion computes in float32 (1e-5 per term); float32: the outputs it reads already differ by
#: float32 rounding of the network (up to 4e-5), so the terms may too
LOSS_TOL = {"float32": 5e-5, "float64": 1e-5}
CASES = {"v1_r18": "rtdetr_r18vd", "v2_r50_points": "rtdetrv2_r50vd", "v2_r18_discrete": "rtdetrv2_r18vd_dsp"}
LAYOUTS = FIXTURES / "rtdetr" / "published_layouts.txt"
#: the published parameter counts in millions (the originals' READMEs), by model
PUBLISHED_MILLIONS = {"r18vd": 20, "r34vd": 31, "r50vd_m": 36, "r50vd": 42, "r101vd": 76}
WIDER = {torch.float16: torch.float32, torch.int16: torch.int64}


@cache
def fixture(case: str) -> Fixture:
    return load_fixture("rtdetr", case)


def original_state(fx: Fixture) -> dict[str, torch.Tensor]:
    return {k: v.to(WIDER.get(v.dtype, v.dtype)) for k, v in fx.weights.items()}


class Checkpoints(dict):
    """Each case as the original's solver saves a checkpoint (both entries, as its released files have), written when first asked for."""

    def __init__(self, folder: Path) -> None:
        super().__init__()
        self.folder = folder

    def __missing__(self, case: str) -> Path:
        state = original_state(fixture(case))
        path = self[case] = self.folder / f"{case}.pth"
        torch.save({"model": state, "ema": {"module": state, "updates": 1000}, "last_epoch": 71, "date": "2024-07-01"}, path)
        return path


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> Checkpoints:
    return Checkpoints(tmp_path_factory.mktemp("rtdetr"))


def load(case: str, path: Path, **extra) -> torch.nn.Module:
    settings = recorded_settings(fixture(case).meta["settings"], CASES[case])
    return create_model(CASES[case], pretrained=str(path), input_norm="none", **settings, **extra).eval()


def diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.double() - b.double()).abs().max().item()


# ------------------------------------------------------------------------------------ evaluation
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_eval_outputs_equal_the_originals(case, dtype, checkpoints):
    fx = fixture(case)
    assert fx.meta["ranking_margin"] > 100 * 1e-6  # float32 rounding cannot reorder the selected queries
    model = load(case, checkpoints[case]).to(getattr(torch, dtype))
    inputs = {name: fx.inputs[f"{name}.images"].to(getattr(torch, dtype)) for name in ("batch", "single")}
    assert_eval_outputs_match(model, fx.outputs[dtype], inputs, TOL[dtype], box_tol=1e-4)  # boxes: pixels, visiontf's float32


# ------------------------------------------------------------------------------------ training
def recorded_denoising(fx: Fixture, targets: list[dict]) -> DenoisingQueries:
    """The original's denoising queries: its labels, boxes and mask in visiontf's layout (checked against it)."""
    classes = fx.meta["settings"]["num_classes"]
    layout = build_contrastive_denoising(targets, classes, fx.meta["settings"]["decoder"]["num_queries"],
                                         fx.meta["settings"]["denoising"]["num_denoising"], 0.5, 1.0, inverse_sigmoid_eps=1e-5, pad_box="zero")
    assert layout.meta.num_groups == fx.meta["dn"]["num_groups"] and layout.meta.pad_size == fx.meta["dn"]["split"][0]
    assert torch.equal(layout.attn_mask, fx.inputs["dn.attn_mask"])
    for i, idx in enumerate(layout.meta.positive_idx):
        assert torch.equal(idx, fx.inputs[f"dn.positive_idx.{i}"].long())
    labels = fx.inputs["dn.labels"].long()
    assert torch.equal(labels == classes, ~layout.meta.valid)  # padding slots: the zero label of the embedding
    return DenoisingQueries(labels, fx.inputs["dn.boxes_unact"], layout.attn_mask, layout.meta)


def fixture_targets(fx: Fixture) -> list[dict[str, torch.Tensor]]:
    return [{"labels": fx.inputs[f"targets.{i}.labels"].long(), "boxes": fx.inputs[f"targets.{i}.boxes"].float()} for i in range(2)]


def train_outputs(case: str, path: Path, dtype: str) -> tuple[dict, dict, torch.nn.Module]:
    fx = fixture(case)
    model = load(case, path).to(getattr(torch, dtype)).train()
    targets = fixture_targets(fx)
    dn = recorded_denoising(fx, targets)
    model.denoising = lambda *args: dn
    out = model(fx.inputs["batch.images"].to(getattr(torch, dtype)), targets=targets)
    return out, fx.outputs[dtype], model


def named_train_outputs(out: dict, v1: bool) -> dict[str, torch.Tensor]:
    """visiontf's training outputs under the original's names (v1 lists the proposals as its last aux output)."""
    layers = out["aux_outputs"]
    named = {"pred_logits": out["pred_logits"], "pred_boxes": out["pred_boxes"]}
    for i, layer in enumerate(layers):
        named |= {f"aux.{i}.pred_logits": layer["pred_logits"], f"aux.{i}.pred_boxes": layer["pred_boxes"]}
    enc = f"aux.{len(layers)}" if v1 else "enc.0"
    named |= {f"{enc}.pred_logits": out["interm_outputs"]["pred_logits"], f"{enc}.pred_boxes": out["interm_outputs"]["pred_boxes"]}
    dn = [*out["dn_outputs"]["aux_outputs"], out["dn_outputs"]]
    for i, layer in enumerate(dn):
        named |= {f"dn.{i}.pred_logits": layer["pred_logits"], f"dn.{i}.pred_boxes": layer["pred_boxes"]}
    return named


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_training_outputs_equal_the_originals(case, dtype, checkpoints):
    out, theirs, _ = train_outputs(case, checkpoints[case], dtype)
    named = named_train_outputs(out, case.startswith("v1"))
    recorded = {k[len("train."):] for k in theirs if k.startswith("train.") and not k.startswith(("train.loss.", "train.match."))}
    assert set(named) == recorded
    worst = {k: diff(v, theirs[f"train.{k}"]) for k, v in named.items()}
    assert max(worst.values()) < TOL[dtype], worst


def original_loss_name(ours: str, layers: int, v1: bool) -> str:
    """visiontf's term name (``loss_ce_1``, ``loss_bbox_interm``, ``loss_giou_dn``) -> the original's weighted one."""
    m = re.fullmatch(r"loss_(ce|bbox|giou)(?:_(\d+|interm|dn)(?:_(\d+))?)?", ours)
    base = {"ce": "loss_vfl", "bbox": "loss_bbox", "giou": "loss_giou"}[m[1]]
    if m[2] is None:
        return base
    if m[2] == "interm":
        return f"{base}_aux_{layers - 1}" if v1 else f"{base}_enc_0"
    if m[2] == "dn":
        return f"{base}_dn_{layers - 1 if m[3] is None else m[3]}"
    return f"{base}_aux_{m[2]}"


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_loss_terms_and_matching_equal_the_originals(case, dtype, checkpoints):
    """visiontf's criterion for the family (varifocal loss, the matcher's costs and weights) on its own outputs."""
    out, theirs, model = train_outputs(case, checkpoints[case], dtype)
    criterion = build_criterion(model, model.num_classes)
    targets = fixture_targets(fixture(case))
    terms = criterion(out, targets, sync_num_boxes=False)
    layers = len(out["aux_outputs"]) + 1
    v1 = case.startswith("v1")
    compared = {}
    for name, value in terms.items():
        if not re.fullmatch(r"loss_(ce|bbox|giou).*", name):
            continue
        weight = criterion.weight_dict.get(name, criterion.weight_dict[name.split("_")[0] + "_" + name.split("_")[1]])
        compared[original_loss_name(name, layers, v1)] = (weight * value).item()
    assert set(compared) == {k[len("train.loss."):] for k in theirs if k.startswith("train.loss.")}
    worst = {k: abs(v - theirs[f"train.loss.{k}"].item()) for k, v in compared.items()}
    assert max(worst.values()) < LOSS_TOL[dtype], worst
    indices = criterion.matcher(out, targets)
    for b, (q, t) in enumerate(indices):
        assert torch.equal(q, theirs[f"train.match.{b}.query"].long()) and torch.equal(t, theirs[f"train.match.{b}.target"].long())


# ------------------------------------------------------------------------------------ checkpoints and counts
@pytest.mark.parametrize("case", sorted(CASES))
def test_toy_models_have_the_originals_parameter_count(case, checkpoints):
    model = load(case, checkpoints[case])
    assert sum(p.numel() for p in model.parameters()) == fixture(case).meta["parameters"]


def test_the_ema_entry_loads_as_the_model_entry(checkpoints):
    checkpoint = torch.load(checkpoints["v1_r18"], weights_only=True)
    ema = checkpoint_entry(checkpoint, "ema")
    model = load("v1_r18", checkpoints["v1_r18"])
    assert convert_state_dict(ema, model).keys() == model.state_dict().keys()
    with pytest.raises(KeyError, match="no 'ema' entry"):
        checkpoint_entry({"model": ema}, "ema")


def published() -> dict[str, tuple[int, dict[str, torch.Size]]]:
    """``LAYOUTS``: section -> (parameter count, {key: shape})."""
    return read_layouts(LAYOUTS)


@pytest.mark.parametrize("name", ["rtdetr_r18vd", "rtdetr_r34vd", "rtdetr_r50vd_m", "rtdetr_r50vd", "rtdetr_r101vd", "rtdetrv2_r18vd",
                                  "rtdetrv2_r34vd", "rtdetrv2_r50vd_m", "rtdetrv2_r50vd", "rtdetrv2_r101vd"])
def test_published_models_have_the_originals_layout_and_parameter_count(name):
    """The original's own build at full width (80 classes): the same count, every tensor mapped to one of the same shape."""
    count, layout = published()[name]
    assert count // 10**6 == PUBLISHED_MILLIONS[name.split("_", 1)[1]]  # the READMEs' millions, truncated
    with torch.device("meta"):
        model = create_model(name)
    assert sum(p.numel() for p in model.parameters()) == count
    if not layout:  # v1's larger models: counts only (their layout is v2's with v1's names, as rtdetr_r18vd's)
        return
    own = model.state_dict()
    converted = convert_state_dict({k: torch.empty(s, device="meta") for k, s in layout.items()}, model)
    assert set(converted) == set(own)
    assert all(converted[k].shape == own[k].shape for k in own)


@pytest.mark.parametrize("depth", [18, 34, 50, 101])
def test_imagenet_weights_in_the_originals_layout_map_onto_the_backbone(depth):
    """The original's PResNet keys (its ImageNet files' layout: the detector's ``backbone.`` part) map one to one."""
    layout = published()[f"rtdetrv2_r{depth}vd"][1]
    backbone = {k[len("backbone."):]: torch.empty(s, device="meta") for k, s in layout.items() if k.startswith("backbone.")}
    with torch.device("meta"):
        body = ResNetVdBackbone(depth).body
    own = {k: v for k, v in body.state_dict().items() if not k.endswith("num_batches_tracked")}
    mapped = {k: v for k, v in resnet_vd_state(backbone).items() if not k.endswith("num_batches_tracked")}
    assert set(mapped) == set(own) and all(mapped[k].shape == own[k].shape for k in own)


def test_imagenet_file_loads_as_the_backbones_pretrained(tmp_path, checkpoints):
    """A random-weight file in the original's PResNet layout (the R50 case's backbone) gives the detector's backbone."""
    fx = fixture("v2_r50_points")
    state = {k[len("backbone."):]: v for k, v in original_state(fx).items() if k.startswith("backbone.")}
    torch.save(state, tmp_path / "ResNet50_vd_ssld_v2_pretrained_from_paddle.pth")
    settings = fx.meta["settings"]["backbone"]
    backbone = ResNetVdBackbone(50, stem_width=settings["stem_width"], widths=settings["widths"], blocks=settings["blocks"],
                                pretrained=tmp_path / "ResNet50_vd_ssld_v2_pretrained_from_paddle.pth").eval()
    model = load("v2_r50_points", checkpoints["v2_r50_points"])
    images = fx.inputs["batch.images"].float()
    with torch.no_grad():
        for a, b in zip(backbone.forward_maps(images), model.backbone.forward_maps(images)):
            assert torch.equal(a, b)


def test_a_release_file_with_only_its_ema_entry_loads(tmp_path):
    """lyuwenyu's trainer writes the EMA weights under ``ema.module``; a file holding only those loads through
    ``create_model(pretrained=)`` as one holding ``model`` does."""
    import torch

    from visiontf.models import create_model

    torch.manual_seed(0)
    source = create_model("rtdetr_tiny", num_classes=3)
    torch.save({"ema": {"module": source.state_dict(), "updates": 12}}, tmp_path / "ema_only.pth")
    loaded = create_model("rtdetr_tiny", num_classes=3, pretrained=tmp_path / "ema_only.pth")
    assert all(torch.equal(a, b) for a, b in zip(source.state_dict().values(), loaded.state_dict().values()))


def test_pretrained_true_names_the_published_file_it_does_not_fetch(monkeypatch):
    """The originals publish GitHub release assets visiontf does not download: ``pretrained=True`` names the file to
    fetch by hand (it said there were no published weights). Nothing is fetched: a download would fail the test."""
    import urllib.request

    import visiontf
    from visiontf.models import ModelNameError

    def no_network(*args, **kwargs):
        raise AssertionError("pretrained=True tried to download")

    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", no_network)
    monkeypatch.setattr(torch.hub, "download_url_to_file", no_network)
    monkeypatch.setattr(urllib.request, "urlopen", no_network)

    for name, file in (("rtdetrv2_r18vd", "rtdetrv2_r18vd_120e_coco_rerun_48.1.pth"), ("dfine_n", "dfine_n_coco.pth")):
        with pytest.raises(ModelNameError, match=rf"^{name}: pretrained=True fetches no file .* https://\S+/{file}: download"):
            visiontf.create_model(name, pretrained=True)
    with pytest.raises(ModelNameError, match="rtdetr_tiny has no published weights"):
        visiontf.create_model("rtdetr_tiny", pretrained=True)
