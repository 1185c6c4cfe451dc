"""`make demo` end to end on a tiny set: data, a line per epoch, COCO table, pictures, one summary line
(the real demo trains longer); and its pictures: ground truth beside predictions, enlarged."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from visiontf.tasks.drawing import color_for, compare_detections

ROOT = Path(__file__).resolve().parents[2]


def test_pictures_put_ground_truth_beside_predictions_enlarged():
    image = torch.full((3, 100, 150), 128, dtype=torch.uint8)
    truth = {"boxes": torch.tensor([[10.0, 20.0, 50.0, 60.0]]), "labels": torch.tensor([1])}
    pred = {"boxes": torch.tensor([[12.0, 22.0, 52.0, 62.0]]), "labels": torch.tensor([2]), "scores": torch.tensor([0.9])}
    out = compare_detections(image, truth, pred, ["a", "b", "c"], min_side=384)
    scale = 384 / 100
    band = out.shape[1] - 384
    assert 0 < band < 60 and out.shape[2] == 2 * round(150 * scale) + 8  # two panels under their titles
    left, right = out[:, band:, : round(150 * scale)], out[:, band:, round(150 * scale) + 8 :]
    # each box is drawn after enlarging, at the scaled place, in its class colour
    x0, y0 = round(10 * scale), round(40 * scale)
    assert tuple(left[:, y0, x0].tolist()) == color_for(1)
    assert tuple(right[:, round(42 * scale), round(12 * scale)].tolist()) == color_for(2)
    assert (left[:, 200, 400] == 128).all() and (right[:, 200, 400] == 128).all()  # the image itself elsewhere


@pytest.mark.slow
@pytest.mark.parametrize("native_bf16", ["1", "0"], ids=["native-bf16-cpu", "cpu-without-bf16"])
def test_demo_runs_end_to_end(tmp_path, native_bf16):
    """On both CPU kinds, forced: bf16-mixed (emulated, slowly, where the CPU lacks it) and the float32 fallback. Typed
    outside the repository with relative paths: they are the caller's (the steps run in the repository, where the
    data and the run once landed while the tool looked for them where it was typed)."""
    out = tmp_path / "demo"
    cmd = [sys.executable, str(ROOT / "tools/demo.py"), "--out", "demo", "--data", "data", "--epochs", "1",
           "--num_train", "16", "--num_val", "5", "--num_pictures", "2"]
    env = {**os.environ, "VISIONTF_NATIVE_BF16": native_bf16}
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    bf16 = "bfloat16 Automatic Mixed Precision" in proc.stdout + proc.stderr
    assert bf16 == (native_bf16 == "1"), (proc.stdout + proc.stderr)[-3000:]
    assert "Average Precision  (AP) @[ IoU=0.50:0.95 | area=   all | maxDets=100 ] = " in proc.stdout
    assert re.search(r"^epoch 1/1  loss [\d.]+  [\d.]+ s/epoch  elapsed \d+:\d\d  val/mAP [\d.]+", proc.stdout, re.M), proc.stdout[-2000:]
    summary = proc.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"make demo: \S+ trained for 2 steps \(1\.0 epochs\) on 16 images in [\d.]+ min \([\d.]+ min in all\): "
                        r"COCO mAP [\d.]+, AP50 [\d.]+ on 5 val images; pictures: .*demo_detections\.png", summary), summary
    stats = json.loads((out / "coco_stats.json").read_text())
    assert 0.0 <= stats["map"] <= 1.0
    pairs = sorted((out / "pictures").glob("*_pred.png"))
    assert len(pairs) == 2
    for p in pairs:
        arr = np.asarray(Image.open(p))
        assert arr.ndim == 3 and arr.std() > 0
        assert arr.shape[0] >= 384 and arr.shape[1] >= 2 * 384  # enlarged, ground truth | prediction
    assert Image.open(out / "pictures" / "demo_detections.png").size[1] >= 2 * 384
