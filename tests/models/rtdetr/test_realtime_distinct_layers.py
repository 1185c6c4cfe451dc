"""RT-DETR's, D-FINE's and DEIM's ``decoder.distinct_between_layers`` (DDQ DETR's selection after each decoder layer,
DINO's option of the same name, by the same class): after every layer but the last a class-agnostic NMS of the
matching queries' refined boxes, ranked by that layer's best class probability, suppresses duplicates for the rest of
the pass. Checked against torchvision's NMS by hand on a model's own layer outputs; the suppressed queries' logits in
the later layers, in training and at evaluation; the denoising queries untouched; a training step; the refusals."""
from __future__ import annotations

import pytest
import torch
from rtdetr_helpers import one_thread  # noqa: F401 (a module fixture: one torch thread)
from torchvision.ops import box_convert, nms

from visiontf.models import create_model
from visiontf.models.deformable_detr.distinct_queries import SUPPRESSED_LOGIT
from visiontf.models.rtdetr.rtdetr_options import DecoderOptions
from visiontf.set_prediction import build_criterion

TINY = {"encoder": {"hidden_dim": 32, "nhead": 2, "dim_feedforward": 32},
        "decoder": {"hidden_dim": 32, "nhead": 2, "dim_feedforward": 32, "num_queries": 12, "num_layers": 3},
        "denoising": {"num_denoising": 4}}
IOU = 0.5
IMAGES = torch.randn(2, 3, 96, 128, generator=torch.Generator().manual_seed(2))
TARGETS = [{"labels": torch.tensor([0, 2]), "boxes": torch.tensor([[0.4, 0.4, 0.3, 0.3], [0.7, 0.6, 0.2, 0.4]])},
           {"labels": torch.tensor([1]), "boxes": torch.tensor([[0.5, 0.5, 0.6, 0.5]])}]


def _model(between: bool, name: str = "rtdetr_tiny", **kwargs):
    """Random weights with large, overlapping boxes (the box heads' width and height biases raised) and scores that
    differ from query to query, so the selection suppresses some queries in every image; BatchNorm in evaluation mode,
    so a training pass without targets computes what evaluation does."""
    torch.manual_seed(0)
    if not kwargs:
        kwargs = TINY
    options = {"distinct_query_iou": IOU, "distinct_between_layers": between}
    model = create_model(name, num_classes=3, **{**kwargs, "decoder": {**kwargs["decoder"], **options}})
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.decoder.parameters():
            if p.dim() == 1:
                p.add_(0.3 * torch.randn(p.shape, generator=g))
        if name.startswith("rtdetr"):
            for head in model.decoder.bbox_heads:
                head.layers[-1].bias[2:] += 4.0
    model.train()
    for module in model.modules():
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
            module.eval()
    return model


def _layers(model, targets=None) -> dict:
    """Every decoder layer's logits and boxes of the matching queries (training's returns), (L, B, N, ...)."""
    out = model(IMAGES, None, targets=targets)
    layers = [*out["aux_outputs"], out]
    return {"logits": torch.stack([o["pred_logits"] for o in layers]), "boxes": torch.stack([o["pred_boxes"] for o in layers]), "out": out}


def _by_hand(logits: torch.Tensor, boxes: torch.Tensor, before: torch.Tensor) -> torch.Tensor:
    """(B, N) kept: torchvision's NMS per image among the queries kept ``before``, ranked by the best class probability."""
    keep = torch.zeros_like(before)
    for b in range(len(logits)):
        index = before[b].nonzero()[:, 0]
        kept = nms(box_convert(boxes[b, index], "cxcywh", "xyxy"), logits[b, index].sigmoid().max(-1).values, IOU)
        keep[b, index[kept]] = True
    return keep


def test_suppressed_queries_are_a_cumulative_nms_of_each_layers_outputs():
    with torch.no_grad():
        off, on = _layers(_model(False)), _layers(_model(True))
    # the first layer sees every query: the same outputs with the option and without
    torch.testing.assert_close(on["logits"][0], off["logits"][0])
    # the boxes the NMS ranks are each layer's refined boxes (training returns layer i > 0's from the undetached
    # reference: the same values)
    keep = torch.ones(on["logits"].shape[1:3], dtype=torch.bool)
    for layer in range(2):
        keep = _by_hand(on["logits"][layer], on["boxes"][layer], keep)
        suppressed = on["logits"][layer + 1][~keep]
        assert (suppressed == SUPPRESSED_LOGIT).all()
        assert (on["logits"][layer + 1][keep] > SUPPRESSED_LOGIT).all()
    assert 0 < int((~keep).sum(1).min()) and int(keep.sum(1).min()) > 1  # some suppressed, some kept, in each image
    # a suppressed query is hidden from the kept ones' self-attention: their later outputs change
    assert not torch.allclose(on["logits"][1][keep], off["logits"][1][keep])


def test_evaluation_reports_the_suppressed_queries_at_the_suppressed_logit():
    model = _model(True)
    with torch.no_grad():
        trained = _layers(model)["logits"][-1]
        model.eval()
        evaluated = model(IMAGES)["pred_logits"]
    torch.testing.assert_close(evaluated, trained)
    assert (evaluated == SUPPRESSED_LOGIT).all(-1).any()


def test_an_earlier_evaluation_layer_is_masked_by_the_selections_before_it():
    """``eval_idx`` 1 (as the M models): the decoder stops at layer 1 and reports it with layer 0's selection."""
    kwargs = {**TINY, "decoder": {**TINY["decoder"], "eval_idx": 1}}
    model = _model(True, **kwargs)
    with torch.no_grad():
        trained = _layers(model)
        model.eval()
        evaluated = model(IMAGES)["pred_logits"]
    keep = _by_hand(trained["logits"][0], trained["boxes"][0], torch.ones(evaluated.shape[:2], dtype=torch.bool))
    assert (evaluated[~keep] == SUPPRESSED_LOGIT).all() and (evaluated[keep] > SUPPRESSED_LOGIT).all()
    torch.testing.assert_close(evaluated, trained["logits"][1])


def test_denoising_queries_are_never_selected_and_a_step_backpropagates():
    model = _model(True)
    out = model(IMAGES, None, targets=TARGETS)
    dn = [out["dn_outputs"], *out["dn_outputs"]["aux_outputs"]]
    assert all((o["pred_logits"] > SUPPRESSED_LOGIT).all() for o in dn)
    assert (out["pred_logits"] == SUPPRESSED_LOGIT).all(-1).any()
    losses = build_criterion(model, 3, {}, {})(out, TARGETS)
    assert all(torch.isfinite(v).all() for v in losses.values())
    losses["loss"].backward()
    grads = [p.grad for p in model.decoder.score_heads[-1].parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("name", ["dfine_n", "deim_dfine_n"])
def test_d_fine_and_deim_decoders_select_between_layers_too(name):
    from visiontf.models._registry import get_entry

    kwargs = dict(get_entry(name).test_kwargs)
    kwargs = {**kwargs, "decoder": {**kwargs["decoder"], "num_queries": 12}}
    kwargs.pop("num_classes", None)
    kwargs["num_select"] = 12
    model = _model(True, name, **kwargs)
    with torch.no_grad():  # D-FINE's boxes are distances from the first layer's: widen those
        model.decoder.pre_bbox_head.layers[-1].bias[2:] += 4.0
        on = _layers(model)
    keep = _by_hand(on["logits"][0], on["boxes"][0], torch.ones(on["logits"].shape[1:3], dtype=torch.bool))
    assert (~keep).any()
    assert (on["logits"][1][~keep] == SUPPRESSED_LOGIT).all() and (on["logits"][1][keep] > SUPPRESSED_LOGIT).all()
    model.eval()
    with torch.no_grad():
        assert (model(IMAGES)["pred_logits"] == SUPPRESSED_LOGIT).all(-1).any()


def test_options_refuse_the_selection_without_an_iou_or_a_flag_that_is_no_bool():
    with pytest.raises(ValueError, match="set distinct_query_iou"):
        DecoderOptions(distinct_between_layers=True)
    with pytest.raises(ValueError, match="decoder.distinct_between_layers"):
        DecoderOptions(distinct_query_iou=0.8, distinct_between_layers="yes")
    assert DecoderOptions(distinct_query_iou=0.8, distinct_between_layers=True).distinct_between_layers
