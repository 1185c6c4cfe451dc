"""RT-DETR's ``decoder.num_one_to_many_queries`` and the criterion's one-to-many terms: H-DETR's hybrid matching
(Jia et al., CVPR 2023). In training, T more queries (the top T encoder positions by score) go through the same
decoder layers in a pass of their own and are matched to the ground truth repeated k times.

Checked: the one-to-one outputs are those of the model without the option (no attention across the two sets); the
one-to-many outputs are those of the same weights built with ``num_queries`` T and no other query (the top T by score,
decoded alone); evaluation is unchanged; the one-to-many terms equal the criterion's own terms on the repeated
targets, with up to k queries an object; their weight; a training step; the refusals."""
from __future__ import annotations

import pytest
import torch
from rtdetr_helpers import one_thread  # noqa: F401 (a module fixture: one torch thread)

from visiontf.models import create_model
from visiontf.models.rtdetr.rtdetr_options import DecoderOptions
from visiontf.set_prediction import SetCriterion, build_criterion
from visiontf.set_prediction.fine_grained import FineGrainedCriterion
from visiontf.set_prediction.set_loss_section import SetLoss

T = 20
TINY = {"encoder": {"hidden_dim": 32, "nhead": 2, "dim_feedforward": 32},
        "decoder": {"hidden_dim": 32, "nhead": 2, "dim_feedforward": 32, "num_queries": 12, "num_layers": 3},
        "denoising": {"num_denoising": 4}}
IMAGES = torch.randn(2, 3, 96, 128, generator=torch.Generator().manual_seed(2))
TARGETS = [{"labels": torch.tensor([0, 2]), "boxes": torch.tensor([[0.4, 0.4, 0.3, 0.3], [0.7, 0.6, 0.2, 0.4]])},
           {"labels": torch.tensor([1]), "boxes": torch.tensor([[0.5, 0.5, 0.6, 0.5]])}]


def _model(decoder: dict | None = None, denoising: int = 4, state: dict | None = None):
    """rtdetr_tiny at random weights (``state``: these weights) in training mode with BatchNorm in evaluation mode, so
    that two builds compute the same encoder."""
    torch.manual_seed(0)
    kwargs = {**TINY, "decoder": {**TINY["decoder"], **(decoder or {})}, "denoising": {"num_denoising": denoising}}
    model = create_model("rtdetr_tiny", num_classes=3, **kwargs)
    if state is not None:
        model.load_state_dict(state)
    model.train()
    for module in model.modules():
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
            module.eval()
    return model


def _layers(out: dict) -> list[dict]:
    return [*out["aux_outputs"], {"pred_logits": out["pred_logits"], "pred_boxes": out["pred_boxes"]}]


def test_one_to_one_outputs_do_not_see_the_one_to_many_queries():
    plain = _model()
    hybrid = _model({"num_one_to_many_queries": T}, state=plain.state_dict())
    torch.manual_seed(5)
    with torch.no_grad():
        ours = hybrid(IMAGES, None, targets=TARGETS, need_weights=True)
    torch.manual_seed(5)  # the same denoising queries
    with torch.no_grad():
        theirs = plain(IMAGES, None, targets=TARGETS, need_weights=True)
    # the attention picture is the one-to-one queries' (the last layer runs once more, for the one-to-many queries)
    for key in ("dec_sampling_locations", "dec_attention_weights", "dec_reference_points"):
        torch.testing.assert_close(ours[key], theirs[key], rtol=0, atol=0)
    assert "one_to_many_outputs" not in theirs
    for a, b in zip(_layers(ours), _layers(theirs)):
        torch.testing.assert_close(a["pred_logits"], b["pred_logits"], rtol=0, atol=0)
        torch.testing.assert_close(a["pred_boxes"], b["pred_boxes"], rtol=0, atol=0)
    torch.testing.assert_close(ours["dn_outputs"]["pred_boxes"], theirs["dn_outputs"]["pred_boxes"], rtol=0, atol=0)
    many = ours["one_to_many_outputs"]
    assert many["pred_logits"].shape == (2, T, 3) and many["pred_boxes"].shape == (2, T, 4)
    assert len(many["aux_outputs"]) == TINY["decoder"]["num_layers"] - 1


def test_one_to_many_queries_are_the_top_positions_decoded_alone():
    # with distinct selection on the one-to-one queries: the one-to-many ones are still the top T by score alone
    hybrid = _model({"num_one_to_many_queries": T, "distinct_query_iou": 0.5, "distinct_between_layers": True})
    with torch.no_grad():  # large proposals, so that the distinct selection suppresses some of the top T
        hybrid.decoder.enc_bbox_head.layers[-1].bias[2:] += 4.0
    alone = _model({"num_queries": T}, denoising=0, state={k: v for k, v in hybrid.state_dict().items()
                                                             if not k.startswith("decoder.denoising_class_embed")})
    with torch.no_grad():
        many = hybrid(IMAGES, None, targets=TARGETS)["one_to_many_outputs"]
        reference = alone(IMAGES, None, targets=TARGETS)
    for a, b in zip(_layers(many), _layers(reference)):
        torch.testing.assert_close(a["pred_logits"], b["pred_logits"], rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(a["pred_boxes"], b["pred_boxes"], rtol=1e-6, atol=1e-6)


def test_evaluation_is_unchanged():
    plain = _model()
    hybrid = _model({"num_one_to_many_queries": T}, state=plain.state_dict())
    plain.eval(), hybrid.eval()
    with torch.no_grad():
        ours, theirs = hybrid(IMAGES), plain(IMAGES)
    assert set(ours) == set(theirs)
    torch.testing.assert_close(ours["pred_logits"], theirs["pred_logits"], rtol=0, atol=0)
    torch.testing.assert_close(ours["pred_boxes"], theirs["pred_boxes"], rtol=0, atol=0)


@pytest.mark.parametrize("repeats", [1, 3])
def test_one_to_many_terms_are_the_criterion_on_the_repeated_targets(repeats):
    model = _model({"num_one_to_many_queries": T})
    with torch.no_grad():
        out = model(IMAGES, None, targets=TARGETS)
    criterion = build_criterion(model, 3, criterion_kwargs={"one_to_many_repeats": repeats})
    terms = criterion(out, TARGETS)
    repeated = [{"labels": t["labels"].repeat(repeats), "boxes": t["boxes"].repeat(repeats, 1)} for t in TARGETS]
    many = out["one_to_many_outputs"]
    for suffix, layer in [("_o2m", many), *((f"_o2m_{i}", a) for i, a in enumerate(many["aux_outputs"]))]:
        # the criterion's own final-layer terms on the repeated targets: num_boxes is then k times the count
        reference = criterion({"pred_logits": layer["pred_logits"], "pred_boxes": layer["pred_boxes"]}, repeated)
        for name in ("loss_ce", "loss_bbox", "loss_giou"):
            torch.testing.assert_close(terms[name + suffix], reference[name], rtol=1e-6, atol=1e-7)
    # every target is matched k times when there are enough queries (3 objects x k <= T)
    indices = criterion.matcher(many, repeated)
    for (queries, matched), target in zip(indices, TARGETS):
        assert len(set(queries.tolist())) == len(queries) == repeats * len(target["labels"])
        counts = torch.bincount(matched % len(target["labels"]), minlength=len(target["labels"]))
        assert counts.tolist() == [repeats] * len(target["labels"])
    assert not any(name.startswith("cardinality_error_o2m") for name in terms)


def test_one_to_many_weight_scales_the_terms_in_the_total():
    model = _model({"num_one_to_many_queries": T})
    with torch.no_grad():
        out = model(IMAGES, None, targets=TARGETS)
    without = {k: v for k, v in out.items() if k != "one_to_many_outputs"}
    weights = {"loss_ce": 1.0, "loss_bbox": 5.0, "loss_giou": 2.0}
    totals = {}
    for weight in (0.0, 1.0, 2.5):
        criterion = build_criterion(model, 3, criterion_kwargs={"one_to_many_weight": weight})
        terms = criterion(out, TARGETS)
        totals[weight] = terms["loss"]
        many = sum(weights[name.split("_o2m")[0]] * value for name, value in terms.items() if "_o2m" in name)
        base = criterion(without, TARGETS)["loss"]
        torch.testing.assert_close(terms["loss"], base + weight * many, rtol=1e-6, atol=1e-6)
    assert totals[2.5] > totals[1.0] > totals[0.0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_training_step_reaches_every_layer_through_the_one_to_many_terms(dtype):
    model = _model({"num_one_to_many_queries": T}, denoising=0)
    # under CPU autocast as bf16-mixed trains (the criterion computes its terms in float32 whatever the outputs' dtype)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
        out = model(IMAGES, None, targets=TARGETS)
    assert out["one_to_many_outputs"]["pred_logits"].dtype == dtype
    # the one-to-many terms alone: their gradient reaches every decoder layer, the heads and the encoder
    terms = build_criterion(model, 3)(out, TARGETS)
    loss = sum(value for name, value in terms.items() if "_o2m" in name and name.startswith("loss_"))
    assert torch.isfinite(loss)
    loss.backward()
    for i, layer in enumerate(model.decoder.layers):
        assert layer.cross_attn.value_proj.weight.grad.abs().sum() > 0, i
        assert model.decoder.score_heads[i].weight.grad.abs().sum() > 0, i
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.encoder.parameters())


def test_the_set_loss_section_carries_k_and_lambda():
    section = SetLoss.of({"criterion": {"one_to_many_repeats": 4, "one_to_many_weight": 0.5}})
    assert section.criterion_kwargs() == {"one_to_many_repeats": 4, "one_to_many_weight": 0.5}
    criterion = build_criterion(_model(), 3, criterion_kwargs=section.criterion_kwargs())
    assert (criterion.one_to_many_repeats, criterion.one_to_many_weight) == (4, 0.5)
    for bad in ({"one_to_many_repeats": 0}, {"one_to_many_repeats": 2.5}, {"one_to_many_weight": -1.0}):
        with pytest.raises(ValueError, match="one_to_many"):
            SetLoss.of({"criterion": bad})


def test_refusals():
    for bad in (-1, 2.0, True):
        with pytest.raises(ValueError, match="num_one_to_many_queries"):
            DecoderOptions(num_one_to_many_queries=bad)
    with pytest.raises(ValueError, match="learn_query_content"):
        DecoderOptions(num_one_to_many_queries=10, learn_query_content=True)
    with pytest.raises(ValueError, match="one_to_many_repeats"):
        SetCriterion(3, class_loss="vfl", one_to_many_repeats=0)
    with pytest.raises(ValueError, match="one_to_many_weight"):
        SetCriterion(3, class_loss="vfl", one_to_many_weight=float("nan"))
    # more one-to-many queries than the encoder has positions (96 x 128: 12 x 16 + 6 x 8 + 3 x 4 = 252)
    model = _model({"num_one_to_many_queries": 400})
    with pytest.raises(ValueError, match="num_one_to_many_queries=400"):
        model(IMAGES, None, targets=TARGETS)
    # D-FINE's decoder has no one-to-many pass, and its criterion no one-to-many terms: both say so
    with pytest.raises(ValueError, match="D-FINE"):
        create_model("dfine_tiny", num_classes=3, decoder={"num_one_to_many_queries": 10})
    with pytest.raises(ValueError, match="one_to_many_outputs"):
        FineGrainedCriterion(3)({"pred_logits": torch.zeros(1, 4, 3), "pred_boxes": torch.rand(1, 4, 4),
                                 "one_to_many_outputs": {}}, TARGETS[:1])
