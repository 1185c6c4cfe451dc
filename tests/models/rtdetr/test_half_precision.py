"""RT-DETR and D-FINE cast to bf16 or fp16 (``model.to(dtype)``, no autocast), as users run inference in half
precision: the originals' float32 tables (the AIFI position embedding, the anchors) promoted the tokens to float32
before the model's half-precision layers, and every forward failed. Under autocast the tables stay float32."""
from __future__ import annotations

import pytest
import torch

from visiontf.models import create_model
from visiontf.models.rtdetr.hybrid_encoder import original_table_dtype

SMALL = dict(num_classes=3, decoder={"num_queries": 20}, num_select=20, denoising={"num_denoising": 6})


@pytest.mark.parametrize("name", ["rtdetr_tiny", "dfine_tiny"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_model_cast_to_half_precision_detects_and_trains_in_it(name, dtype):
    torch.manual_seed(0)
    model = create_model(name, **SMALL)
    images = torch.rand(2, 3, 96, 128)
    with torch.no_grad():
        reference = model.eval().encoder(model.backbone.forward_maps(images))
        model.to(dtype)
        maps = model.encoder(model.backbone.forward_maps(images.to(dtype)))
        half = model(images.to(dtype))
    assert half["pred_logits"].dtype == dtype and half["pred_boxes"].dtype == dtype
    assert torch.isfinite(half["pred_boxes"]).all()
    # the encoder's maps (through the AIFI layer and its position table) are the float32 ones in coarser numbers; the
    # decoder's top-k selection is not compared, its ranking of random-weight scores moving with any rounding
    for ours, theirs in zip(maps, reference):
        assert (ours.float() - theirs).abs().max() <= 0.05 * theirs.abs().max()
    targets = [{"labels": torch.tensor([0, 2]), "boxes": torch.tensor([[0.3, 0.4, 0.2, 0.3], [0.7, 0.6, 0.3, 0.2]], dtype=dtype)},
               {"labels": torch.tensor([1]), "boxes": torch.tensor([[0.5, 0.5, 0.4, 0.4]], dtype=dtype)}]
    out = model.train()(images.to(dtype), targets=targets)
    assert all(torch.isfinite(v).all() for v in out.values() if isinstance(v, torch.Tensor) and v.is_floating_point())


def test_the_tables_stay_float32_under_autocast_and_for_float64():
    assert original_table_dtype(torch.bfloat16, torch.device("cpu")) == torch.bfloat16
    assert original_table_dtype(torch.float64, torch.device("cpu")) == torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert original_table_dtype(torch.bfloat16, torch.device("cpu")) == torch.float32
