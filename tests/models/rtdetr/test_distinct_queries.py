"""RT-DETR's ``decoder.distinct_query_iou`` (DDQ DETR's distinct query selection, DINO's option of the same name):
query selection passes over a proposal that a better one overlaps, so the decoder's queries start from distinct
objects; off (None) the selection is the originals' top-k by score."""
from __future__ import annotations

import pytest
import torch
from rtdetr_helpers import one_thread  # noqa: F401 (a module fixture: one torch thread)
from torchvision.ops import box_convert, box_iou

from visiontf.models import create_model
from visiontf.models.rtdetr.rtdetr_decoder import anchor_boxes
from visiontf.models.rtdetr.rtdetr_options import DecoderOptions
from visiontf.set_prediction import build_criterion

TINY = {"encoder": {"hidden_dim": 32, "nhead": 2, "dim_feedforward": 32},
        "decoder": {"hidden_dim": 32, "nhead": 2, "dim_feedforward": 32, "num_queries": 10, "num_layers": 2},
        "denoising": {"num_denoising": 4}}


def _logit(p):
    p = torch.as_tensor(p, dtype=torch.float64)
    return torch.log(p / (1 - p))


#: five proposals (cx, cy, w, h) in score order: B nearly covers A (IoU 0.82), D nearly covers C (0.82), E overlaps none
BOXES = [[0.3, 0.3, 0.2, 0.2], [0.31, 0.31, 0.2, 0.2], [0.7, 0.7, 0.2, 0.2], [0.7, 0.72, 0.2, 0.2], [0.3, 0.75, 0.1, 0.1]]
SCORES = [0.9, 0.8, 0.7, 0.6, 0.5]
SHAPES = [(4, 4), (2, 2), (1, 1)]


class _Columns(torch.nn.Module):
    def __init__(self, start: int, stop: int) -> None:
        super().__init__()
        self.start, self.stop = start, stop

    def forward(self, x):
        return x[..., self.start:self.stop]


def _pick(iou, queries, at=(0, 1, 2, 3, 4)):
    """The proposals (by letter index) ``select`` picks when the five are at positions ``at`` of a 21-position memory
    whose features are the proposals' class logits and box deltas themselves (the heads replaced by slices)."""
    decoder = create_model("rtdetr_tiny", num_classes=3, **{**TINY, "decoder": {**TINY["decoder"], "num_queries": queries,
                                                                                "distinct_query_iou": iou}}).decoder.double()
    decoder.enc_output = torch.nn.Identity()
    decoder.enc_score_head = _Columns(0, 3)
    decoder.enc_bbox_head = _Columns(3, 7)
    anchors, valid = anchor_boxes(SHAPES, decoder.options.anchor_eps, torch.float64)
    assert bool(valid.all())
    memory = torch.zeros(1, 21, 32, dtype=torch.float64)
    memory[0, :, :3] = -12.0  # every other position: scores far below the five, A's box (so suppressed)
    memory[0, :, 3:7] = _logit([BOXES[0]]) - anchors[0]
    for letter, position in enumerate(at):
        memory[0, position, letter % 3] = _logit(SCORES[letter])
        memory[0, position, 3:7] = _logit(BOXES[letter]) - anchors[0, position]
    selected = decoder.select(memory, SHAPES)
    picked = [[round(v, 4) for v in box] for box in selected["boxes"][0].tolist()]
    return [BOXES.index(box) for box in picked]


def test_overlapped_proposals_are_passed_over_then_fill_the_places_left():
    assert _pick(None, 3) == [0, 1, 2]  # the originals' top-k by score: A and its near-copy B
    assert _pick(0.5, 3) == [0, 2, 4]  # A, C, E: B and D overlap a better one
    assert _pick(0.5, 4) == [0, 2, 4, 1]  # a place left: the best suppressed one
    assert _pick(0.9, 3) == [0, 1, 2]  # no pair overlaps by 0.9: the plain top-k
    # the five at other positions of the memory (other levels): the same choice, by proposal
    assert _pick(0.5, 3, at=(20, 17, 3, 9, 0)) == [0, 2, 4]


def _selected_boxes(iou) -> torch.Tensor:
    """(2, 10, 4) the proposals ``select`` picks for two random images, in eval mode (random weights, the proposal box
    head moved off its zero init so boxes differ from position to position)."""
    torch.manual_seed(0)
    model = create_model("rtdetr_tiny", num_classes=3, **{**TINY, "decoder": {**TINY["decoder"], "distinct_query_iou": iou}}).eval()
    seen = []
    select = model.decoder.select
    model.decoder.select = lambda *a: seen.append(select(*a)) or seen[-1]
    with torch.no_grad():
        for p in model.decoder.enc_bbox_head.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
        model(torch.randn(2, 3, 96, 128, generator=torch.Generator().manual_seed(2)))
    return seen[0]["boxes"]


def _worst_overlap_of_the_first(boxes: torch.Tensor, count: int) -> float:
    """The largest IoU between two of each image's first ``count`` selected proposals."""
    worst = 0.0
    for image in boxes:
        xyxy = box_convert(image[:count], "cxcywh", "xyxy")
        worst = max(worst, float(box_iou(xyxy, xyxy).triu(1).max()))
    return worst


def test_selected_queries_overlap_less_with_the_option_on_real_encoder_outputs():
    """The first 4 of 10 queries are kept proposals with the option (252 positions leave enough that NMS at 0.5
    keeps), so no two overlap by more than 0.5; the originals' top 4 by score do."""
    assert _worst_overlap_of_the_first(_selected_boxes(0.5), 4) <= 0.5 + 1e-5
    assert _worst_overlap_of_the_first(_selected_boxes(None), 4) > 0.5


def test_options_refuse_an_iou_outside_0_1():
    for bad in (0, 1.5, -0.1, True, "0.5"):
        with pytest.raises(ValueError, match="decoder.distinct_query_iou"):
            DecoderOptions(distinct_query_iou=bad)
    assert DecoderOptions(distinct_query_iou=1).distinct_query_iou == 1


def test_training_step_runs_and_backpropagates_with_the_option():
    model = create_model("rtdetr_tiny", num_classes=3, **{**TINY, "decoder": {**TINY["decoder"], "distinct_query_iou": 0.7}}).train()
    images = torch.randn(2, 3, 96, 128)
    targets = [{"labels": torch.tensor([0]), "boxes": torch.tensor([[0.4, 0.4, 0.3, 0.3]])}] * 2
    out = model(images, torch.zeros(2, 96, 128, dtype=torch.bool), targets=targets)
    losses = build_criterion(model, 3, {}, {})(out, targets)
    assert "loss_ce_interm" in losses  # the selected proposals are supervised as without the option
    losses["loss"].backward()
    assert model.decoder.enc_score_head.weight.grad is not None
    assert torch.isfinite(model.decoder.enc_score_head.weight.grad).all()


@pytest.mark.parametrize("name", ["dfine_n", "deim_dfine_n"])
def test_d_fine_and_deim_decoders_take_the_option(name):
    """D-FINE's and DEIM's decoders inherit the selection: the option builds, validates and changes the selection."""
    from visiontf.models._registry import get_entry

    kwargs = dict(get_entry(name).test_kwargs)
    picked = {}
    for iou in (None, 0.3):
        torch.manual_seed(0)
        model = create_model(name, **{**kwargs, "decoder": {**kwargs["decoder"], "num_queries": 10, "distinct_query_iou": iou}}).eval()
        assert model.decoder.options.distinct_query_iou == iou
        seen = []
        select = model.decoder.select
        model.decoder.select = lambda *a, select=select, seen=seen: seen.append(select(*a)) or seen[-1]
        with torch.no_grad():
            for p in model.decoder.enc_bbox_head.parameters():
                p.add_(0.3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
            model(torch.randn(1, 3, 96, 128, generator=torch.Generator().manual_seed(2)))
        picked[iou] = seen[0]["boxes"][0]
    assert _worst_overlap_of_the_first(picked[0.3][None], 4) <= 0.3 + 1e-5
    assert not torch.equal(picked[0.3], picked[None])
