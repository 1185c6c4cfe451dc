"""The monocular-depth example task (docs/architecture.md "How to add a task"): the synthetic set, the
model, the loss and metrics against their formulas, and the whole path from tools/make_synthetic.py
through tools/train.py to tools/predict.py and tools/export.py.

Cost: tiny models on 32x40 images; the end-to-end test (marked slow) about a minute on two shared cores.
"""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from cli_runner import run_tools
from PIL import Image

import visiontf
from visiontf.models.contract import DepthEstimator
from visiontf.tasks.depth.depth_data import DepthDataModule
from visiontf.tasks.depth.depth_synthetic import DEPTH_SCALE, FAR, make_depth_dataset
from visiontf.tasks.depth.depth_task import depth_terms

TINY = {"img_size": (32, 40), "encoder_kwargs": {"patch_size": 8, "depth": 1, "embed_dim": 48, "num_heads": 3}, "channels": 16}


def test_the_synthetic_set_stores_millimetres_with_unmeasured_pixels(tmp_path):
    root = make_depth_dataset(tmp_path / "a", num_train=2, num_val=1, image_size=(32, 40), seed=3)
    again = make_depth_dataset(tmp_path / "b", num_train=2, num_val=1, image_size=(32, 40), seed=3)
    depth = np.asarray(Image.open(root / "depth" / "train" / "00000.png"))
    assert depth.dtype == np.uint16 and depth.shape == (32, 40) and depth.max() <= FAR * DEPTH_SCALE
    assert 0 < (depth == 0).mean() < 0.1  # a few dropouts, as real sensors have
    assert (root / "images" / "val" / "00000.png").read_bytes() == (again / "images" / "val" / "00000.png").read_bytes()
    dm = DepthDataModule(root, image_size=(32, 40), batch_size=2, num_workers=0)
    dm.setup("fit")
    images, true = next(iter(dm.val_dataloader()))
    assert images.shape == (1, 3, 32, 40) and true.shape == (1, 1, 32, 40)
    torch.testing.assert_close(true[0, 0], torch.from_numpy(np.asarray(Image.open(root / "depth" / "val" / "00000.png"),
                                                                      dtype=np.float32)) / DEPTH_SCALE)


def test_the_model_predicts_metres_at_the_input_size():
    model = visiontf.create_model("vit_depth_tiny_patch16", **TINY).eval()
    assert isinstance(model, DepthEstimator) and model.pretrained_cfg.input_size == (3, 32, 40)
    with torch.no_grad():
        out = model(torch.randn(2, 3, 32, 40))
    assert out.shape == (2, 1, 32, 40) and bool(((out > 0) & (out < model.max_depth)).all())


def test_loss_and_metrics_follow_their_formulas_over_measured_pixels():
    true = torch.tensor([[[[2.0, 4.0], [0.0, 8.0]]], [[[0.0, 0.0], [0.0, 0.0]]]])
    predicted = torch.tensor([[[[2.2, 3.0], [5.0, 8.0]]], [[[1.0, 1.0], [1.0, 1.0]]]])
    terms = depth_terms(predicted, true, variance_focus=0.85)
    p, t = np.array([2.2, 3.0, 8.0]), np.array([2.0, 4.0, 8.0])  # the unmeasured pixel is left out
    g = np.log(p) - np.log(t)
    assert terms["silog"][0].item() == pytest.approx(math.sqrt((g**2).mean() - 0.85 * g.mean() ** 2), rel=1e-5)
    assert terms["abs_rel"][0].item() == pytest.approx((abs(p - t) / t).mean(), rel=1e-5)
    assert terms["rmse"][0].item() == pytest.approx(math.sqrt(((p - t) ** 2).mean()), rel=1e-5)
    assert terms["delta1"][0].item() == pytest.approx(2 / 3)
    assert all(torch.isnan(v[1]) for v in terms.values()), "an image without measurements has no score"


@pytest.mark.slow
def test_make_train_predict_and_export_from_the_command_line(tmp_path):
    data, run = tmp_path / "data", tmp_path / "run"
    kwargs = "{img_size: [32, 40], channels: 16, encoder_kwargs: {patch_size: 8, depth: 1, embed_dim: 48, num_heads: 3}}"
    train = ["tools/train.py", "fit", "--config", "configs/depth/vit_depth_tiny_synthetic.yaml", f"--data.init_args.root={data}",
             "--data.init_args.image_size=[32, 40]", "--data.init_args.batch_size=4", "--data.init_args.num_workers=0",
             f"--model.init_args.model_kwargs={kwargs}", "--trainer.max_epochs=2", "--trainer.enable_progress_bar=false",
             f"--trainer.default_root_dir={run}", "--torch_num_threads=1"]
    photo = tmp_path / "photo.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (50, 70, 3), dtype=np.uint8)).save(photo)
    ckpt = run / "checkpoints" / "last.ckpt"
    results = run_tools([
        {"argv": ["tools/make_synthetic.py", "--task", "depth", "--out", data, "--num_train", "8", "--num_val", "4"]},
        {"argv": train},
        {"argv": ["tools/predict.py", "--ckpt_path", ckpt, "--input", photo, "--output", tmp_path / "pred", "--device", "cpu"]},
        {"argv": ["tools/export.py", "--ckpt_path", ckpt, "--output", tmp_path / "depth.safetensors",
                  "--onnx", tmp_path / "depth.onnx"]},
    ], tmp_path)
    for r in results:
        assert r["code"] == 0, r["stderr"][-3000:]
    metrics = (run / "csv").rglob("metrics.csv")
    logged = "".join(p.read_text() for p in metrics)
    assert "val/abs_rel" in logged and "val/delta1" in logged
    saved = torch.load(ckpt, map_location="cpu", weights_only=True)
    assert saved["preprocess"]["input_size"] == (3, 32, 40), "the data module's eval size, saved for prediction"
    (record,) = json.loads((tmp_path / "pred" / "predictions.json").read_text())
    depth = np.asarray(Image.open(tmp_path / "pred" / record["depth"]))
    assert depth.dtype == np.uint16 and depth.shape == (50, 70), "the depth map at the input's own size, in millimetres"
    assert 0 < record["min"] <= record["max"] < 10
    report = json.loads(results[3]["stdout"][results[3]["stdout"].index("{"):])
    assert report["onnx"].endswith("depth.onnx") and (tmp_path / "depth.labels.json").is_file()
