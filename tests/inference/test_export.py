"""Export round trips (safetensors -> load_model, ONNX -> onnxruntime) and the export/predict CLIs."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import visiontf
from visiontf.cli import export_main
from visiontf.inference.export import example_inputs, export_model, export_onnx, onnx_max_abs_diff
from visiontf.inference.predictor import Predictor, read_labels_file

ROOT = Path(__file__).resolve().parents[2]


def test_safetensors_round_trip_with_labels(tmp_path):
    vit = visiontf.create_model("vit_tiny_patch16_224", num_classes=3, img_size=32, depth=1).eval()
    report = export_model(vit, tmp_path / "vit.safetensors", class_names=["a", "b", "c"], preprocess={"crop_pct": 1.0})
    back = visiontf.load_model(report["safetensors"]).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(back(x), vit(x), atol=0, rtol=0)
    also = visiontf.create_model("vit_tiny_patch16_224", pretrained=report["safetensors"], num_classes=3, img_size=32, depth=1).eval()
    with torch.no_grad():
        torch.testing.assert_close(also(x), vit(x), atol=0, rtol=0)
    assert read_labels_file(report["safetensors"])["class_names"] == ["a", "b", "c"]
    p = Predictor.from_file(report["safetensors"], device="cpu")
    assert p.class_names == ["a", "b", "c"] and p.cfg["crop_pct"] == 1.0


def test_onnx_vit_matches_pytorch(tmp_path):
    vit = visiontf.create_model("vit_tiny_patch16_224", num_classes=4, img_size=32, depth=2).eval()
    path = export_onnx(vit, tmp_path / "vit.onnx")
    # batch is dynamic: a batch of 3 through a graph traced with 1
    assert onnx_max_abs_diff(vit, path, example_inputs(vit, batch_size=3)) < 1e-4
    assert not vit.training, "export leaves the model in eval mode"


@pytest.mark.slow
def test_onnx_detr_matches_pytorch_with_padding_and_other_sizes(tmp_path):
    detr = visiontf.create_model("detr_tiny", num_classes=3, arch={"enc_layers": 1, "dec_layers": 1}).eval()
    path = export_onnx(detr, tmp_path / "detr.onnx", image_size=(64, 96))
    padded = example_inputs(detr, image_size=(64, 96), batch_size=2, pad=True)
    assert bool(padded["mask"].any())
    assert onnx_max_abs_diff(detr, path, padded) < 1e-4
    # height, width and batch are dynamic axes of the detection graph
    assert onnx_max_abs_diff(detr, path, example_inputs(detr, image_size=(96, 64), batch_size=3, pad=True)) < 1e-4


def _fake_checkpoint(model, path: Path, model_name: str, num_classes: int, model_kwargs: dict) -> Path:
    """What a visiontf task's Lightning checkpoint holds for the network (``model.*`` keys, hparams)."""
    ckpt = {
        "state_dict": {f"model.{k}": v for k, v in model.state_dict().items()} | {"criterion.empty_weight": torch.ones(num_classes + 1)},
        "hyper_parameters": {"model_name": model_name, "num_classes": num_classes, "model_kwargs": model_kwargs},
        "preprocess": {"min_size": 64, "max_size": 96},
        "epoch": 0,
    }
    torch.save(ckpt, path)
    return path


@pytest.mark.slow
def test_export_and_predict_clis(tmp_path):
    kwargs = {"arch": {"enc_layers": 1, "dec_layers": 1}}
    detr = visiontf.create_model("detr_tiny", num_classes=2, **kwargs).eval()
    ckpt = _fake_checkpoint(detr, tmp_path / "detr.ckpt", "detr_tiny", 2, kwargs)
    out = tmp_path / "export" / "detr.safetensors"
    run = lambda *a: subprocess.run([sys.executable, *map(str, a)], capture_output=True, text=True, timeout=240)  # noqa: E731
    # in-process (the script only calls export_main); ONNX is covered above
    assert export_main(["--ckpt_path", str(ckpt), "--output", str(out)]) == 0
    assert out.is_file() and out.with_suffix(".json").is_file()
    x = torch.randn(1, 3, 64, 80)
    with torch.no_grad():
        torch.testing.assert_close(visiontf.load_model(out).eval()(x)["pred_boxes"], detr(x)["pred_boxes"], atol=0, rtol=0)
    # the checkpoint's eval preprocessing travels with the export
    saved = read_labels_file(out)["preprocess"]
    assert (saved["min_size"], saved["max_size"]) == (64, 96)

    images = tmp_path / "images"
    images.mkdir()
    rng = np.random.default_rng(0)
    for name, (h, w) in {"000000000042.png": (50, 70), "street.png": (81, 37)}.items():
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(images / name)
    ann = tmp_path / "ann.json"
    ann.write_text(json.dumps({
        "images": [{"id": 42, "file_name": "000000000042.png", "height": 50, "width": 70},
                   {"id": 7, "file_name": "street.png", "height": 81, "width": 37}],
        "annotations": [], "categories": [{"id": 3, "name": "car"}, {"id": 9, "name": "person"}],
    }))
    pred_dir = tmp_path / "pred"
    proc = run(ROOT / "tools/predict.py", "--weights", out, "--input", images, "--output", pred_dir,
               "--score_threshold", 0.0, "--top_k", 3, "--annotations", ann, "--attention", "--device", "cpu")
    assert proc.returncode == 0, proc.stderr[-3000:]
    preds = json.loads((pred_dir / "predictions.json").read_text())
    assert len(preds) == 6
    assert {p["image_id"] for p in preds} == {42, 7}
    assert {p["category_id"] for p in preds} <= {3, 9}
    assert all(len(p["bbox"]) == 4 and p["bbox"][2] >= 0 and 0 <= p["score"] <= 1 for p in preds)
    for stem, (h, w) in {"000000000042": (50, 70), "street": (81, 37)}.items():
        pic = np.asarray(Image.open(pred_dir / f"{stem}.png"))
        assert pic.shape == (h, w, 3)
        orig = np.asarray(Image.open(images / f"{stem}.png"))
        assert (pic != orig).any(), "boxes drawn"
        assert (pred_dir / f"{stem}_attention.png").is_file()
    # predictions match the Python API on the same batch (same preprocessing from the labels file)
    p = Predictor.from_file(out, device="cpu")
    r = p(images, score_threshold=0.0, top_k=3)[1]
    street = [q for q in preds if q["image_id"] == 7]
    x0, y0, bw, bh = street[0]["bbox"]
    np.testing.assert_allclose([x0, y0, x0 + bw, y0 + bh], r["boxes"][0].numpy(), atol=0.02)
