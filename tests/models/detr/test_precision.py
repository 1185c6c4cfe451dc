"""bf16 autocast and torch.compile paths of DETR training.

Under ``torch.autocast(bfloat16)`` the model may run in bf16 but the Hungarian costs and the set
loss must be float32 (bf16 rounds probabilities and boxes too coarsely for matching and L1/GIoU).
``compile=True`` compiles only ``task.model``; the criterion and matcher (scipy on the CPU) stay
eager. A compiled step itself is timed in ``benchmarks/detr.py --compile`` (minutes on CPU).
"""
from __future__ import annotations

import torch

from visiontf.models import create_model
from visiontf.set_prediction import HungarianMatcher, SetCriterion
from visiontf.tasks.detection.detection_task import DetectionTask

TINY = dict(arch=dict(hidden_dim=32, nheads=2, enc_layers=1, dec_layers=2, dim_feedforward=64, num_queries=8))
NUM_CLASSES = 4


def _batch(B: int = 2, H: int = 64, W: int = 96):
    g = torch.Generator().manual_seed(0)
    images = torch.randn(B, 3, H, W, generator=g)
    mask = torch.zeros(B, H, W, dtype=torch.bool)
    mask[1, :, 80:] = True
    targets = [
        {"labels": torch.tensor([0, 3]), "boxes": torch.tensor([[0.3, 0.4, 0.2, 0.3], [0.7, 0.6, 0.3, 0.2]])},
        {"labels": torch.tensor([1]), "boxes": torch.tensor([[0.5, 0.5, 0.4, 0.4]])},
    ]
    return images, mask, targets


def test_bf16_autocast_forward_matcher_and_loss_in_float32():
    model = create_model("detr_tiny", num_classes=NUM_CLASSES, **TINY).train()
    matcher = HungarianMatcher()
    criterion = SetCriterion(NUM_CLASSES, matcher)
    images, mask, targets = _batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(images, mask)
        cost, _, _ = matcher.cost_blocks(out, targets)
        losses = criterion(out, targets)
    # the transformer really ran in bf16 ...
    assert out["pred_logits"].dtype == torch.bfloat16
    assert out["pred_boxes"].dtype == torch.float32
    # ... while matching and every loss term are float32 and finite
    assert cost.dtype == torch.float32
    assert len(out["aux_outputs"]) == TINY["arch"]["dec_layers"] - 1
    for key, value in losses.items():
        assert value.dtype == torch.float32, key
        assert torch.isfinite(value), key
    assert {"loss_ce", "loss_bbox", "loss_giou", "loss_ce_0"} <= set(losses)
    losses["loss"].backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


def test_bf16_matches_equal_float32_matches_on_float32_outputs():
    """The matcher's float32 maths ignores autocast: same assignment inside and outside it."""
    g = torch.Generator().manual_seed(1)
    outputs = {"pred_logits": torch.randn(2, 8, NUM_CLASSES + 1, generator=g),
               "pred_boxes": torch.rand(2, 8, 4, generator=g) * 0.5 + 0.1}
    _, _, targets = _batch()
    matcher = HungarianMatcher()
    ref = matcher(outputs, targets)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = matcher(outputs, targets)
    for (qa, ta), (qb, tb) in zip(ref, got):
        assert torch.equal(qa, qb) and torch.equal(ta, tb)


def test_compile_option_compiles_only_the_model():
    task = DetectionTask(model_name="detr_tiny", num_classes=NUM_CLASSES, model_kwargs=TINY, compile=True)
    keys_before = set(task.model.state_dict())
    assert task.model._compiled_call_impl is None
    task.configure_model()
    assert task.model._compiled_call_impl is not None
    # the matcher (scipy) and the loss stay eager
    assert task.criterion._compiled_call_impl is None
    assert task.criterion.matcher._compiled_call_impl is None
    assert isinstance(task.criterion.matcher, HungarianMatcher)
    # checkpoints keep their keys (no "_orig_mod." prefix)
    assert set(task.model.state_dict()) == keys_before
    task.configure_model()  # idempotent: Lightning may call it again
    assert task.model._compiled_call_impl is not None


def test_compile_off_by_default():
    task = DetectionTask(model_name="detr_tiny", num_classes=NUM_CLASSES, model_kwargs=TINY)
    task.configure_model()
    assert task.model._compiled_call_impl is None
