"""The set criterion's DINO-line options: Group DETR matching, denoising terms, DINO's interm loss,
IoU-aware class losses; and the set loss chosen from the model's class head. Cost: about 2 s."""
from __future__ import annotations

import pytest
import torch
from torchvision.ops import box_convert, box_iou

from visiontf.models.contract import Detector
from visiontf.models.deformable_detr.denoising import build_contrastive_denoising
from visiontf.set_prediction import HungarianMatcher, SetCriterion
from visiontf.set_prediction.losses import ia_bce_loss, matchability_aware_loss, varifocal_loss
from visiontf.set_prediction.set_loss import build_criterion

K = 4


def _targets():
    return [
        {"labels": torch.tensor([1, 3]), "boxes": torch.tensor([[0.3, 0.4, 0.2, 0.3], [0.6, 0.5, 0.3, 0.2]])},
        {"labels": torch.tensor([2]), "boxes": torch.tensor([[0.5, 0.5, 0.4, 0.4]])},
        {"labels": torch.zeros(0, dtype=torch.int64), "boxes": torch.zeros(0, 4)},
    ]


def _outputs(B: int = 3, Q: int = 6, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"pred_logits": torch.randn(B, Q, K, generator=g), "pred_boxes": torch.rand(B, Q, 4, generator=g) * 0.5 + 0.25}


def _criterion(**kw) -> SetCriterion:
    matcher = HungarianMatcher(cost_class=2.0, class_cost="focal")
    return SetCriterion(K, matcher, weight_dict={"loss_ce": 1.0, "loss_bbox": 5.0, "loss_giou": 2.0}, class_loss=kw.pop("class_loss", "focal"), **kw)


def test_group_matching_is_one_to_one_per_group():
    crit = _criterion()
    groups = [_outputs(seed=s) for s in range(3)]
    joined = {k: torch.cat([g[k] for g in groups], 1) for k in ("pred_logits", "pred_boxes")}
    indices = crit.match_groups(joined, _targets(), 3)
    for b, (q, t) in enumerate(indices):
        expected_q, expected_t = [], []
        for g, out in enumerate(groups):
            qi, ti = crit.matcher(out, _targets())[b]
            expected_q.append(qi + 6 * g)
            expected_t.append(ti)
        assert torch.equal(q, torch.cat(expected_q)) and torch.equal(t, torch.cat(expected_t))


def test_identical_groups_give_the_single_group_losses():
    """Normalised by num_boxes * G: G copies of the same queries weigh as one."""
    crit = _criterion()
    single = _outputs()
    tripled = {k: v.repeat(1, 3, 1) for k, v in single.items()}
    a = crit(single, _targets())
    b = crit({**tripled, "num_query_groups": 3}, _targets())
    for key in ("loss_ce", "loss_bbox", "loss_giou", "loss"):
        torch.testing.assert_close(a[key], b[key])


def test_denoising_terms_use_the_fixed_assignment():
    crit = _criterion()
    targets = _targets()
    dn = build_contrastive_denoising(targets, K, 6, num_denoising=4, generator=torch.Generator().manual_seed(0))
    meta = dn.meta
    P = meta.pad_size
    g = torch.Generator().manual_seed(1)
    dn_logits = torch.randn(3, P, K, generator=g)
    dn_boxes = torch.rand(3, P, 4, generator=g) * 0.5 + 0.25
    for b, (q, t) in enumerate(zip(meta.positive_idx, meta.target_idx)):
        dn_boxes[b, q] = targets[b]["boxes"][t]  # positives reconstruct their boxes exactly
    outputs = {**_outputs(), "dn_meta": meta,
               "dn_outputs": {"pred_logits": dn_logits, "pred_boxes": dn_boxes, "aux_outputs": [{"pred_logits": dn_logits, "pred_boxes": dn_boxes}]}}
    terms = crit(outputs, targets)
    assert float(terms["loss_bbox_dn"]) == 0 and abs(float(terms["loss_giou_dn"])) < 1e-6
    assert {"loss_ce_dn", "loss_ce_dn_0", "loss_bbox_dn_0"} <= set(terms) and "cardinality_error_dn" not in terms
    # class term: focal over all P queries, one-hot at the positives only, / (num_boxes * dn groups)
    num_boxes = 3.0
    indices = [(q, t) for q, t in zip(meta.positive_idx, meta.target_idx)]
    expected = crit.loss_labels({"pred_logits": dn_logits, "pred_boxes": dn_boxes}, targets, indices, num_boxes * meta.num_groups)
    torch.testing.assert_close(terms["loss_ce_dn"], expected["loss_ce"])
    plain = crit(_outputs(), targets)
    torch.testing.assert_close(terms["loss"], plain["loss"] + 2 * terms["loss_ce_dn"] + 2 * 2.0 * terms["loss_giou_dn"])


def test_a_batch_without_boxes_gives_zero_denoising_terms():
    crit = _criterion(class_loss="vfl")
    empty = [{"labels": torch.zeros(0, dtype=torch.int64), "boxes": torch.zeros(0, 4)}] * 3
    dn = build_contrastive_denoising(empty, K, 6)
    no_queries = {"pred_logits": torch.zeros(3, 0, K), "pred_boxes": torch.zeros(3, 0, 4)}
    outputs = {**_outputs(), "dn_meta": dn.meta, "dn_outputs": {**no_queries, "aux_outputs": [no_queries, no_queries]},
               "interm_outputs": _outputs(seed=3)}
    terms = crit(outputs, empty)
    assert all(torch.isfinite(v) for v in terms.values())
    assert float(terms["loss_ce_dn"]) == float(terms["loss_bbox_dn"]) == 0 and float(terms["loss_bbox"]) == 0
    # the same names as a step with boxes (logged every step): aux layers' _dn_<i> terms too
    dn_terms = {k for k in terms if "_dn" in k}
    assert dn_terms == {f"{t}{s}" for t in ("loss_ce_dn", "loss_bbox_dn", "loss_giou_dn") for s in ("", "_0", "_1")}


def test_interm_outputs_are_supervised_with_their_classes():
    """DINO's interm loss keeps the labels (the original two-stage ``_enc`` loss is class-agnostic)."""
    crit = _criterion()
    interm = _outputs(seed=5)
    terms = crit({**_outputs(), "interm_outputs": interm, "enc_outputs": interm}, _targets())
    indices = crit.matcher(interm, _targets())
    expected = crit.loss_labels(interm, _targets(), indices, 3.0)
    torch.testing.assert_close(terms["loss_ce_interm"], expected["loss_ce"])
    assert not torch.allclose(terms["loss_ce_interm"], terms["loss_ce_enc"])


@pytest.mark.parametrize("class_loss", ["vfl", "ia_bce", "mal"])
def test_iou_aware_class_losses_take_the_matched_iou(class_loss):
    crit = _criterion(class_loss=class_loss)
    out, targets = _outputs(), _targets()
    terms = crit(out, targets)
    indices = crit.matcher(out, targets)
    target_classes = torch.full((3, 6), K)
    iou = torch.zeros(3, 6)
    for b, (q, t) in enumerate(indices):
        target_classes[b, q] = targets[b]["labels"][t]
        pairs = box_iou(box_convert(out["pred_boxes"][b, q], "cxcywh", "xyxy"), box_convert(targets[b]["boxes"][t], "cxcywh", "xyxy"))
        iou[b, q] = pairs.diagonal()
    fn = {"vfl": varifocal_loss, "ia_bce": ia_bce_loss, "mal": matchability_aware_loss}[class_loss]
    torch.testing.assert_close(terms["loss_ce"], fn(out["pred_logits"], target_classes, iou, 3.0, gamma=crit.focal_gamma))


def test_set_loss_follows_the_class_head():
    class Sigmoid(Detector):
        class_head = "sigmoid"

    crit = build_criterion(Sigmoid(), K, criterion_kwargs={"class_loss": "ia_bce"}, matcher_kwargs={"cost_class": 2.0})
    assert crit.class_loss == "ia_bce" and crit.matcher.class_cost == "focal" and crit.matcher.cost_class == 2.0
    assert build_criterion(Detector(), K).class_loss == "ce"  # the kind's declared default: DETR's softmax
    with pytest.raises(ValueError, match="class_cost='focal'"):
        SetCriterion(K, HungarianMatcher(), class_loss="vfl")
