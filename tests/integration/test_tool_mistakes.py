"""Every tool answers a mistake with one line and exit code 2, naming the option or file, the field and the fix.

The cases of reliability round 4: a misspelt option is named first, with the closest ones ("unknown option
--outptu; did you mean --output?"), before the error it would cause ("--output is required"); a config that
is a JPEG, a weights file without a config or whose config is not JSON or not a mapping, a float8 tensor, a
GPU that is not there, a negative count. Each used to end in a traceback or, for the count, an empty split
written with exit code 0. All cases run in one process (:func:`cli_runner.run_tools`).
"""
from __future__ import annotations

import json

import pytest
import torch
from cli_runner import error_line, run_tools
from PIL import Image

CONFIG = "configs/detr/detr_tiny_shapes.yaml"
TINY = {"arch": {"hidden_dim": 32, "nheads": 2, "enc_layers": 1, "dec_layers": 1, "dim_feedforward": 32, "num_queries": 5}}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    from visiontf.io.weights import save_model
    from visiontf.models import create_model

    tmp = tmp_path_factory.mktemp("mistakes")
    Image.new("RGB", (32, 24), (90, 120, 30)).save(tmp / "photo.jpg")
    (tmp / "list.yaml").write_text("- a\n- b\n")
    (tmp / "broken.yaml").write_text("trainer: [1\n")
    torch.save({"a": torch.zeros(2)}, tmp / "plain.pth")
    model = create_model("detr_tiny", num_classes=3, **TINY)
    good = save_model(model, tmp / "good.safetensors", "detr_tiny", num_classes=3, **TINY)
    tensors = load_file(good)
    with safe_open(good, "pt") as f:
        meta = dict(f.metadata())
    variants = {"not_json": {**meta, "visiontf_config": "{model_name: detr_tiny"},
                "a_list": {**meta, "visiontf_config": "[1, 2]"},
                "no_name": {**meta, "visiontf_config": json.dumps({"model_kwargs": {}})}}
    for name, metadata in variants.items():
        save_file(tensors, tmp / f"{name}.safetensors", metadata=metadata)
    float8 = dict(tensors)
    key = next(k for k, v in tensors.items() if v.dim() == 2)
    float8[key] = tensors[key].to(torch.float8_e4m3fn)
    save_file(float8, tmp / "float8.safetensors", metadata=meta)
    return tmp, key


def test_mistakes_are_one_line_naming_the_fix(files):
    tmp, float8_key = files
    out = tmp / "out"
    cases = {
        # misspelt options: named first, with the closest, whatever else is missing
        "eval --outptu": ["tools/eval.py", "--config", CONFIG, "--outptu", tmp / "s.json"],
        "eval --ckpt_pth": ["tools/eval.py", "--config", CONFIG, "--ckpt_pth", tmp / "k.ckpt"],
        "fit --ckpt_pth": ["tools/train.py", "fit", "--config", CONFIG, "--ckpt_pth", "last"],
        "predict --ckpt_pth": ["tools/predict.py", "--ckpt_pth", tmp / "k.ckpt", "--input", tmp, "--output", out],
        "predict --outptu": ["tools/predict.py", "--weights", tmp / "good.safetensors", "--input", tmp, "--outptu", out],
        "export --ckpt_pth": ["tools/export.py", "--ckpt_pth", tmp / "k.ckpt"],
        "sample --ckpt_pth": ["tools/sample.py", "--ckpt_pth", tmp / "k.ckpt"],
        "make_synthetic --num_trian": ["tools/make_synthetic.py", "--task", "detection", "--num_trian", "3"],
        "results --predictionz": ["tools/eval.py", "--annotations", tmp / "a.json", "--predictionz", tmp / "r.json"],
        # bad values and files
        "negative count": ["tools/make_synthetic.py", "--task", "detection", "--out", tmp / "set", "--num_train", "-1"],
        "config is a JPEG": ["tools/eval.py", "--config", tmp / "photo.jpg", "--ckpt_path", tmp / "k.ckpt"],
        "config is a list": ["tools/eval.py", "--config", tmp / "list.yaml"],
        "config is broken": ["tools/train.py", "fit", "--config", tmp / "broken.yaml"],
        "no GPU 7": ["tools/predict.py", "--weights", tmp / "good.safetensors", "--input", tmp / "photo.jpg",
                     "--output", out, "--device", "cuda:7"],
        "weights without a config": ["tools/predict.py", "--weights", tmp / "plain.pth", "--input", tmp / "photo.jpg",
                                     "--output", out],
        "config not JSON": ["tools/predict.py", "--weights", tmp / "not_json.safetensors", "--input", tmp / "photo.jpg",
                            "--output", out],
        "config a list": ["tools/predict.py", "--weights", tmp / "a_list.safetensors", "--input", tmp / "photo.jpg",
                          "--output", out],
        "config without a name": ["tools/predict.py", "--weights", tmp / "no_name.safetensors", "--input",
                                  tmp / "photo.jpg", "--output", out],
        "float8": ["tools/predict.py", "--weights", tmp / "float8.safetensors", "--input", tmp / "photo.jpg",
                   "--output", out],
    }
    expected = {
        "eval --outptu": "eval.py: error: unknown option --outptu; did you mean --output?",
        "eval --ckpt_pth": "eval.py: error: unknown option --ckpt_pth; did you mean --ckpt_path",
        "fit --ckpt_pth": "train.py: error: unknown option --ckpt_pth; did you mean --ckpt_path",
        "predict --ckpt_pth": "predict.py: error: unknown option --ckpt_pth; did you mean --ckpt_path?",
        "predict --outptu": "predict.py: error: unknown option --outptu; did you mean --output?",
        "export --ckpt_pth": "export.py: error: unknown option --ckpt_pth; did you mean --ckpt_path?",
        "sample --ckpt_pth": "sample.py: error: unknown option --ckpt_pth; did you mean --ckpt_path?",
        "make_synthetic --num_trian": "make_synthetic.py: error: unknown option --num_trian; did you mean --num_train",
        "results --predictionz": "eval.py: error: unknown option --predictionz; did you mean --predictions?",
        "negative count": "make_synthetic.py: error: --num_train -1: must be >= 1",
        "config is a JPEG": f"eval.py: error: --config {tmp / 'photo.jpg'}: not a text file (binary data)",
        "config is a list": f"eval.py: error: --config {tmp / 'list.yaml'}: a YAML list, not a mapping of sections",
        "config is broken": f"train.py: error: --config {tmp / 'broken.yaml'}: not valid YAML at line 2 column 1",
        "no GPU 7": "predict.py: error: --device cuda:7: ",
        "weights without a config": f"predict.py: error: {tmp / 'plain.pth'}: no visiontf config in the file's metadata",
        "config not JSON": f"predict.py: error: {tmp / 'not_json.safetensors'}: its metadata's visiontf_config is not JSON",
        "config a list": f"predict.py: error: {tmp / 'a_list.safetensors'}: its metadata's visiontf_config is a JSON list, "
                         "not a mapping",
        "config without a name": f"predict.py: error: {tmp / 'no_name.safetensors'}: its metadata's visiontf_config has no "
                                 "model_name",
        "float8": f"predict.py: error: {tmp / 'float8.safetensors'}: tensor '{float8_key}' is torch.float8_e4m3fn, a "
                  "quantised format visiontf does not load",
    }
    if torch.cuda.device_count() > 7:
        del cases["no GPU 7"]
    results = run_tools([{"argv": argv} for argv in cases.values()], tmp)
    for name, result in zip(cases, results):
        assert result["code"] == 2, (name, result["stderr"][-2000:])
        assert error_line(result).startswith(expected[name]), (name, error_line(result))
    assert not (tmp / "set").exists()  # nothing written for a refused count


def test_the_strict_load_message_lists_only_what_is_wrong(tmp_path):
    from safetensors.torch import save_file

    from visiontf.io.weights import WeightsError
    from visiontf.models import create_model

    state = create_model("detr_tiny", num_classes=3, **TINY).state_dict()
    state.pop("query_embed.weight")
    save_file({k: v.contiguous() for k, v in state.items()}, tmp_path / "w.safetensors")
    with pytest.raises(WeightsError) as e:
        create_model("detr_tiny", num_classes=3, pretrained=tmp_path / "w.safetensors", **TINY)
    message = str(e.value)
    assert "missing 1 key (e.g. query_embed.weight)" in message and "unexpected" not in message, message
    assert "in Python, create_model" in message  # strict=False is a Python argument, said as such


@pytest.mark.parametrize("side", [8, 16, 31])
def test_a_vitdet_detector_takes_an_image_smaller_than_its_coarsest_stride(side):
    """The 0.5 level max-pools the patch grid: an image under two patches left it no cell ("Output size is too
    small"). The image is padded to the coarsest stride and masked, as a padded batch is."""
    from visiontf.models import create_model

    model = create_model("dino_vit_small_simplefpn", num_classes=3, arch={"num_queries": 4}).eval()
    with torch.no_grad():
        out = model(torch.rand(1, 3, side, side))
    assert out["pred_boxes"].shape == (1, 4, 4) and torch.isfinite(out["pred_logits"]).all()
