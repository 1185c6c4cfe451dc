"""Loading original facebookresearch/detr and HuggingFace DETR weights gives their exact outputs.

The original's outputs are recorded (``tests/fixtures/detr/``, written by ``scripts/fixtures/make_detr.py``, which
runs a checkout of facebookresearch/detr): toy-width models with random weights in the original's key layout, run
by the original itself on a padded batch of two images of different sizes, with the model in float32 and in
float64. Each test loads those weights as a user loads the original's checkpoint (``{"model": state_dict}`` through
``create_model(name, pretrained=file)``) and compares. No code of the original runs here. The published widths are
checked by their layouts: ``tests/fixtures/detr/published_layouts.txt`` lists the keys, shapes and parameter
counts of the original's R50, R50-DC5, R101, R101-DC5 and panoptic models as it builds them.
"""
from __future__ import annotations

import logging
import re
import sys
from itertools import product
from pathlib import Path

import pytest
import torch
from detr_helpers import _OURS, _SMALL, _hf_model
from reference.fixtures import FIXTURES, Fixture, load_fixture
from safetensors.torch import save_file
from torch import nn

from visiontf.models import create_model
from visiontf.models.detr.build import DETR_SECTIONS
from visiontf.models.detr.convert import convert_state_dict, detect_format

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # benchmarks/ is not an installed package
# tests/models/test_finetune.py builds its own toy DETR in the original's layout with these two
from reference.detr import OriginalDETR  # noqa: E402, F401

#: the largest difference allowed from the original's recorded outputs, per dtype
TOLERANCE = {"float32": 1e-4, "float64": 1e-8}
DTYPES = {"float32": torch.float32, "float64": torch.float64}
LAYOUTS = FIXTURES / "detr" / "published_layouts.txt"
#: the published layouts' names in the listing, and visiontf's for them
PUBLISHED = {"detr-r50": "detr_resnet50", "detr-r50-dc5": "detr_resnet50_dc5", "detr-r101": "detr_resnet101",
             "detr-r101-dc5": "detr_resnet101_dc5", "detr-r50-panoptic": "detr_resnet50_panoptic",
             "detr-r50-dc5-panoptic": "detr_resnet50_dc5_panoptic", "detr-r101-panoptic": "detr_resnet101_panoptic"}


# --------------------------------------------------------------------------- the recorded original
def _flag(flags: list[str], name: str, default=None):
    return flags[flags.index(name) + 1] if name in flags else default


def toy_kwargs(fixture: Fixture) -> dict:
    """visiontf's arguments (its sections) for the model the generator built from the original's ``main.py`` flags."""
    flags = fixture.meta["flags"]
    return dict(
        num_classes=fixture.weights["class_embed.weight" if "class_embed.weight" in fixture.weights
                                    else "detr.class_embed.weight"].shape[0] - 1,
        backbone=dict(name="timm:resnet18", kwargs=fixture.meta["toy_resnet"], dilation="--dilation" in flags),
        arch=dict(hidden_dim=int(_flag(flags, "--hidden_dim")), nheads=int(_flag(flags, "--nheads")),
                  dim_feedforward=int(_flag(flags, "--dim_feedforward")), enc_layers=int(_flag(flags, "--enc_layers")),
                  dec_layers=int(_flag(flags, "--dec_layers")), num_queries=int(_flag(flags, "--num_queries")),
                  position_embedding=_flag(flags, "--position_embedding", "sine"), dropout=float(_flag(flags, "--dropout"))),
    )


def original_checkpoint(fixture: Fixture, path: Path) -> Path:
    """The fixture's weights as the original's checkpoint file: ``{"model": state_dict}`` in float32."""
    torch.save({"model": {k: v.float() for k, v in fixture.weights.items()}}, path)
    return path


def load_original(fixture: Fixture, name: str, path: Path, dtype: str, **overrides) -> nn.Module:
    model = create_model(name, pretrained=original_checkpoint(fixture, path), **DETR_SECTIONS.merge(toy_kwargs(fixture), overrides))
    return model.eval().to(DTYPES[dtype])


def flat_outputs(out: dict, prefix: str = "") -> dict[str, torch.Tensor]:
    """visiontf's outputs under the fixture's names (``pred_logits``, ``aux_outputs.0.pred_boxes``, ...)."""
    flat = {}
    for key, value in out.items():
        if isinstance(value, torch.Tensor):
            flat[prefix + key] = value
        elif key == "aux_outputs":
            for i, item in enumerate(value):
                flat.update(flat_outputs(item, f"{prefix}{key}.{i}."))
    return flat


def assert_outputs(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], dtype: str) -> dict[str, float]:
    """Every recorded output within the dtype's tolerance; returns the differences.

    visiontf computes the boxes' sigmoid in at least float32 (``DETR.box_outputs``): a float64 model keeps
    float64 boxes, held to float64's tolerance (a box that came back in float32 would be held to float32's).
    """
    assert set(want) <= set(got), sorted(set(want) - set(got))
    diffs = {}
    for key, expected in want.items():
        actual = got[key]
        assert actual.shape == expected.shape, (key, actual.shape, expected.shape)
        diffs[key] = (actual.double() - expected.double()).abs().max().item()
        tol = TOLERANCE[dtype]
        if key.endswith("pred_boxes") and actual.dtype == torch.float32:
            tol = TOLERANCE["float32"]
        assert diffs[key] < tol, (key, dtype, diffs[key])
    return diffs


def run(model: nn.Module, fixture: Fixture, dtype: str) -> dict[str, torch.Tensor]:
    images, mask = fixture.inputs["images"].to(DTYPES[dtype]), fixture.inputs["mask"]
    with torch.no_grad():
        return flat_outputs(model(images, mask))


@pytest.mark.parametrize("case,name,dtype", [(c, n, d) for (c, n), d in product(
    [("detr_sine", "detr_resnet50"), ("detr_learned_dc5", "detr_resnet50_dc5")], DTYPES)])
def test_original_outputs(tmp_path, case, name, dtype):
    """Sine and learned position embeddings (the second on a DC5 body), every decoder layer's outputs."""
    fixture = load_fixture("detr", case)
    model = load_original(fixture, name, tmp_path / "original.pth", dtype)
    want = fixture.outputs[dtype]
    assert len([k for k in want if k.endswith("pred_logits")]) == int(_flag(fixture.meta["flags"], "--dec_layers"))
    assert_outputs(run(model, fixture, dtype), want, dtype)
    # the comparison means something: the padded batch has padded feature cells, the queries differ
    assert fixture.inputs["mask"][1].any() and not fixture.inputs["mask"][0].any()
    assert want["pred_boxes"].std(1).mean() > 0.002 and want["pred_logits"].std(1).mean() > 0.03


@pytest.mark.parametrize("case,name", [("detr_sine", "detr_resnet50"), ("detr_learned_dc5", "detr_resnet50_dc5")])
def test_toy_parameter_counts_and_key_mapping(case, name):
    """The recorded checkpoint's every tensor lands, unchanged, on exactly one of visiontf's, and the counts agree."""
    fixture = load_fixture("detr", case)
    weights = {k: v.float() for k, v in fixture.weights.items()}
    model = create_model(name, **toy_kwargs(fixture))
    assert detect_format(weights) == "original"
    assert sum(p.numel() for p in model.parameters()) == fixture.meta["counts"]["parameters"]
    assert len(weights) == fixture.meta["counts"]["state_dict_entries"]
    converted = convert_state_dict(weights, model)
    assert set(converted) == set(model.state_dict())
    sources = {id(v): k for k, v in weights.items()}
    assert sorted(sources[id(v)] for v in converted.values()) == sorted(weights)  # a renaming: one to one, values kept
    names = {sources[id(v)]: k for k, v in converted.items()}
    assert names["transformer.encoder.layers.0.self_attn.in_proj_weight"] == "transformer.encoder.layers.0.attn.qkv.weight"
    assert names["transformer.decoder.layers.1.multihead_attn.out_proj.bias"] == "transformer.decoder.layers.1.cross_attn.proj.bias"
    assert names["backbone.0.body.layer1.0.conv1.weight"] == "backbone.body.layer1.0.conv1.weight"
    if "backbone.1.row_embed.weight" in weights:
        assert names["backbone.1.row_embed.weight"] == "position_embedding.row_embed.weight"


# --------------------------------------------------------------------------- the published layouts
def published_layouts() -> dict[str, dict]:
    """``tests/fixtures/detr/published_layouts.txt``: per model ``{"keys": {key: shape}, "parameters", "entries"}``,
    the ``{a..b}`` block ranges expanded."""
    layouts: dict[str, dict] = {}
    current = None
    for line in LAYOUTS.read_text().splitlines():
        if line.startswith("## "):
            m = re.match(r"## (\S+) \(flags: .*\): (\d+) parameters, (\d+) state-dict entries$", line)
            current = layouts[m.group(1)] = {"keys": {}, "parameters": int(m.group(2)), "entries": int(m.group(3))}
        elif line and not line.startswith("#"):
            key, shape = line.split(" ", 1)
            shape = tuple(int(s) for s in re.findall(r"\d+", shape))
            m = re.search(r"\{(\d+)\.\.(\d+)\}", key)
            for i in range(int(m.group(1)), int(m.group(2)) + 1) if m else [None]:
                current["keys"][key if i is None else key.replace(m.group(0), str(i))] = shape
    return layouts


@pytest.mark.parametrize("layout", [k for k in PUBLISHED if "panoptic" not in k])
def test_published_layout(layout):
    """Every published detector's full layout maps key for key onto the registered model, with its parameter count."""
    listed = published_layouts()[layout]
    assert len(listed["keys"]) == listed["entries"]
    with torch.device("meta"):
        model = create_model(PUBLISHED[layout])
        state = {k: torch.empty(shape) for k, shape in listed["keys"].items()}
    own = model.state_dict()
    converted = convert_state_dict(state, model)
    assert set(converted) == set(own)
    assert all(converted[k].shape == own[k].shape for k in own)
    assert sum(p.numel() for p in model.parameters()) == listed["parameters"]
    if layout == "detr-r50":
        assert listed["entries"] == 458 and round(listed["parameters"] / 1e6, 1) == 41.5  # the original README's 41.5 M


def _inputs(B=2, H=96, W=128):
    images = torch.randn(B, 3, H, W)
    mask = torch.zeros(B, H, W, dtype=torch.bool)
    mask[1, :, 3 * W // 4 :] = True  # the second image is padded on the right
    mask[1, 5 * H // 6 :, :] = True  # ... and at the bottom
    images[mask[:, None].expand_as(images)] = 0
    return images, mask


def _max_diff(a, b):
    return (a - b).abs().max().item()


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


def _compare_hf(hf, model):
    images, mask = _inputs(H=64, W=96)
    with torch.no_grad():
        ref = hf(pixel_values=images, pixel_mask=(~mask).long())  # HF: 1 on valid pixels
        out = model(images, mask)
    d_logits = _max_diff(out["pred_logits"], ref.logits)
    d_boxes = _max_diff(out["pred_boxes"], ref.pred_boxes)
    assert d_logits < 1e-4 and d_boxes < 1e-4, (d_logits, d_boxes)
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
    model = create_model("detr_tiny", pretrained=path, **DETR_SECTIONS.merge(_OURS, {"arch": {"position_embedding": "learned"}})).eval()
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
    fixture = load_fixture("detr", "detr_sine")
    path = original_checkpoint(fixture, tmp_path / "original.pth")
    with caplog.at_level(logging.WARNING):
        model = create_model("detr_resnet50", pretrained=path, **{**toy_kwargs(fixture), "num_classes": 3})
    dropped = [r.getMessage() for r in caplog.records if "class head not loaded" in r.getMessage()]
    assert len(dropped) == 1 and "class_embed.weight" in dropped[0] and "class_embed.bias" in dropped[0]
    assert "bbox_embed" not in dropped[0]
    assert model.class_embed.out_features == 4
    assert torch.equal(model.bbox_embed.layers[2].weight, fixture.weights["bbox_embed.layers.2.weight"].float())
    assert torch.equal(model.query_embed.weight, fixture.weights["query_embed.weight"].float())


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
