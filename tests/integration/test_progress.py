"""Long work says how far it is: prediction over many images and IPT's tiles show a bar with an estimate, and
``--quiet`` silences it (and the INFO lines). An IPT checkpoint on a 2000x1500 photo printed nothing for 5 minutes."""
from __future__ import annotations

import pytest
import torch
from cli_runner import run_tools
from PIL import Image

from visiontf.core.progress import set_progress


@pytest.fixture
def progress_on():
    set_progress(True)
    yield
    set_progress(None)


def test_ipt_tiling_says_how_many_tiles_and_finishes_them(progress_on, capsys):
    from visiontf.models.ipt.tiling import chop_geometry, forward_chop

    x = torch.rand(1, 3, 96, 80)
    g = chop_geometry(96, 80, 48)
    out = forward_chop(lambda t: t, x, tile=48, scale=1, crop_batch_size=5)
    err = capsys.readouterr().err
    tiles = int(err.split(" tiles of 48x48")[0].rsplit("\r", 1)[-1].split()[-1])
    # the grid's tiles and the border strips', each once: counted, then all done
    assert g["rows"] * g["cols"] <= tiles <= (g["rows"] + 1) * (g["cols"] + 1) and f"{tiles}/{tiles}" in err, err[-500:]
    torch.testing.assert_close(out, x)  # the identity tiled and blended is the identity: nothing was lost


def test_predict_shows_a_bar_over_the_images_and_quiet_silences_it(tmp_path):
    from visiontf.io.weights import save_model
    from visiontf.models import create_model

    arch = dict(hidden_dim=32, nheads=2, enc_layers=1, dec_layers=1, dim_feedforward=32, num_queries=5)
    model = create_model("detr_tiny", num_classes=3, arch=arch)
    weights = save_model(model, tmp_path / "m.safetensors", "detr_tiny", num_classes=3, arch=arch)
    images = tmp_path / "images"
    images.mkdir()
    for i in range(3):
        Image.new("RGB", (40 + 8 * i, 32), (30 * i, 90, 120)).save(images / f"{i}.png")
    common = ["tools/predict.py", "--weights", weights, "--input", images, "--score_threshold", "0.0"]
    loud, quiet = run_tools([{"argv": [*common, "--output", tmp_path / "loud"]},
                             {"argv": [*common, "--output", tmp_path / "quiet", "--quiet"]}], tmp_path)
    assert loud["code"] == 0 and quiet["code"] == 0, (loud["stderr"][-2000:], quiet["stderr"][-2000:])
    assert "predict: 100%" in loud["stderr"] and "3/3" in loud["stderr"] and "INFO" in loud["stderr"]
    assert "it/s]" not in quiet["stderr"] and "image/s]" not in quiet["stderr"] and "INFO" not in quiet["stderr"], \
        quiet["stderr"][-2000:]
    assert (tmp_path / "quiet" / "predictions.json").is_file()  # quiet, not idle
