"""Focal matching, focal set loss (aux and two-stage terms) and sigmoid post-processing vs the original's results.

What the original's HungarianMatcher, SetCriterion and PostProcess computed is recorded in
``tests/fixtures/deformable_detr/`` (``scripts/fixtures/make_deformable_detr.py`` runs the real repository):
``criterion`` on synthetic predictions (aux layers, encoder proposals, an image without targets) and, for each
model case, the training step of the loaded checkpoint (loss terms, matchings, gradients). Cost: about 5 s.
"""
from __future__ import annotations

import pytest
import torch
from deformable_helpers import (
    VARIANTS,
    fixture,
    load_recorded,
    max_diff,
    recorded_matches,
    recorded_targets,
    save_checkpoint,
)

from visiontf.models import create_model
from visiontf.models.contract import Detector
from visiontf.models.convert import rename
from visiontf.models.deformable_detr.build import build_deformable_detr
from visiontf.models.deformable_detr.convert import ORIGINAL_RULES
from visiontf.models.deformable_detr.deformable_detr import DeformableDETR
from visiontf.set_prediction import DeformablePostProcess, HungarianMatcher, PostProcess, SetCriterion, build_postprocess

K = 6
DTYPES = {"float32": torch.float32, "float64": torch.float64}
#: visiontf's matcher and losses run in float32 whatever the predictions' dtype (bf16 models too), so the
#: original's float64 records are met to float32 rounding (measured: costs 3.6e-6, terms 6.9e-6, total 4.6e-5)
LOSS_TOL = dict(rtol=1e-6, atol=1e-5)
#: the loaded checkpoint's training step: its float32 outputs are the original's within 1e-6 (measured: terms 5.7e-6,
#: totals of 150-200 within 1.5e-5); gradients relative to each tensor's largest (measured: 5.1e-6 float32, 8.2e-8 float64)
TRAIN_TOL = dict(rtol=1e-5, atol=1e-5)
GRAD_TOL = {"float32": 1e-4, "float64": 1e-6}


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


def _recorded_predictions(dtype: torch.dtype) -> dict:
    """The synthetic predictions of the ``criterion`` fixture, nested as a model returns them."""
    flat = {k.removeprefix("outputs."): v.to(dtype) for k, v in fixture("criterion").inputs.items() if k.startswith("outputs.")}
    pair = ("pred_logits", "pred_boxes")
    aux = sorted({int(k.split(".")[1]) for k in flat if k.startswith("aux_outputs.")})
    return {**{k: flat[k] for k in pair}, "aux_outputs": [{k: flat[f"aux_outputs.{i}.{k}"] for k in pair} for i in aux],
            "enc_outputs": {k: flat[f"enc_outputs.{k}"] for k in pair}}


def _layers(outputs: dict, targets: list[dict]) -> dict[str, tuple[dict, list[dict]]]:
    """Each matched layer by the fixture's name, with its targets (the encoder's are class-agnostic)."""
    layers = {"final": ({k: outputs[k] for k in ("pred_logits", "pred_boxes")}, targets)}
    layers.update({f"aux_{i}": (aux, targets) for i, aux in enumerate(outputs.get("aux_outputs", []))})
    if "enc_outputs" in outputs:
        layers["enc"] = (outputs["enc_outputs"], [{**t, "labels": torch.zeros_like(t["labels"])} for t in targets])
    return layers


def _assert_terms(ours: dict, record: dict, weight_dict: dict, tol: dict) -> None:
    expected = {k.removeprefix("loss."): v for k, v in record.items() if k.startswith("loss.")}
    assert set(expected) <= set(ours)
    for name, value in expected.items():
        torch.testing.assert_close(ours[name].to(value.dtype), value, **tol, msg=name)
    # the weighted total as the original's engine sums it: class 2, L1 5, GIoU 2 on every layer and the proposals
    # (the original's weight_dict names the "_enc" terms for every variant)
    assert {k for k in expected if k.startswith(("loss_ce", "loss_bbox", "loss_giou"))} <= set(weight_dict)
    torch.testing.assert_close(ours["loss"].to(record["loss_total"].dtype), record["loss_total"], **tol)


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_focal_matcher_equals_the_original(dtype):
    fx = fixture("criterion")
    record, outputs, targets = fx.outputs[dtype], _recorded_predictions(DTYPES[dtype]), recorded_targets(fx, DTYPES[dtype])
    matcher = HungarianMatcher(cost_class=2.0, class_cost="focal")
    cost, _, _ = matcher.cost_blocks({k: outputs[k] for k in ("pred_logits", "pred_boxes")}, targets)
    # the original solves one (Q, T_b) block per image of its batch-wide matrix; ours are the same blocks, target-major
    start = 0
    for b, t in enumerate(targets):
        block = record[f"cost.{b}"]
        assert block.shape == (outputs["pred_logits"].shape[1], len(t["labels"]))
        torch.testing.assert_close(cost[start:start + len(t["labels"])].t().to(block.dtype), block, **LOSS_TOL)
        start += len(t["labels"])
    assert start == cost.shape[0]
    for name, (layer, layer_targets) in _layers(outputs, targets).items():
        for (i, j), (ri, rj) in zip(matcher(layer, layer_targets), recorded_matches(record, name, len(targets))):
            assert torch.equal(i, ri) and torch.equal(j, rj), name


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_focal_criterion_equals_the_original(dtype):
    fx = fixture("criterion")
    outputs, targets = _recorded_predictions(DTYPES[dtype]), recorded_targets(fx, DTYPES[dtype])
    ours = SetCriterion(fx.meta["num_classes"], class_loss="focal")(outputs, targets)
    _assert_terms(ours, fx.outputs[dtype], fx.meta["weight_dict"], LOSS_TOL)
    assert {"loss_ce_enc", "loss_bbox_enc", "loss_giou_enc", "loss_ce_1"} <= set(ours) and "class_error_enc" not in ours


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_training_step_of_the_loaded_checkpoint_equals_the_original(variant, dtype, tmp_path):
    """Training mode on the original's checkpoint: loss terms, every layer's matching and the gradients it recorded."""
    fx = fixture(variant)
    record = fx.outputs[dtype]
    model = load_recorded(variant, save_checkpoint(fx, tmp_path / "ckpt.pth"), DTYPES[dtype]).train()
    targets = recorded_targets(fx, DTYPES[dtype])
    outputs = model(fx.inputs["images"].to(DTYPES[dtype]), fx.inputs["mask"])
    criterion = SetCriterion(fx.meta["num_classes"], class_loss="focal")
    terms = criterion(outputs, targets)
    _assert_terms(terms, record, fx.meta["weight_dict"], TRAIN_TOL)
    with torch.no_grad():
        for name, (layer, layer_targets) in _layers(outputs, targets).items():
            for (i, j), (ri, rj) in zip(criterion.matcher(layer, layer_targets), recorded_matches(record, name, len(targets))):
                assert torch.equal(i, ri) and torch.equal(j, rj), name
    terms["loss"].backward()
    params = dict(model.named_parameters())
    grads = {k.removeprefix("grad."): v for k, v in record.items() if k.startswith("grad.")}
    assert len(grads) >= 10
    for key, expected in grads.items():
        ours = params[rename(key, ORIGINAL_RULES)].grad
        scale = expected.abs().max().item()
        assert scale > 0 and max_diff(ours, expected) <= GRAD_TOL[dtype] * scale, key


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


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_postprocess_equals_the_original(dtype):
    fx = fixture("criterion")
    record, outputs = fx.outputs[dtype], _recorded_predictions(DTYPES[dtype])
    sizes = fx.inputs["target_sizes"]
    ours = DeformablePostProcess()(outputs, sizes)
    for b, result in enumerate(ours):
        assert result["scores"].shape == (100,) and torch.equal(result["labels"], record[f"detections.{b}.labels"])
        # visiontf returns float32 scores and boxes (COCO-ready) whatever the model's dtype
        assert max_diff(result["scores"], record[f"detections.{b}.scores"]) < 1e-6
        assert max_diff(result["boxes"], record[f"detections.{b}.boxes"]) < 1e-4  # pixels


def test_postprocess_options():
    outputs = _outputs(2, 30, 3)
    sizes = torch.tensor([[480, 640], [300, 200]])
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
    kw = dict(num_classes=3, backbone="resnet18",
              arch=dict(hidden_dim=32, nheads=2, enc_layers=1, dec_layers=1, num_queries=4, num_feature_levels=1))
    assert build_postprocess(build_deformable_detr(DeformableDETR, **kw)).nms_iou_threshold is None  # off by default, as in DINO
    post = build_postprocess(build_deformable_detr(DeformableDETR, **kw, postprocess={"nms_iou_threshold": 0.7, "nms_class_agnostic": False}))
    assert (post.nms_iou_threshold, post.nms_class_agnostic) == (0.7, False)
    with pytest.raises(ValueError, match="nms_iou_threshold must be in"):
        build_deformable_detr(DeformableDETR, **kw, postprocess={"nms_iou_threshold": -1})

def test_build_postprocess_follows_the_class_head():
    class Unknown(Detector):
        class_head = "mystery"

    assert isinstance(build_postprocess(build_deformable_detr(DeformableDETR, num_classes=3, backbone="resnet18", arch=dict(
        hidden_dim=32, nheads=2, enc_layers=1, dec_layers=1, num_queries=4, num_feature_levels=1))), DeformablePostProcess)
    assert isinstance(build_postprocess(create_model("detr_tiny", num_classes=2)), PostProcess)
    assert isinstance(build_postprocess(Detector()), PostProcess)  # the kind's declared default: DETR's convention
    with pytest.raises(ValueError, match=r"class_head = 'mystery'.*known: \['sigmoid', 'softmax'\]"):
        build_postprocess(Unknown())
