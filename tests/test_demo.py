"""`make demo` end to end on a tiny set: data, training, COCO table, pictures (the real demo trains longer)."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_demo_runs_end_to_end(tmp_path):
    out = tmp_path / "demo"
    cmd = [sys.executable, "tools/demo.py", "--out", str(out), "--data", str(tmp_path / "data"), "--epochs", "1",
           "--num-train", "16", "--num-val", "5", "--num-pictures", "2"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Average Precision  (AP) @[ IoU=0.50:0.95 | area=   all | maxDets=100 ]" in proc.stdout
    stats = json.loads((out / "coco_stats.json").read_text())
    assert 0.0 <= stats["map"] <= 1.0
    pictures = sorted((out / "pictures").glob("*.png"))
    assert len(pictures) == 2
    for p in pictures:
        arr = np.asarray(Image.open(p))
        assert arr.ndim == 3 and arr.std() > 0
