"""SetCriterion: hand-computed loss values, aux suffixes, empty targets, dtype, num_boxes under DDP."""
import math

import pytest
import torch

from visiontf.set_prediction import HungarianMatcher, SetCriterion
from visiontf.set_prediction import criterion as criterion_module


def tiny_case():
    """1 image, 3 queries, 2 classes (+ no object), 2 targets; q0->t0 and q1->t1 obviously."""
    logits = torch.tensor([[[2.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.5, 0.2]]])
    boxes = torch.tensor([[[0.5, 0.5, 0.2, 0.2], [0.3, 0.3, 0.2, 0.4], [0.8, 0.8, 0.1, 0.1]]])
    targets = [
        {
            "labels": torch.tensor([0, 1]),
            "boxes": torch.tensor([[0.5, 0.5, 0.2, 0.2], [0.3, 0.35, 0.2, 0.3]]),
        }
    ]
    return {"pred_logits": logits, "pred_boxes": boxes}, targets


def nll(logits, k):
    return math.log(sum(math.exp(v) for v in logits)) - logits[k]


# Hand values for tiny_case: classes per query [0, 1, no-object=2], weights [1, 1, 0.1].
CE = (nll([2, 0, 0], 0) + nll([0, 1, 0], 1) + 0.1 * nll([0, 0.5, 0.2], 2)) / 2.1
# q0 == t0 exactly; q1 vs t1 differ by 0.05 in cy and 0.1 in h.
L1 = (0.0 + 0.05 + 0.1) / 2
# q1 xyxy (0.2, 0.1, 0.4, 0.5), t1 xyxy (0.2, 0.2, 0.4, 0.5): inter 0.06, union 0.08, the
# enclosing box is q1 itself, so GIoU = IoU = 0.75.
GIOU = ((1 - 1.0) + (1 - 0.75)) / 2
# argmax is an object for all 3 queries, 2 targets.
CARD = 1.0


def test_hand_computed_values():
    outputs, targets = tiny_case()
    crit = SetCriterion(num_classes=2, matcher=HungarianMatcher())
    out = crit(outputs, targets)
    assert out["loss_ce"].item() == pytest.approx(CE, abs=1e-6)
    assert out["loss_bbox"].item() == pytest.approx(L1, abs=1e-6)
    assert out["loss_giou"].item() == pytest.approx(GIOU, abs=1e-6)
    assert out["cardinality_error"].item() == pytest.approx(CARD)
    assert out["class_error"].item() == pytest.approx(0.0)
    assert out["loss"].item() == pytest.approx(1 * CE + 5 * L1 + 2 * GIOU, abs=1e-5)
    for value in out.values():
        assert value.dtype == torch.float32


def test_class_error_counts_wrong_matched_labels():
    outputs, targets = tiny_case()
    targets[0]["labels"] = torch.tensor([1, 1])  # q0's argmax is 0: one of two matched is wrong
    out = SetCriterion(2)(outputs, targets)
    assert out["class_error"].item() == pytest.approx(50.0)


def test_aux_outputs_get_suffixes_and_their_own_matching():
    outputs, targets = tiny_case()
    perm = torch.tensor([2, 0, 1])  # aux layer 1 has the same predictions in another query order
    outputs["aux_outputs"] = [
        {"pred_logits": outputs["pred_logits"].clone(), "pred_boxes": outputs["pred_boxes"].clone()},
        {"pred_logits": outputs["pred_logits"][:, perm], "pred_boxes": outputs["pred_boxes"][:, perm]},
    ]
    out = SetCriterion(2)(outputs, targets)
    for i in (0, 1):
        for key in ("loss_ce", "loss_bbox", "loss_giou", "cardinality_error"):
            assert out[f"{key}_{i}"].item() == pytest.approx(out[key].item(), abs=1e-6)
        assert f"class_error_{i}" not in out  # logged for the last layer only, as the original
    assert "loss_ce_2" not in out
    assert out["loss"].item() == pytest.approx(3 * (CE + 5 * L1 + 2 * GIOU), abs=1e-5)


def test_original_style_weight_dict_with_explicit_aux_keys():
    outputs, targets = tiny_case()
    outputs["aux_outputs"] = [{k: v.clone() for k, v in outputs.items()}]
    weights = {"loss_ce": 1.0, "loss_bbox": 5.0, "loss_giou": 2.0, "loss_ce_0": 0.0, "loss_bbox_0": 0.0}
    out = SetCriterion(2, weight_dict=weights)(outputs, targets)
    # aux: ce and bbox weighted 0 explicitly, giou falls back to the base weight 2
    assert out["loss"].item() == pytest.approx(CE + 5 * L1 + 2 * GIOU + 2 * GIOU, abs=1e-5)


def test_empty_targets_clamp_num_boxes_and_keep_gradient():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 4, generator=g, requires_grad=True)
    boxes = torch.rand(2, 5, 4, generator=g, requires_grad=True)
    targets = [{"labels": torch.zeros(0, dtype=torch.int64), "boxes": torch.zeros(0, 4)}] * 2
    crit = SetCriterion(3)
    assert crit.num_boxes(targets, torch.device("cpu")) == 1.0
    out = crit({"pred_logits": logits, "pred_boxes": boxes}, targets)
    assert all(torch.isfinite(v) for v in out.values())
    assert out["loss_bbox"].item() == 0.0 and out["loss_giou"].item() == 0.0
    # every query is "no object": CE = mean NLL of the last class (uniform weights cancel)
    expected = -torch.log_softmax(logits.detach(), -1)[..., -1].mean()
    assert out["loss_ce"].item() == pytest.approx(expected.item(), abs=1e-6)
    out["loss"].backward()
    assert logits.grad is not None and logits.grad.abs().sum() > 0
    assert boxes.grad is not None and torch.isfinite(boxes.grad).all()


def test_mixed_empty_and_degenerate_targets_are_finite():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 4, 3, generator=g, requires_grad=True)
    boxes = torch.rand(2, 4, 4, generator=g).mul(0.4).add(0.1).requires_grad_()
    targets = [
        {"labels": torch.zeros(0, dtype=torch.int64), "boxes": torch.zeros(0, 4)},
        {"labels": torch.tensor([0, 1]), "boxes": torch.tensor([[0.5, 0.5, 0.0, 0.2], [0.3, 0.3, 0.1, 0.1]])},
    ]
    out = SetCriterion(2)({"pred_logits": logits, "pred_boxes": boxes}, targets)
    assert all(torch.isfinite(v) for v in out.values())
    out["loss"].backward()
    assert torch.isfinite(boxes.grad).all() and boxes.grad.abs().sum() > 0


def test_bf16_predictions_give_float32_losses_equal_to_float32_inputs():
    outputs, targets = tiny_case()
    bf16 = {k: v.to(torch.bfloat16) for k, v in outputs.items()}
    as_f32 = {k: v.float() for k, v in bf16.items()}
    crit = SetCriterion(2)
    out_bf16, out_f32 = crit(bf16, targets), crit(as_f32, targets)
    for key, value in out_bf16.items():
        assert value.dtype == torch.float32, key
        assert value.item() == pytest.approx(out_f32[key].item(), abs=1e-6), key


def test_num_boxes_is_averaged_over_ranks(monkeypatch):
    """Under DDP the box count is all-reduced and divided by the world size, as the original."""
    outputs, targets = tiny_case()  # 2 boxes here, pretend the other rank has 6

    def fake_all_reduce(tensor):
        tensor += 6

    monkeypatch.setattr(criterion_module, "_world_size", lambda: 2)
    monkeypatch.setattr(criterion_module.dist, "all_reduce", fake_all_reduce)
    crit = SetCriterion(2)
    assert crit.num_boxes(targets, torch.device("cpu")) == 4.0
    out = crit(outputs, targets)
    assert out["loss_bbox"].item() == pytest.approx(L1 * 2 / 4, abs=1e-6)
    assert out["loss_giou"].item() == pytest.approx(GIOU * 2 / 4, abs=1e-6)


def test_clear_errors():
    outputs, targets = tiny_case()
    with pytest.raises(ValueError, match="num_classes=5.*6 entries"):
        SetCriterion(5)(outputs, targets)
    with pytest.raises(ValueError, match="unknown losses"):
        SetCriterion(2, losses=("labels", "keypoints"))  # "masks" is DETR's mask losses


def test_random_batch_matches_original_formulas():
    """Terms equal the original's formulas (full-matrix GIoU diagonal, weighted CE) on random data."""
    from torchvision.ops import box_convert, generalized_box_iou

    g = torch.Generator().manual_seed(5)
    sizes, queries, k = [3, 0, 5], 8, 4
    logits = torch.randn(3, queries, k + 1, generator=g)
    boxes = torch.rand(3, queries, 4, generator=g) * 0.4 + 0.1
    targets = [
        {"labels": torch.randint(0, k, (n,), generator=g), "boxes": torch.rand(n, 4, generator=g) * 0.4 + 0.1}
        for n in sizes
    ]
    outputs = {"pred_logits": logits, "pred_boxes": boxes}
    out = SetCriterion(k)(outputs, targets)

    indices = HungarianMatcher()(outputs, targets)
    batch_idx = torch.cat([torch.full_like(q, i) for i, (q, _) in enumerate(indices)])
    query_idx = torch.cat([q for q, _ in indices])
    classes = torch.full((3, queries), k)
    classes[batch_idx, query_idx] = torch.cat([t["labels"][j] for t, (_, j) in zip(targets, indices)])
    weight = torch.ones(k + 1)
    weight[-1] = 0.1
    ce = torch.nn.functional.cross_entropy(logits.transpose(1, 2), classes, weight)
    src = boxes[batch_idx, query_idx]
    tgt = torch.cat([t["boxes"][j] for t, (_, j) in zip(targets, indices)])
    giou = torch.diag(generalized_box_iou(box_convert(src, "cxcywh", "xyxy"), box_convert(tgt, "cxcywh", "xyxy")))
    assert out["loss_ce"].item() == pytest.approx(ce.item(), abs=1e-6)
    assert out["loss_bbox"].item() == pytest.approx((src - tgt).abs().sum().item() / 8, abs=1e-6)
    assert out["loss_giou"].item() == pytest.approx((1 - giou).sum().item() / 8, abs=1e-6)
