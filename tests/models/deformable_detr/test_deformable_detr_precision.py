"""bf16 autocast on Deformable DETR: the network runs in bf16, the sampling locations, the matching
and every loss term stay float32.

bf16 keeps 8 significant bits: a pixel coordinate near 100 would be rounded to a multiple of 0.5,
moving bilinear samples by up to a quarter pixel, and the set loss would round probabilities and
boxes as DETR's tests (``tests/models/detr/test_precision.py``) explain.
"""
from __future__ import annotations

import pytest
import torch

from visiontf.models import create_model
from visiontf.nn.ms_deform_attn import MSDeformAttn
from visiontf.tasks.detection.detection_task import DetectionTask

ARCH = {"hidden_dim": 64, "nheads": 2, "enc_layers": 1, "dec_layers": 2, "dim_feedforward": 64, "num_queries": 12}
TINY = {"arch": ARCH}


def _batch():
    g = torch.Generator().manual_seed(0)
    images = torch.randn(2, 3, 96, 128, generator=g)
    mask = torch.zeros(2, 96, 128, dtype=torch.bool)
    mask[1, :, 100:] = True
    targets = [
        {"labels": torch.tensor([0, 2]), "boxes": torch.tensor([[0.3, 0.4, 0.2, 0.3], [0.7, 0.6, 0.3, 0.2]])},
        {"labels": torch.tensor([1]), "boxes": torch.tensor([[0.5, 0.5, 0.4, 0.4]])},
    ]
    return images, mask, targets


@pytest.mark.parametrize("method", ["gather", "grid_sample"])
def test_bf16_autocast_keeps_sampling_locations_and_losses_float32(method, monkeypatch):
    task = DetectionTask("deformable_detr_tiny", num_classes=3, model_kwargs={"arch": {**ARCH, "two_stage": True}, "attn_method": method})
    model = task.model.train()
    with torch.no_grad():  # trained-looking offsets: the zero-initialised offset matrix would hide rounding
        for m in model.modules():
            if isinstance(m, MSDeformAttn):
                m.sampling_offsets.weight.normal_(0, 0.05)
    locations = []
    for name in ("_pixel_sampling", "sampling"):  # the gather core's pixel coordinates, grid_sample's locations
        original = getattr(MSDeformAttn, name)

        def spy(self, *args, _original=original, **kwargs):
            out = _original(self, *args, **kwargs)
            locations.append(out)
            return out

        monkeypatch.setattr(MSDeformAttn, name, spy)
    grids = []  # what the grid_sample core hands to F.grid_sample
    grid_sample = torch.nn.functional.grid_sample

    def grid_spy(input, grid, *args, **kwargs):
        grids.append(grid)
        return grid_sample(input, grid, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "grid_sample", grid_spy)
    images, mask, targets = _batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(images, mask)
        losses = task.criterion(out, targets)
    # the transformer really ran in bf16 ...
    assert out["pred_logits"].dtype == torch.bfloat16
    assert out["pred_boxes"].dtype == torch.float32 and out["enc_outputs"]["pred_boxes"].dtype == torch.float32
    # ... while every attention's locations and weights are float32, with float32's precision
    assert len(locations) == ARCH["enc_layers"] + ARCH["dec_layers"]
    for loc, weights in locations:
        assert loc.dtype == torch.float32 and weights.dtype == torch.float32
        assert (loc.to(torch.bfloat16).float() != loc).any(), "locations rounded to bf16"
    assert len(grids) == (3 * len(locations) if method == "grid_sample" else 0)  # one per level
    for grid in grids:
        assert grid.dtype == torch.float32 and (grid.to(torch.bfloat16).float() != grid).any(), "grid rounded to bf16"
    assert {"loss_ce", "loss_bbox", "loss_giou", "loss_ce_0", "loss_ce_enc", "loss_bbox_enc"} <= set(losses)
    for key, value in losses.items():
        assert value.dtype == torch.float32 and torch.isfinite(value), key
    losses["loss"].backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters() if p.requires_grad)


def test_bf16_attention_picture_outputs_are_float32():
    model = create_model("deformable_detr_tiny", num_classes=3, **TINY).eval()
    images, mask, _ = _batch()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(images, mask, need_weights=True)
    for key in ("dec_sampling_locations", "dec_attention_weights", "dec_reference_points"):
        assert out[key].dtype == torch.float32, key
    torch.testing.assert_close(out["dec_attention_weights"].sum((-1, -2)), torch.ones(2, ARCH["num_queries"], ARCH["nheads"]))
