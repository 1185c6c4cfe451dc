"""DETR's mask post-processing gives the original's results: ``PostProcessSegm``'s instance masks and
``PostProcessPanoptic``'s PNG bytes and segments, equal to what facebookresearch/detr computed on the same model
outputs (``tests/fixtures/detr/postprocess.safetensors``, written by ``scripts/fixtures/make_detr.py``): a padded
batch, stuff queries merged into one segment, a segment dropped as too small, an image without confident queries;
the outputs in float32 and in float64."""
from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image
from reference.fixtures import load_fixture

from visiontf.io.panoptic_ids import id2rgb, rgb2id
from visiontf.set_prediction import PostProcess
from visiontf.set_prediction.mask_postprocess import PostProcessPanoptic, PostProcessSegm, add_instance_masks

DTYPES = {"float32": torch.float32, "float64": torch.float64}


def _part(fixture, name: str, dtype: str) -> dict[str, torch.Tensor]:
    """The inputs under ``name.`` (model outputs cast to ``dtype``), without the prefix."""
    out = {}
    for key, value in fixture.inputs.items():
        if key.startswith(name + "."):
            out[key[len(name) + 1:]] = value.to(DTYPES[dtype]) if value.is_floating_point() else value
    return out


def _segments(info: list[dict]) -> list[list[int]]:
    return [[s["id"], int(s["isthing"]), s["category_id"], s["area"]] for s in info]


@pytest.mark.parametrize("dtype", DTYPES)
def test_instance_masks_equal_the_original(dtype):
    fixture = load_fixture("detr", "postprocess")
    x = _part(fixture, "segm", dtype)
    outputs = {"pred_masks": x["pred_masks"]}
    got = PostProcessSegm()([{}, {}], outputs, x["orig_sizes"], x["processed_sizes"])
    for i, g in enumerate(got):
        want = fixture.outputs[dtype][f"segm.masks.{i}"]
        assert g["masks"].dtype == torch.uint8 and g["masks"].shape == want.shape
        assert torch.equal(g["masks"], want)
    first = fixture.outputs[dtype]["segm.masks.0"].float().mean()
    assert 0.2 < first < 0.8  # neither empty nor full


def test_masks_follow_the_detections_they_belong_to():
    """Sorted, thresholded detections (the Predictor's) get the original's masks of their own queries."""
    fixture = load_fixture("detr", "postprocess")
    x = _part(fixture, "segm", "float32")
    outputs = {k: x[k] for k in ("pred_logits", "pred_boxes", "pred_masks")}
    preds = add_instance_masks(PostProcess()(outputs, x["orig_sizes"], score_threshold=0.2), outputs, x["processed_sizes"],
                               x["orig_sizes"])
    for i, p in enumerate(preds):
        assert len(p["queries"]) and not torch.equal(p["queries"], torch.arange(len(p["queries"])))
        assert p["masks"].dtype == torch.bool
        assert torch.equal(p["masks"], fixture.outputs["float32"][f"segm.masks.{i}"][p["queries"], 0].bool())


def _decode(png: bytes) -> np.ndarray:
    return rgb2id(np.asarray(Image.open(io.BytesIO(png))))


def _panoptic(fixture, name: str, dtype: str, with_targets: bool = True) -> list[dict]:
    x = _part(fixture, name, dtype)
    is_thing = {i: bool(v) for i, v in enumerate(x["is_thing"].tolist())}
    outputs = {k: x[k] for k in ("pred_logits", "pred_boxes", "pred_masks")}
    sizes = [tuple(s) for s in x["processed_sizes"].tolist()]
    targets = [tuple(s) for s in x["target_sizes"].tolist()] if with_targets else None
    return PostProcessPanoptic(is_thing, threshold=fixture.meta["threshold"])(outputs, sizes, targets)


@pytest.mark.parametrize("dtype", DTYPES)
def test_panoptic_equals_the_original(dtype):
    fixture = load_fixture("detr", "postprocess")
    got = _panoptic(fixture, "panoptic", dtype)
    want = fixture.outputs[dtype]
    for i, g in enumerate(got):
        assert _segments(g["segments_info"]) == want[f"panoptic.segments.{i}"].tolist()
        assert g["png_string"] == bytes(want[f"panoptic.png.{i}"].tolist())
    # what the case holds: the three queries of stuff class 7 are one segment, the 1-pixel segment was dropped
    ids = _decode(got[0]["png_string"])
    assert ids.shape == tuple(fixture.inputs["panoptic.target_sizes"][0].tolist())
    infos = got[0]["segments_info"]
    assert sorted(s["category_id"] for s in infos if not s["isthing"]) == [7, 8]
    assert sum(s["area"] for s in infos) == ids.size and {s["id"] for s in infos} == set(np.unique(ids).tolist())
    assert 5 not in {s["category_id"] for s in got[1]["segments_info"]}


@pytest.mark.parametrize("dtype", DTYPES)
def test_panoptic_without_confident_queries(dtype):
    fixture = load_fixture("detr", "postprocess")
    got = _panoptic(fixture, "empty", dtype, with_targets=False)
    for i, g in enumerate(got):
        assert g["segments_info"] == [] and fixture.outputs[dtype][f"empty.segments.{i}"].numel() == 0
        assert g["png_string"] == bytes(fixture.outputs[dtype][f"empty.png.{i}"].tolist())


def test_panoptic_colours_round_trip():
    ids = np.array([[0, 1, 255], [256, 65535, 70000]])
    assert np.array_equal(rgb2id(id2rgb(ids)), ids)
    # COCO panoptic's encoding: id = R + 256 G + 256^2 B
    assert id2rgb(ids)[1, 2].tolist() == [70000 % 256, 70000 // 256 % 256, 70000 // 65536]
    assert id2rgb(ids)[1, 0].tolist() == [0, 1, 0] and id2rgb(ids)[0, 2].tolist() == [255, 0, 0]
