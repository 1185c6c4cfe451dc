"""Focal matching, focal set loss (aux and two-stage terms) and sigmoid post-processing vs the original's maths.

The original's matcher, loss and PostProcess are re-implemented in
``benchmarks/reference_deformable_detr.py``. Cost: under 2 s.
"""
from __future__ import annotations

import pytest
import torch
from deformable_helpers import randomize  # noqa: F401  (puts benchmarks/ on the path)
from torchvision.ops import box_convert, generalized_box_iou

from benchmarks.reference_deformable_detr import OriginalSetCriterion, original_focal_cost, original_match, original_postprocess
from visiontf.detection import DeformablePostProcess, HungarianMatcher, PostProcess, SetCriterion, build_postprocess
from visiontf.models import create_model
from visiontf.models.contract import Detector
from visiontf.models.deformable_detr.build import build_deformable_detr
from visiontf.models.deformable_detr.deformable_detr import DeformableDETR

K = 6


def _outputs(B: int, Q: int, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    boxes = torch.cat([0.2 + 0.6 * torch.rand(B, Q, 2, generator=g), 0.05 + 0.3 * torch.rand(B, Q, 2, generator=g)], -1)
    return {"pred_logits": 2 * torch.randn(B, Q, K, generator=g), "pred_boxes": boxes}


def _targets(sizes, seed: int = 0) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    return [{"labels": torch.randint(0, K, (n,), generator=g),
             "boxes": torch.cat([0.2 + 0.6 * torch.rand(n, 2, generator=g), 0.05 + 0.3 * torch.rand(n, 2, generator=g)], -1)}
            for n in sizes]


def _model_outputs(B=3, Q=20, S=50) -> dict:
    out = _outputs(B, Q, 0)
    out["aux_outputs"] = [_outputs(B, Q, i + 1) for i in range(2)]
    out["enc_outputs"] = _outputs(B, S, 9)
    return out


def test_focal_matcher_equals_the_original():
    outputs, targets = _outputs(3, 30, 0), _targets([4, 0, 7])
    matcher = HungarianMatcher(cost_class=2.0, class_cost="focal")
    cost, _, _ = matcher.cost_blocks(outputs, targets)
    # the original's batch-wide (B*Q, T) matrix; ours is its diagonal blocks, target-major
    labels, boxes = torch.cat([t["labels"] for t in targets]), torch.cat([t["boxes"] for t in targets])
    pred = outputs["pred_boxes"].flatten(0, 1)
    full = (5 * torch.cdist(pred, boxes, p=1) + 2 * original_focal_cost(outputs["pred_logits"], labels)
            - 2 * generalized_box_iou(box_convert(pred, "cxcywh", "xyxy"), box_convert(boxes, "cxcywh", "xyxy"))).view(3, 30, -1)
    torch.testing.assert_close(cost[:4], full[0, :, :4].t())
    torch.testing.assert_close(cost[4:], full[2, :, 4:].t())
    for (i, j), (ri, rj) in zip(matcher(outputs, targets), original_match(outputs, targets)):
        assert torch.equal(i, ri) and torch.equal(j, rj)


def test_focal_criterion_equals_the_original():
    outputs, targets = _model_outputs(), _targets([3, 0, 5])
    ours = SetCriterion(K, class_loss="focal")(outputs, targets)
    expected = OriginalSetCriterion(K)(outputs, targets)
    assert set(expected) <= set(ours)
    for name, value in expected.items():
        torch.testing.assert_close(ours[name], value.float(), rtol=1e-6, atol=1e-6, msg=name)
    # weighted total: class 2, L1 5, GIoU 2 on every layer and the proposals; metrics unweighted
    weights = {"loss_ce": 2.0, "loss_bbox": 5.0, "loss_giou": 2.0}
    total = sum(w * expected[base + suffix] for base, w in weights.items() for suffix in ("", "_0", "_1", "_enc"))
    torch.testing.assert_close(ours["loss"], total, rtol=1e-6, atol=1e-5)
    assert {"loss_ce_enc", "loss_bbox_enc", "loss_giou_enc", "loss_ce_1"} <= set(ours) and "class_error_enc" not in ours


def test_enc_targets_are_class_agnostic():
    outputs, targets = _model_outputs(), _targets([3, 1, 5])
    relabelled = [{**t, "labels": (t["labels"] + 1) % K} for t in targets]
    a, b = SetCriterion(K, class_loss="focal")(outputs, targets), SetCriterion(K, class_loss="focal")(outputs, relabelled)
    assert a["loss_ce_enc"] == b["loss_ce_enc"] and a["loss_ce"] != b["loss_ce"]


def test_bf16_predictions_give_float32_terms_and_gradients():
    outputs = {k: v.to(torch.bfloat16).requires_grad_() for k, v in _outputs(2, 10, 0).items()}
    terms = SetCriterion(K, class_loss="focal")(outputs, _targets([2, 3]))
    assert all(v.dtype == torch.float32 for v in terms.values())
    terms["loss"].backward()
    assert torch.isfinite(outputs["pred_logits"].grad.float()).all()


def test_detr_defaults_unchanged_and_mismatches_named():
    detr = SetCriterion(K)
    assert detr.class_loss == "ce" and detr.weight_dict == {"loss_ce": 1.0, "loss_bbox": 5.0, "loss_giou": 2.0}
    assert detr.matcher.class_cost == "softmax" and detr.matcher.cost_class == 1.0
    focal = SetCriterion(K, class_loss="focal")
    assert focal.matcher.class_cost == "focal" and focal.matcher.cost_class == 2.0 and focal.weight_dict["loss_ce"] == 2.0
    with pytest.raises(ValueError, match="class_cost='focal'"):
        SetCriterion(K, HungarianMatcher(), class_loss="focal")
    with pytest.raises(ValueError, match=r"expects pred_logits with 6 entries \(sigmoid classes"):
        focal({"pred_logits": torch.randn(1, 4, K + 1), "pred_boxes": torch.rand(1, 4, 4)}, _targets([1]))
    with pytest.raises(ValueError, match=r"labels outside \[0, 6\) \(pred_logits has 6 sigmoid classes\)"):
        HungarianMatcher(class_cost="focal")(_outputs(1, 4, 0), [{"labels": torch.tensor([6]), "boxes": torch.rand(1, 4)}])


def test_postprocess_equals_the_original():
    outputs = _outputs(2, 30, 3)
    sizes = torch.tensor([[480, 640], [300, 200]])
    ours = DeformablePostProcess()(outputs, sizes)
    expected = original_postprocess(outputs, sizes)
    for a, b in zip(ours, expected):
        assert a["scores"].shape == (100,) and torch.equal(a["labels"], b["labels"])
        torch.testing.assert_close(a["scores"], b["scores"])
        torch.testing.assert_close(a["boxes"], b["boxes"])
    # fewer than 100 (query, class) pairs: all of them, sorted; thresholds filter
    small = DeformablePostProcess()(_outputs(1, 5, 0), [(10, 10)])[0]
    assert len(small["scores"]) == 5 * K and (small["scores"].diff() <= 0).all()
    kept = DeformablePostProcess()(outputs, sizes, score_threshold=0.5, top_k=20)
    assert all(len(r["scores"]) <= 20 and (r["scores"] > 0.5).all() for r in kept)



def _greedy_nms(boxes, scores, labels, iou, class_agnostic):
    """NMS as DINO's PostProcess specifies it, written out: keep pairs in decreasing score, drop
    any whose box overlaps an already kept one (of the same label, unless class-agnostic) by > iou."""
    from torchvision.ops import box_iou

    kept = []
    for i in scores.argsort(descending=True, stable=True).tolist():
        if all(box_iou(boxes[i : i + 1], boxes[j : j + 1]).item() <= iou
               for j in kept if class_agnostic or labels[j] == labels[i]):
            kept.append(i)
    return kept


def test_postprocess_nms_as_dino_and_per_class():
    # two queries on one object (query 1 slightly shifted), a third elsewhere; 2 classes
    logits = torch.tensor([[[3.0, 1.0], [2.0, -4.0], [0.5, -1.0]]])
    boxes = torch.tensor([[[0.5, 0.5, 0.4, 0.4], [0.51, 0.5, 0.4, 0.4], [0.2, 0.2, 0.1, 0.1]]])
    out = {"pred_logits": logits, "pred_boxes": boxes}
    plain = DeformablePostProcess(num_top=6)(out, [(100, 100)])[0]
    assert len(plain["scores"]) == 6  # every (query, class) pair
    agnostic = DeformablePostProcess(num_top=6, nms_iou_threshold=0.7)(out, [(100, 100)])[0]
    # DINO: one box per object whatever the label; the shifted duplicate and query 0's class-1 pair go
    assert agnostic["labels"].tolist() == [0, 0] and torch.allclose(agnostic["scores"], torch.sigmoid(torch.tensor([3.0, 0.5])))
    per_class = DeformablePostProcess(num_top=6, nms_iou_threshold=0.7, nms_class_agnostic=False)(out, [(100, 100)])[0]
    # per label: query 0 keeps its class-1 pair, the duplicate of each label goes
    assert per_class["labels"].tolist() == [0, 1, 0, 1]
    assert torch.allclose(per_class["scores"], torch.sigmoid(torch.tensor([3.0, 1.0, 0.5, -1.0])))
    # random outputs: the same pairs as the written-out greedy NMS, still sorted, then the score threshold
    outputs, sizes = _outputs(2, 30, 3), torch.tensor([[480, 640], [300, 200]])
    for agn in (True, False):
        ours = DeformablePostProcess(nms_iou_threshold=0.5, nms_class_agnostic=agn)(outputs, sizes)
        for r, ref in zip(ours, DeformablePostProcess()(outputs, sizes)):
            keep = _greedy_nms(ref["boxes"], ref["scores"], ref["labels"], 0.5, agn)
            assert 0 < len(keep) < 100 and torch.equal(r["scores"], ref["scores"][keep])
            assert torch.equal(r["labels"], ref["labels"][keep]) and torch.equal(r["boxes"], ref["boxes"][keep])
        thresholded = DeformablePostProcess(nms_iou_threshold=0.5, nms_class_agnostic=agn)(outputs, sizes, score_threshold=0.5)
        assert all(torch.equal(t["scores"], r["scores"][r["scores"] > 0.5]) for t, r in zip(thresholded, ours))
    for bad in (0.0, -1, 1.5):
        with pytest.raises(ValueError, match=r"nms_iou_threshold must be in \(0, 1\] or None"):
            DeformablePostProcess(nms_iou_threshold=bad)


def test_model_nms_settings_reach_the_postprocess():
    kw = dict(num_classes=3, backbone="resnet18", hidden_dim=32, nheads=2, enc_layers=1, dec_layers=1, num_queries=4,
              num_feature_levels=1)
    assert build_postprocess(build_deformable_detr(DeformableDETR, **kw)).nms_iou_threshold is None  # off by default, as in DINO
    post = build_postprocess(build_deformable_detr(DeformableDETR, **kw, nms_iou_threshold=0.7, nms_class_agnostic=False))
    assert (post.nms_iou_threshold, post.nms_class_agnostic) == (0.7, False)
    with pytest.raises(ValueError, match="nms_iou_threshold must be in"):
        build_deformable_detr(DeformableDETR, **kw, nms_iou_threshold=-1)

def test_build_postprocess_follows_the_class_head():
    class Unknown(Detector):
        class_head = "mystery"

    assert isinstance(build_postprocess(build_deformable_detr(DeformableDETR, num_classes=3, backbone="resnet18", hidden_dim=32, nheads=2, enc_layers=1,
                                                       dec_layers=1, num_queries=4, num_feature_levels=1)), DeformablePostProcess)
    assert isinstance(build_postprocess(create_model("detr_tiny", num_classes=2)), PostProcess)
    assert isinstance(build_postprocess(Detector()), PostProcess)  # the kind's declared default: DETR's convention
    with pytest.raises(ValueError, match=r"class_head = 'mystery'.*known: \['sigmoid', 'softmax'\]"):
        build_postprocess(Unknown())
