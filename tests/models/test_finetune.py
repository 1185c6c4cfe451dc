"""Fine-tuning published detector weights on other classes, the same path for every DETR-family layout.

``create_model(name, num_classes=K, pretrained=file)`` loads every tensor of the (converted) file
unchanged except the class-dependent ones (``head_prefixes``: the class heads of every decoder layer
and of the two-stage proposals, DINO's denoising label book ``label_enc``), which keep the model's
initialisation and are listed in ONE warning. Weights of another architecture (queries, feature
levels, ...) are refused by the setting that differs. Files: the original DETR and Deformable DETR
layouts (benchmarks' reference models), HuggingFace's (when transformers is installed) and visiontf's
own DINO layout, all at toy sizes.
"""
from __future__ import annotations

import logging
import math
import re

import pytest
import torch
from deformable_helpers import VARIANTS, original, randomize, toy
from safetensors.torch import save_file

from visiontf.io.weights import load_state_dict_file
from visiontf.models import WeightsLayoutError, create_model
from visiontf.models.deformable_detr import convert as deformable_detr_convert
from visiontf.models.detr import convert as detr_convert
from visiontf.models.detr.build import DETR_SECTIONS

REGISTRY_LOG = "visiontf.models._registry"
DEFORMABLE_NAMES = deformable_detr_convert.VARIANT_MODELS
#: a toy DETR in the original layout (ResNet-18, d 64, 1+1 layers, 10 queries, 7 classes) and in visiontf's sections
DETR_ORIGINAL = dict(num_classes=7, backbone="resnet18", d=64, h=4, ne=1, nd=1, ff=96, nq=10)
DETR_OURS = dict(backbone="resnet18", arch=dict(hidden_dim=64, nheads=4, enc_layers=1, dec_layers=1, dim_feedforward=96, num_queries=10))


def _original_detr():
    from detr_helpers import _randomize
    from reference.detr import OriginalDETR

    ref = OriginalDETR(**DETR_ORIGINAL)
    _randomize(ref)
    return ref


def _save(state: dict, path) -> str:
    if str(path).endswith(".safetensors"):
        save_file({k: v.clone().contiguous() for k, v in state.items()}, str(path))  # tied heads: copies
    else:
        torch.save({"model": state}, path)
    return str(path)


def _reinit_line(caplog) -> str | None:
    """The one warning listing the re-initialised tensors (None when nothing was re-initialised)."""
    lines = [r.getMessage() for r in caplog.records if r.name == REGISTRY_LOG and r.levelno >= logging.WARNING]
    assert len(lines) <= 1, lines
    return lines[0] if lines else None


def _listed(line: str) -> set[str]:
    return set(re.findall(r"([\w.]+) \((?:[\d, ]*|not in the weights)\) -> \(", line))


def assert_finetuned(model, expected: dict, caplog) -> set[str]:
    """Every tensor but the class-dependent ones equals ``expected`` (the converted file); those have the
    model's new shapes and are exactly the ones the one warning lists. Returns them."""
    own = model.state_dict()
    class_keys = {k for k in own if k.startswith(model.head_prefixes)}
    assert class_keys
    for key, value in own.items():
        if key in class_keys:
            assert value.shape != expected[key].shape, key
        else:
            assert torch.equal(value, expected[key]), key
    line = _reinit_line(caplog)
    assert line is not None and "class head not loaded because the number of classes differs (fine-tuning)" in line
    assert _listed(line) == class_keys, line
    assert f"({len(class_keys)} class-dependent tensors re-initialised, every other tensor loaded unchanged)" in line
    return class_keys


# --------------------------------------------------------------------------- DETR
def test_original_detr_layout_finetunes_to_3_classes(tmp_path, caplog):
    ref = _original_detr()
    path = _save(ref.state_dict(), tmp_path / "detr-r50-e632da11.pth")
    expected = detr_convert.convert_state_dict(load_state_dict_file(path), create_model("detr_tiny", num_classes=7, **DETR_OURS))
    with caplog.at_level(logging.INFO, logger=REGISTRY_LOG):
        model = create_model("detr_tiny", num_classes=3, pretrained=path, **DETR_OURS)
    assert assert_finetuned(model, expected, caplog) == {"class_embed.weight", "class_embed.bias"}
    assert model.class_embed.out_features == 4  # 3 classes + "no object"


def test_same_number_of_classes_loads_everything_and_warns_nothing(tmp_path, caplog):
    ref = _original_detr()
    path = _save(ref.state_dict(), tmp_path / "detr.pth")
    expected = detr_convert.convert_state_dict(ref.state_dict(), create_model("detr_tiny", num_classes=7, **DETR_OURS))
    with caplog.at_level(logging.INFO, logger=REGISTRY_LOG):
        model = create_model("detr_tiny", num_classes=7, pretrained=path, **DETR_OURS)
    assert _reinit_line(caplog) is None
    assert all(torch.equal(v, expected[k]) for k, v in model.state_dict().items())
    assert "(0 head tensors left at init)" in caplog.text


def test_hf_detr_layout_finetunes_to_3_classes(tmp_path, caplog):
    from detr_helpers import _OURS, _SMALL, _hf_model

    hf = _hf_model(**_SMALL)  # skipped without transformers
    path = _save(hf.state_dict(), tmp_path / "hf_detr.safetensors")
    ours = {k: v for k, v in _OURS.items() if k != "num_classes"}
    expected = detr_convert.convert_state_dict(load_state_dict_file(path), create_model("detr_tiny", num_classes=5, **ours))
    with caplog.at_level(logging.INFO, logger=REGISTRY_LOG):
        model = create_model("detr_tiny", num_classes=3, pretrained=path, **ours)
    assert assert_finetuned(model, expected, caplog) == {"class_embed.weight", "class_embed.bias"}


def test_checkpoint_without_class_head_counts_it_as_reinitialised(tmp_path, caplog):
    """DETR's own recipe deletes class_embed.* from the file: the head is listed as not in the weights."""
    state = {k: v for k, v in _original_detr().state_dict().items() if not k.startswith("class_embed.")}
    path = _save(state, tmp_path / "headless.pth")
    with caplog.at_level(logging.INFO, logger=REGISTRY_LOG):
        create_model("detr_tiny", num_classes=3, pretrained=path, **DETR_OURS)
    line = _reinit_line(caplog)
    assert _listed(line) == {"class_embed.weight", "class_embed.bias"} and "class_embed.bias (not in the weights) -> (4,)" in line


# --------------------------------------------------------------------------- Deformable DETR
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_original_deformable_layout_finetunes_to_3_classes(variant, tmp_path, caplog):
    ref = original(variant)  # 7 classes
    path = _save(ref.state_dict(), tmp_path / "r50_deformable_detr-checkpoint.pth")
    kwargs = toy(variant)
    expected = deformable_detr_convert.convert_state_dict(load_state_dict_file(path), create_model(DEFORMABLE_NAMES[variant], **kwargs))
    with caplog.at_level(logging.INFO, logger=REGISTRY_LOG):
        model = create_model(DEFORMABLE_NAMES[variant], pretrained=path, **{**kwargs, "num_classes": 3})
    heads = {"plain": 1, "box_refine": 2, "two_stage": 3}[variant]  # shared / per decoder layer / + proposals
    assert assert_finetuned(model, expected, caplog) == {f"class_embed.{i}.{p}" for i in range(heads) for p in ("weight", "bias")}
    # re-initialised as a new model's: the original's prior-probability bias (0.01)
    assert torch.allclose(model.class_embed[-1].bias, torch.full((3,), -math.log(99.0)))


@pytest.mark.parametrize("variant", ["plain", "two_stage"])
def test_hf_deformable_layout_finetunes_to_3_classes(variant, tmp_path, caplog):
    from deformable_helpers import hf_deformable_detr as _hf

    hf = _hf(variant)  # 5 classes; skipped without transformers
    path = _save(hf.state_dict(), tmp_path / "hf_deformable.safetensors")
    kwargs = toy(variant, num_classes=5)
    expected = deformable_detr_convert.convert_state_dict(load_state_dict_file(path), create_model(DEFORMABLE_NAMES[variant], **kwargs))
    with caplog.at_level(logging.INFO, logger=REGISTRY_LOG):
        model = create_model(DEFORMABLE_NAMES[variant], pretrained=path, **{**kwargs, "num_classes": 3})
    assert {k.split(".")[0] for k in assert_finetuned(model, expected, caplog)} == {"class_embed"}


# --------------------------------------------------------------------------- DINO (visiontf's layout)
@pytest.fixture(scope="module")
def dino_coco_file(tmp_path_factory):
    """A dino_tiny with COCO's 91 classes (label_enc 92 rows), random weights, as a safetensors file."""
    torch.manual_seed(0)
    model = create_model("dino_tiny", num_classes=91)
    randomize(model)
    path = tmp_path_factory.mktemp("dino") / "dino_tiny_coco.safetensors"
    return _save(model.state_dict(), path), model.state_dict()


@pytest.mark.parametrize("num_classes", [3, 1])
def test_dino_finetunes_class_heads_and_label_book(dino_coco_file, num_classes, caplog):
    path, expected = dino_coco_file
    with caplog.at_level(logging.INFO, logger=REGISTRY_LOG):
        model = create_model("dino_tiny", num_classes=num_classes, pretrained=path)
    reinit = assert_finetuned(model, expected, caplog)
    # the shared decoder head, the proposals' head and the denoising label book (K + 1 rows, the last the padding query)
    assert reinit == {"class_embed.0.weight", "class_embed.0.bias", "class_embed.1.weight", "class_embed.1.bias", "label_enc.weight"}
    assert model.label_enc.weight.shape == (num_classes + 1, 128) and model.class_embed[0].out_features == num_classes
    # a training step's forward with denoising queries built from targets of the new classes
    model.train()
    targets = [{"labels": torch.tensor([num_classes - 1, 0]), "boxes": torch.tensor([[0.5, 0.5, 0.2, 0.3], [0.3, 0.6, 0.1, 0.2]])}]
    out = model(torch.randn(1, 3, 64, 96), targets=targets)
    assert out["pred_logits"].shape[-1] == num_classes and out["dn_outputs"]["pred_logits"].shape[-1] == num_classes
    assert torch.isfinite(out["pred_logits"]).all() and torch.isfinite(out["dn_outputs"]["pred_boxes"]).all()


def test_dino_same_number_of_classes_loads_everything(dino_coco_file, caplog):
    path, expected = dino_coco_file
    with caplog.at_level(logging.INFO, logger=REGISTRY_LOG):
        model = create_model("dino_tiny", num_classes=91, pretrained=path)
    assert _reinit_line(caplog) is None
    assert all(torch.equal(v, expected[k]) for k, v in model.state_dict().items())


def test_detr_finetunes_to_1_class(tmp_path, caplog):
    path = _save(_original_detr().state_dict(), tmp_path / "detr.pth")
    with caplog.at_level(logging.INFO, logger=REGISTRY_LOG):
        model = create_model("detr_tiny", num_classes=1, pretrained=path, **DETR_OURS).eval()
    assert "class_embed.weight (8, 64) -> (2, 64)" in _reinit_line(caplog)  # one class + "no object"
    with torch.no_grad():
        assert model(torch.randn(1, 3, 64, 64))["pred_logits"].shape == (1, 10, 2)


# --------------------------------------------------------------------------- another architecture: refused
def test_detr_with_other_num_queries_is_refused_naming_it(tmp_path):
    path = _save(_original_detr().state_dict(), tmp_path / "detr.pth")  # 10 queries
    with pytest.raises(WeightsLayoutError, match=r"detr\.pth: the weights were trained with num_queries=10, but the model is "
                                                 r"built with num_queries=100\..*create_model\(\.\.\., arch=\{'num_queries': 10\}\), "
                                                 r"or in a config model_kwargs: \{arch: \{num_queries: 10\}\}"):
        create_model("detr_tiny", num_classes=3, pretrained=path, **DETR_SECTIONS.merge(DETR_OURS, {"arch": {"num_queries": 100}}))


def test_original_deformable_with_other_levels_and_queries_is_refused_naming_both(tmp_path):
    path = _save(original("plain").state_dict(), tmp_path / "plain.pth")  # 4 levels, 12 queries
    message = r"trained with num_feature_levels=4, num_queries=12, but the model is built with num_feature_levels=3, num_queries=20"
    with pytest.raises(WeightsLayoutError, match=message):
        create_model("deformable_detr_resnet50", pretrained=path, **toy(num_classes=3, arch={"num_feature_levels": 3, "num_queries": 20}))


def test_dino_with_other_levels_is_refused_naming_them(dino_coco_file):
    path, _ = dino_coco_file
    with pytest.raises(WeightsLayoutError, match=r"num_feature_levels=3, but the model is built with num_feature_levels=4.*"
                                                 r"model_kwargs: \{arch: \{num_feature_levels: 3\}\}"):
        create_model("dino_tiny", num_classes=3, pretrained=path, arch={"num_feature_levels": 4})


def test_other_tensor_shapes_are_refused_by_name_or_skipped_when_not_strict(tmp_path, caplog):
    """A size the settings do not name (the FFN width): refused naming the tensors; strict=False keeps what fits."""
    path = _save(_original_detr().state_dict(), tmp_path / "detr.pth")  # FFN 96
    other = DETR_SECTIONS.merge(DETR_OURS, {"arch": {"dim_feedforward": 64}})
    with pytest.raises(WeightsLayoutError, match=r"have another shape than in detr_tiny as built \(weights -> model\): "
                                                 r"transformer\.encoder\.layers\.0\.mlp\.fc1\.weight \(96, 64\) -> \(64, 64\)"):
        create_model("detr_tiny", num_classes=3, pretrained=path, **other)
    with caplog.at_level(logging.INFO, logger=REGISTRY_LOG):
        model = create_model("detr_tiny", num_classes=3, pretrained=path, strict=False, **other)
    assert "tensors not loaded because their shapes differ (strict=False)" in caplog.text
    assert "strict=False: not all others loaded" in caplog.text
    ref = detr_convert.convert_state_dict(load_state_dict_file(path), model)
    assert torch.equal(model.state_dict()["query_embed.weight"], ref["query_embed.weight"])


def test_weights_of_another_real_time_family_are_refused_by_name_or_skipped_when_not_strict(tmp_path, caplog):
    """RT-DETR and D-FINE declare no weights settings, so a tensor of another shape reaches load_state_dict: its
    RuntimeError (a traceback in the tools) is a WeightsLayoutError naming the tensors, as for the DETR family."""
    from visiontf.io.weights import save_model

    torch.manual_seed(0)
    path = save_model(create_model("rtdetr_tiny", num_classes=4), tmp_path / "rt.safetensors")
    with pytest.raises(WeightsLayoutError, match=r"rt\.safetensors: 8 tensor\(s\) of the weights have another shape than "
                                                 r"in dfine_tiny as built \(weights -> model\): encoder\.input_proj\.0\.conv"
                                                 r"\.weight \(128, 64, 1, 1\) -> \(128, 96, 1, 1\);.*another variant or family"):
        create_model("dfine_tiny", num_classes=2, pretrained=path)
    with caplog.at_level(logging.INFO, logger=REGISTRY_LOG):
        model = create_model("dfine_tiny", num_classes=2, pretrained=path, strict=False)
    assert "8 tensors not loaded because their shapes differ (strict=False)" in caplog.text
    # what fits loaded: the decoder's layers are alike in both
    saved, loaded = load_state_dict_file(path), model.state_dict()
    shared = [k for k in loaded if k.startswith("decoder.layers.") and k in saved and saved[k].shape == loaded[k].shape]
    assert len(shared) > 20 and all(torch.equal(loaded[k], saved[k]) for k in shared)


# --------------------------------------------------------------------------- from a config to an export
def _tiny_recipe_argv(config: str, model_name: str, data, pretrained, out) -> list[str]:
    """``tools/train.py fit`` on a fine-tuning recipe, at the doc test's tiny sizes on the CPU."""
    from handmade_data import TINY_COCO_RUN as TINY

    return ["tools/train.py", "fit", "--config", config, "--data.root", str(data), "--model.init_args.pretrained", str(pretrained),
            f"--model.init_args.model_name={model_name}", "--trainer.accelerator=cpu", "--trainer.devices=1",
            "--trainer.strategy=auto", "--trainer.default_root_dir", str(out), *TINY]


@pytest.mark.slow
def test_recipes_finetune_coco_weights_then_export_and_predict_the_new_classes(tmp_path):
    """dino_tiny and detr_tiny with COCO's 91 classes (visiontf layout) fine-tuned by the shipped recipes to
    the hand-made set's 3 classes (ids 3, 7, 12); the export's labels file, ONNX graph and Predictor carry them."""
    import json

    import onnxruntime as ort
    import yaml
    from cli_runner import run_tools
    from handmade_data import TINY_COCO_MODEL as TINY_MODEL
    from handmade_data import make_dataset

    from visiontf.inference.predictor import Predictor

    data = make_dataset(tmp_path / "data", "coco")
    small = dict(backbone=dict(frozen_bn=False, freeze_stem=False), arch=dict(num_queries=10, enc_layers=1, dec_layers=1))
    assert yaml.safe_load(TINY_MODEL) == small
    runs = {"dino": ("configs/deformable_detr/dino_r50_finetune_custom.yaml", "dino_tiny", 3),
            "detr": ("configs/detr/detr_r50_finetune_custom.yaml", "detr_tiny", 4)}  # logits: K sigmoid, K + 1 softmax
    cases = []
    for name, (config, model_name, _) in runs.items():
        coco = _save(create_model(model_name, num_classes=91, **small).state_dict(), tmp_path / f"{name}_coco.safetensors")
        out = tmp_path / name
        cases += [
            {"argv": _tiny_recipe_argv(config, model_name, data, coco, out)},
            {"argv": ["tools/export.py", "--ckpt_path", out / "checkpoints" / "last.ckpt", "--output", out / "model.safetensors",
                      "--onnx", out / "model.onnx", "--image_size", "64", "64"]},
            {"argv": ["tools/predict.py", "--weights", out / "model.safetensors", "--input", data / "images" / "val",
                      "--output", out / "pred", "--annotations", data / "annotations" / "val.json", "--score_threshold", "0.0",
                      "--top_k", "3", "--device", "cpu"]},
        ]
    results = run_tools(cases, tmp_path, timeout=900)
    for case, r in zip(cases, results):
        assert r["code"] == 0, f"{' '.join(map(str, case['argv']))}\n{r['stdout'][-2000:]}\n{r['stderr'][-4000:]}"
    for i, (name, (_, _, width)) in enumerate(runs.items()):
        fit, export = results[3 * i], results[3 * i + 1]
        line = next(ln for ln in fit["stderr"].splitlines() if "class head not loaded" in ln)
        expected = {"class_embed.0.weight", "class_embed.0.bias", "class_embed.1.weight", "class_embed.1.bias", "label_enc.weight"} \
            if name == "dino" else {"class_embed.weight", "class_embed.bias"}
        assert _listed(line) == expected, line
        assert ("label_enc.weight (92, 128) -> (4, 128)" if name == "dino" else "class_embed.weight (92, 128) -> (4, 128)") in line
        out = tmp_path / name
        ckpt = torch.load(out / "checkpoints" / "last.ckpt", weights_only=True, map_location="cpu")
        assert ckpt["hyper_parameters"]["num_classes"] == 3 and ckpt["label_to_cat_id"] == {0: 3, 1: 7, 2: 12}
        labels = json.loads((out / "model.labels.json").read_text())
        assert labels["label_to_cat_id"] == {"0": 3, "1": 7, "2": 12} and labels["class_names"] == ["circle", "square", "bar"]
        assert json.loads(export["stdout"])["onnx_max_abs_diff"] < 1e-4
        logits = next(o for o in ort.InferenceSession(str(out / "model.onnx")).get_outputs() if o.name == "pred_logits")
        assert logits.shape[-1] == width, (name, logits.shape)
        predictor = Predictor.from_file(out / "model.safetensors", device="cpu")
        assert predictor.label_to_cat_id == {0: 3, 1: 7, 2: 12}
        found = predictor(data / "images" / "val", score_threshold=0.0, top_k=5)
        assert found and all(set(r["labels"].tolist()) <= {0, 1, 2} and len(r["labels"]) == 5 for r in found)
        preds = json.loads((out / "pred" / "predictions.json").read_text())
        assert preds and {p["category_id"] for p in preds} <= {3, 7, 12} and {p["image_id"] for p in preds} <= {101, 102}
