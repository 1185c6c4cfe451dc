"""The DETR attention figure stays a sensible size for any aspect ratio, maps overlaid on the image (before,
a 37x901 image gave a 600x22096 px figure, and the decoder map was a raw 6x4 grid)."""
import numpy as np
import pytest
import torch
from PIL import Image

import visiontf
from visiontf.inference.predictor import Predictor
from visiontf.tasks.attention_pictures import MAX_FIGURE_SIDE_PX, _panel_grid, detr_attention_maps, save_detr_attention_figure


@pytest.fixture(scope="module")
def predictor():
    torch.manual_seed(0)
    detr = visiontf.create_model("detr_tiny", num_classes=3, arch={"enc_layers": 1, "dec_layers": 1, "num_queries": 10}).eval()
    return Predictor(detr, preprocess={"min_size": 64, "max_size": 400}, device="cpu")


def test_panels_of_thin_images_go_side_by_side_and_of_flat_ones_in_a_column():
    assert _panel_grid(6, 37 / 901) == (1, 6)
    assert _panel_grid(6, 901 / 37) == (6, 1)
    rows, cols = _panel_grid(6, 4 / 3)
    assert rows * cols >= 6 and 1 <= cols / rows <= 3


@pytest.mark.parametrize("h, w", [(901, 37), (37, 901), (120, 160)])
def test_figure_is_capped_and_overlays_the_maps(predictor, tmp_path, h, w):
    image = torch.rand(3, h, w)
    maps = detr_attention_maps(predictor, image, score_threshold=0.0, max_queries=4)
    del maps["dec_attn_grid"], maps["enc_attn_grid"]  # the figure draws the maps at image resolution
    pic = np.asarray(Image.open(save_detr_attention_figure(maps, tmp_path / "attention.png")))
    assert max(pic.shape[:2]) <= MAX_FIGURE_SIDE_PX
    assert min(pic.shape[:2]) >= 250  # and not shrunk to nothing
    assert pic[..., :3].std() > 20


@pytest.mark.parametrize("threshold", [0.05, None])
def test_predict_attention_pictures_take_the_score_threshold(predictor, tmp_path, monkeypatch, threshold):
    """tools/predict.py --attention --score_threshold T: the picture shows detections above T (before, DETR's
    picture used 0.7 and Deformable DETR's 0.5 whatever was given); None (keep all) shows the best ones."""
    from visiontf.inference.predict_files import predict_to_folder
    from visiontf.tasks import attention_pictures as attention

    seen = []
    choose = attention.choose_queries
    monkeypatch.setattr(attention, "choose_queries", lambda scores, t, *a, **k: seen.append(t) or choose(scores, t, *a, **k))
    predict_to_folder(predictor, [torch.rand(3, 60, 80)], tmp_path, score_threshold=threshold, attention=True)
    assert seen == [0.0 if threshold is None else threshold]
    assert (tmp_path / "image_00000_attention.png").is_file()
