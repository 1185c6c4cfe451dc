"""DETR's mask losses equal the original's ``loss_masks`` (recorded from facebookresearch/detr in
``tests/fixtures/detr/loss_masks.safetensors`` by ``scripts/fixtures/make_detr.py``), join the set criterion for
models with a mask head, and train: the head alone on a frozen detector, and end to end."""
from __future__ import annotations

import pytest
import torch
from handmade_data import shapes_batch as _shapes_batch
from reference.fixtures import load_fixture

from visiontf.models import create_model
from visiontf.set_prediction import build_criterion
from visiontf.set_prediction.mask_losses import loss_masks


def _random_case(seed=0):
    g = torch.Generator().manual_seed(seed)
    outputs = {"pred_masks": torch.randn(3, 8, 20, 24, generator=g)}
    # images of different sizes (masks padded to the largest), one without objects
    targets = [{"masks": (torch.rand(3, 70, 96, generator=g) > 0.6).to(torch.uint8)},
               {"masks": torch.zeros(0, 80, 60, dtype=torch.uint8)},
               {"masks": (torch.rand(2, 64, 90, generator=g) > 0.3)}]
    indices = [(torch.tensor([5, 0, 2]), torch.tensor([2, 0, 1])), (torch.tensor([], dtype=torch.int64),) * 2,
               (torch.tensor([7, 1]), torch.tensor([1, 0]))]
    return outputs, targets, indices


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_loss_masks_equals_the_original(dtype):
    """Predictions and targets of different sizes (padded to the largest), an image without objects. visiontf computes
    the mask losses in float32 whatever the predictions' dtype (``loss_masks``), so float64 is held to float32's
    tolerance unless they come out in float64."""
    fixture = load_fixture("detr", "loss_masks")
    x = fixture.inputs
    n = len([k for k in x if k.startswith("masks.")])
    targets = [{"masks": x[f"masks.{i}"]} for i in range(n)]
    indices = [(x[f"src.{i}"], x[f"tgt.{i}"]) for i in range(n)]
    got = loss_masks({"pred_masks": x["pred_masks"].to(dtype)}, targets, indices, float(x["num_boxes"]))
    want = fixture.outputs[str(dtype).removeprefix("torch.")]
    for key in ("loss_mask", "loss_dice"):
        tol = 1e-12 if got[key].dtype == torch.float64 else 1e-6
        assert (got[key].double() - want[key].double()).abs().item() < tol, key
        assert got[key] > 0
    # bool targets are the same masks
    bool_targets = [{"masks": t["masks"].bool()} for t in targets]
    assert torch.equal(loss_masks({"pred_masks": x["pred_masks"].to(dtype)}, bool_targets, indices, float(x["num_boxes"]))["loss_dice"],
                       got["loss_dice"])


def test_loss_masks_without_any_target_is_zero_and_differentiable():
    pred = torch.randn(2, 4, 8, 8, requires_grad=True)
    targets = [{"masks": torch.zeros(0, 32, 32)}, {"masks": torch.zeros(0, 30, 31)}]
    empty = [(torch.tensor([], dtype=torch.int64),) * 2] * 2
    got = loss_masks({"pred_masks": pred}, targets, empty, 1.0)
    assert got["loss_mask"] == 0 and got["loss_dice"] == 0
    (got["loss_mask"] + got["loss_dice"]).backward()
    assert pred.grad is not None


def test_targets_without_masks_are_refused():
    outputs, targets, indices = _random_case()
    with pytest.raises(ValueError, match="no 'masks'.*masks=True"):
        loss_masks(outputs, [{"labels": torch.zeros(3)}] * 3, indices, 1.0)


def test_criterion_of_a_mask_model_adds_the_final_layers_mask_terms():
    model = create_model("detr_tiny_masks", num_classes=2).eval()
    criterion = build_criterion(model, 2)
    assert "masks" in criterion.losses and criterion.weight_dict["loss_mask"] == 1 and criterion.weight_dict["loss_dice"] == 1
    images, targets = _shapes_batch()
    terms = criterion(model(images), targets)
    assert {"loss_mask", "loss_dice"} <= set(terms) and "loss_mask_0" not in terms
    detector_terms = build_criterion(create_model("detr_tiny", num_classes=2), 2).losses
    assert "masks" not in detector_terms


def _train(model, params, steps, lr, key_terms):
    criterion = build_criterion(model, 2)
    images, targets = _shapes_batch()
    opt = torch.optim.AdamW(params, lr=lr)
    history = []
    model.train()
    for _ in range(steps):
        terms = criterion(model(images), targets)
        history.append(sum(float(terms[k].detach()) for k in key_terms))
        opt.zero_grad()
        terms["loss"].backward()
        opt.step()
    return history


@pytest.mark.slow
def test_head_trains_on_a_frozen_detector_and_end_to_end():
    torch.manual_seed(0)
    frozen = create_model("detr_tiny_masks", num_classes=2, freeze_detector=True, arch={"dropout": 0.0}, backbone={"frozen_bn": False})
    before = {k: v.clone() for k, v in frozen.state_dict().items() if not k.startswith(("mask_head", "bbox_attention"))}
    history = _train(frozen, [p for p in frozen.parameters() if p.requires_grad], 15, 2e-3, ("loss_mask", "loss_dice"))
    assert min(history[-3:]) < 0.75 * history[0], history
    after = frozen.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # the detector did not move (BatchNorm included)

    torch.manual_seed(0)
    model = create_model("detr_tiny_masks", num_classes=2, arch={"dropout": 0.0}, backbone={"frozen_bn": False})
    history = _train(model, model.parameters(), 15, 5e-4, ("loss_ce", "loss_bbox", "loss_giou", "loss_mask", "loss_dice"))
    assert min(history[-3:]) < 0.6 * history[0], history
