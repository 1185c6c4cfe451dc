"""Restoration outside training: the Predictor returns restored images, and the recipe's command lines
(tools/train.py fit -> eval.py -> predict.py -> export.py) work end to end at toy size."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from cli_runner import run_tools
from ipt_helpers import RECIPE as CONFIG
from ipt_helpers import toy_overrides
from PIL import Image

from visiontf.inference import Predictor
from visiontf.models import create_model

SMALL = {"n_feats": 4, "patch_dim": 4, "num_heads": 2, "num_layers": 1, "tile_size": 16}


def test_predictor_returns_restored_images():
    torch.manual_seed(0)
    model = create_model("ipt_tiny", **SMALL)
    images = [torch.rand(3, 20, 24), torch.rand(3, 11, 9)]
    results = Predictor(model, device="cpu")(images)
    assert [tuple(r["image"].shape) for r in results] == [(3, 40, 48), (3, 22, 18)]
    assert all(r["image"].dtype == torch.uint8 and r["task"] == "sr_x2" for r in results)
    with torch.no_grad():
        expected = (model(images[0][None]).clamp(0, 1) * 255).round().to(torch.uint8)[0]
    assert torch.equal(results[0]["image"], expected)


def test_predictor_runs_the_chosen_task_of_a_multitask_model():
    model = create_model("ipt_tiny", **SMALL, tasks=("sr_x2", "denoise_sigma30"))
    out = Predictor(model, device="cpu", preprocess={"restore_task": "denoise_sigma30"})([torch.rand(3, 20, 20)])
    assert out[0]["image"].shape == (3, 20, 20) and out[0]["task"] == "denoise_sigma30"
    with pytest.raises(ValueError, match="restore_task"):
        Predictor(model, device="cpu", preprocess={"restore_task": "derain"})([torch.rand(3, 20, 20)])


@pytest.mark.slow
def test_recipe_fit_eval_predict_export(tmp_path):
    root = _make_photos(tmp_path)
    out = tmp_path / "run"
    ckpt = out / "checkpoints" / "last.ckpt"
    lr_dir = tmp_path / "lr"
    lr_dir.mkdir()
    for name, size in (("a", (30, 26)), ("b.x", (17, 21))):
        Image.fromarray(np.random.default_rng(0).integers(0, 255, (*size, 3), dtype=np.uint8)).save(lr_dir / f"{name}.jpg")
    data = [f"--data.init_args.root={root}", "--data.init_args.val_crop=64", "--data.init_args.num_workers=0"]
    results = run_tools([
        {"argv": ["tools/train.py", "fit", "--config", CONFIG, *toy_overrides(root, out), "--trainer.max_steps=2"]},
        {"argv": ["tools/eval.py", "--config", CONFIG, *data, f"--trainer.default_root_dir={out}",
                  "--model.init_args.model_kwargs={scale: 2, n_feats: 4, num_layers: 1, num_heads: 2}",
                  "--trainer.enable_progress_bar=false", "--ckpt_path", ckpt, "--output", tmp_path / "stats.json"]},
        {"argv": ["tools/predict.py", "--ckpt_path", ckpt, "--input", lr_dir, "--output", tmp_path / "sr"]},
        {"argv": ["tools/export.py", "--ckpt_path", ckpt, "--output", tmp_path / "model.safetensors"]},
    ], tmp_path)
    for r in results:
        assert r["code"] == 0, (r["argv"], r["stderr"][-3000:])
    state = torch.load(ckpt, map_location="cpu", weights_only=True)
    assert state["global_step"] == 2 and state["task"] == "restoration"
    # eval prints the table and the JSON with PSNR-Y / SSIM-Y and the bicubic baseline
    assert "PSNR-Y" in results[1]["stdout"] and "bicubic" in results[1]["stdout"]
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert 5 < stats["val/psnr_y"] < 60 and "val/ssim_y" in stats and "psnr_y_bicubic_sr_x2" in stats
    # predict writes each input's restored image under its own name, as PNG, at twice the size
    written = sorted(p.name for p in (tmp_path / "sr").glob("*.png"))
    assert written == ["a.png", "b.x.png"]
    assert Image.open(tmp_path / "sr" / "a.png").size == (52, 60)
    records = json.loads((tmp_path / "sr" / "predictions.json").read_text())
    assert [r["output"] for r in records] == ["a.png", "b.x.png"]
    # the export predicts the same images
    exported = Predictor.from_file(tmp_path / "model.safetensors", device="cpu")
    again = exported([str(lr_dir / "a.jpg")])[0]["image"]
    assert torch.equal(again, torch.from_numpy(np.array(Image.open(tmp_path / "sr" / "a.png"))).permute(2, 0, 1))


def _make_photos(tmp_path: Path) -> Path:
    import cv2

    root = tmp_path / "photos"
    y, x = np.mgrid[0:100, 0:104]
    for split, n in (("train", 3), ("val", 1)):
        (root / split).mkdir(parents=True)
        for i in range(n):
            img = np.stack([128 + 80 * np.sin(x / (4.0 + i) + c) * np.cos(y / 6.0) for c in range(3)], axis=2)
            cv2.imwrite(str(root / split / f"p{i}.png"), img.astype(np.uint8))
    return root
