"""The targets a detector trains on (``visiontf.models.contract.check_detection_targets``): one dict per image of
normalised (cx, cy, w, h) boxes in [0, 1]. Boxes in pixels or of negative size trained on losses a thousand times too
large without a word; a NaN box was blamed on the model (the denoising queries built from it spread the NaN to the
other queries); one dict fewer than images was a size mismatch deep in the decoder."""
from __future__ import annotations

import math

import pytest
import torch

import visiontf
from visiontf.set_prediction.criterion import SetCriterion

MODELS = {
    "rtdetr_tiny": dict(num_classes=3, decoder={"num_queries": 20}, num_select=20, denoising={"num_denoising": 6}),
    "dfine_tiny": dict(num_classes=3, decoder={"num_queries": 20}, num_select=20, denoising={"num_denoising": 6}),
    "dino_tiny": dict(num_classes=3, backbone=dict(pretrained=False), arch=dict(num_queries=20, enc_layers=1, dec_layers=2)),
}
GOOD = [{"labels": torch.tensor([0, 2]), "boxes": torch.tensor([[0.3, 0.4, 0.2, 0.3], [0.7, 0.6, 0.3, 0.2]])},
        {"labels": torch.tensor([], dtype=torch.int64), "boxes": torch.zeros(0, 4)}]


def _with(box: list[float]) -> list[dict]:
    return [{"labels": torch.tensor([1]), "boxes": torch.tensor([box])}, GOOD[1]]


BAD = {
    "NaN": (_with([0.5, math.nan, 0.2, 0.2]), r"target 0's boxes are not normalised .* \(values not finite\)"),
    "pixels": (_with([40.0, 30.0, 20.0, 10.0]), r"target 0's boxes are not normalised .* from 10 to 40\); divide pixel boxes"),
    "negative width": (_with([0.5, 0.5, -0.1, 0.2]), r"target 0's boxes are not normalised .* w, h >= 0"),
    "one dict fewer": (GOOD[:1], r"1 target dict\(s\) for a batch of 2 images; give one per image"),
    "the second image's": ([GOOD[0], {"labels": torch.tensor([0]), "boxes": torch.tensor([[2.0, 2.0, 1.0, 1.0]])}],
                           r"target 1's boxes are not normalised .* from 1 to 2\)"),
}


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("case", BAD)
def test_a_detectors_training_forward_refuses_targets_it_cannot_train_on(name, case):
    torch.manual_seed(0)
    model = visiontf.create_model(name, **MODELS[name]).train()
    images = torch.rand(2, 3, 96, 128)
    targets, words = BAD[case]
    with pytest.raises(ValueError, match=words):
        model(images, targets=targets)
    out = model(images, targets=GOOD)  # the same model on sound targets, an image without objects among them
    assert torch.isfinite(out["pred_boxes"]).all()


@pytest.mark.parametrize("case", BAD)
def test_the_criterion_refuses_them_too_for_detectors_without_denoising(case):
    outputs = {"pred_logits": torch.randn(2, 5, 4), "pred_boxes": torch.rand(2, 5, 4) * 0.5 + 0.25}
    targets, words = BAD[case]
    with pytest.raises(ValueError, match=rf"SetCriterion: {words}"):
        SetCriterion(3)(outputs, targets)
    assert all(torch.isfinite(v) for v in SetCriterion(3)(outputs, GOOD).values())
