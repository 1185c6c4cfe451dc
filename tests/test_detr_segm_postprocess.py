"""DETR's mask post-processing equals the original's (``benchmarks/reference_detr_segm.py``, checked
against facebookresearch/detr by ``benchmarks/detr_segm_parity.py``) on the same inputs."""
from __future__ import annotations

import io
import sys
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from visiontf.detection import PostProcess
from visiontf.detection.mask_postprocess import PostProcessPanoptic, PostProcessSegm, add_instance_masks
from visiontf.io.panoptic_ids import id2rgb, rgb2id

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import reference_detr_segm as R  # noqa: E402


def _outputs(B=2, Q=12, K=7, h=20, w=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"pred_logits": torch.randn(B, Q, K + 1, generator=g), "pred_boxes": torch.rand(B, Q, 4, generator=g),
            "pred_masks": 3 * torch.randn(B, Q, h, w, generator=g)}


def test_instance_masks_equal_the_original():
    out = _outputs()
    orig_sizes = torch.tensor([[157, 203], [90, 70]])
    processed = torch.tensor([[80, 96], [64, 50]])  # the second image was padded in the batch
    want = R.reference_postprocess_segm([{}, {}], out, orig_sizes, processed)
    got = PostProcessSegm()([{}, {}], out, orig_sizes, processed)
    for w, g in zip(want, got):
        assert g["masks"].shape == w["masks"].shape and g["masks"].dtype == torch.uint8
        assert torch.equal(g["masks"], w["masks"])
    assert 0.2 < want[0]["masks"].float().mean() < 0.8


def test_masks_follow_the_detections_they_belong_to():
    """Sorted, thresholded detections (the Predictor's) get the masks of their own queries."""
    out = _outputs()
    orig_sizes, processed = torch.tensor([[120, 100], [60, 61]]), torch.tensor([[80, 96], [80, 96]])
    all_masks = R.reference_postprocess_segm([{}, {}], out, orig_sizes, processed)
    preds = add_instance_masks(PostProcess()(out, orig_sizes, score_threshold=0.2), out, processed, orig_sizes)
    for p, ref in zip(preds, all_masks):
        assert len(p["queries"]) and not torch.equal(p["queries"], torch.arange(len(p["queries"])))
        assert p["masks"].dtype == torch.bool
        assert torch.equal(p["masks"], ref["masks"][p["queries"], 0].bool())


def _panoptic_outputs():
    out = _outputs(Q=14, K=9, h=16, w=20, seed=1)
    logits = out["pred_logits"]
    logits[:, :6, 2] += 12.0       # confident things
    logits[:, 6:9, 7] += 30.0      # three queries of one stuff class: merged
    logits[0, 9, 8] += 30.0        # a stuff class alone
    logits[1, 10, 5] += 30.0       # a confident query whose mask wins almost nowhere: dropped as small
    out["pred_masks"][1, 10] = -20.0
    out["pred_masks"][1, 10, 3, 4] = 20.0
    return out


def _decode(png: bytes) -> np.ndarray:
    return rgb2id(np.asarray(Image.open(io.BytesIO(png))))


def test_panoptic_equals_the_original():
    out = _panoptic_outputs()
    is_thing = {i: i <= 5 for i in range(10)}
    sizes, targets = [(64, 80), (64, 80)], [(130, 170), (40, 50)]
    want = R.reference_postprocess_panoptic(out, sizes, targets, is_thing, threshold=0.85)
    got = PostProcessPanoptic(is_thing, threshold=0.85)(out, sizes, targets)
    for w, g in zip(want, got):
        assert g["segments_info"] == w["segments_info"]
        assert g["png_string"] == w["png_string"]
    ids = _decode(got[0]["png_string"])
    assert ids.shape == (130, 170)
    infos = got[0]["segments_info"]
    stuff = [s for s in infos if not s["isthing"]]
    assert sorted(s["category_id"] for s in stuff) == [7, 8]  # the three class-7 queries are one segment
    assert sum(s["area"] for s in infos) == ids.size and {s["id"] for s in infos} == set(np.unique(ids).tolist())
    assert 5 not in {s["category_id"] for s in got[1]["segments_info"]}  # the 1-pixel segment was dropped


def test_panoptic_without_confident_queries():
    out = _outputs(Q=5, K=3)
    out["pred_logits"][..., -1] += 50.0  # every query "no object"
    want = R.reference_postprocess_panoptic(out, [(32, 40)] * 2, None, {i: True for i in range(4)})
    got = PostProcessPanoptic({i: True for i in range(4)})(out, [(32, 40)] * 2)
    assert got[0]["segments_info"] == [] == want[0]["segments_info"]
    assert got[0]["png_string"] == want[0]["png_string"]


def test_panoptic_colours_round_trip():
    ids = np.array([[0, 1, 255], [256, 65535, 70000]])
    assert np.array_equal(rgb2id(id2rgb(ids)), ids)
    assert np.array_equal(id2rgb(ids), R.id2rgb(ids))
