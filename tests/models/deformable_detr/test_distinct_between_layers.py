"""DDQ DETR's distinct query selection between decoder layers (``distinct_between_layers=True``).

The selection against torchvision's NMS by hand, cumulative, per group, denoising queries untouched;
the masks it returns; the suppressed queries' logits in every later layer and their gradient; the
same matching outputs with and without denoising queries in front; the refusals. Toy sizes of
tests/dino_helpers.py. Cost: a few seconds.
"""
from __future__ import annotations

import pytest
import torch
from dino_helpers import DINO as DINO_OPTIONS
from dino_helpers import toy, toy_batch
from torchvision.ops import box_convert, nms

from visiontf.models.deformable_detr.build import build_deformable_detr, merge_sections
from visiontf.models.deformable_detr.deformable_detr import DeformableDETR
from visiontf.models.deformable_detr.distinct_queries import SUPPRESSED_LOGIT, DistinctQueriesBetweenLayers
from visiontf.nn.attention import restrict_attn_mask

THREE_LAYERS = {"arch": {"dec_layers": 3}}  # two layers after the first: the option acts from the second on
DINO = merge_sections(DINO_OPTIONS, {"dino": {"distinct_query_iou": 0.8}})
#: at 0.5 the toy's large boxes (see _model) overlap enough for the selection to suppress some in every image
DDQ = merge_sections(DINO, {"dino": {"distinct_query_iou": 0.5, "distinct_between_layers": True}})


def _model(*parts: dict, seed: int = 0, **sections) -> DeformableDETR:
    torch.manual_seed(seed)
    model = build_deformable_detr(DeformableDETR, **toy(THREE_LAYERS, *parts, **sections))
    with torch.no_grad():  # the decoder's boxes grow to nearly the whole image: many overlap
        list(model.bbox_embed[0].parameters())[-1][2:] = 6.0
    return model



def _boxes(*xyxy) -> torch.Tensor:
    return box_convert(torch.tensor(xyxy, dtype=torch.float32), "xyxy", "cxcywh")


def test_selection_is_a_cumulative_nms_per_group_that_leaves_denoising_queries_alone():
    # one image, 1 denoising query in front, 2 groups of 3 matching queries
    scores = iter([torch.tensor([[0.9, 0.8, 0.1, 0.7, 0.6, 0.5]]), torch.tensor([[0.9, 0.8, 0.1, 0.7, 0.6, 0.9]])])
    select = DistinctQueriesBetweenLayers(lambda i, hidden: next(scores), iou=0.8, num_denoising=1, num_groups=2)
    near = [0.0, 0.0, 0.5, 0.5]
    boxes = _boxes([0.0, 0.0, 0.5, 0.5],  # the denoising query, on the same object: never selected
                   near, [0.0, 0.0, 0.5, 0.49], [0.5, 0.5, 1, 1],  # group 1: query 1 duplicates query 0
                   near, [0.5, 0.5, 1, 1], [0.5, 0.5, 1, 0.99])[None]  # group 2: its own duplicate pair
    hidden = torch.zeros(1, 7, 4)
    allowed = select(0, hidden, boxes, None)
    torch.testing.assert_close(select.keeps[0], torch.tensor([[True, False, True, True, True, False]]))
    assert allowed.shape == (1, 1, 1, 7)
    assert allowed[0, 0, 0].tolist() == [True, True, False, True, True, True, False]
    # the next layer: query 5 now scores best in group 2 but stays suppressed; nothing overlaps anymore
    spread = _boxes([0.0, 0.0, 0.5, 0.5], [0.0, 0.0, 0.3, 0.3], [0.6, 0.0, 1, 0.3], [0.0, 0.6, 0.3, 1],
                    [0.0, 0.0, 0.3, 0.3], [0.6, 0.0, 1, 0.3], [0.6, 0.6, 1, 1])[None]
    select(1, hidden, spread, None)
    torch.testing.assert_close(select.keeps[1], select.keeps[0])


def test_folded_groups_get_one_mask_per_image_and_group():
    scores = torch.tensor([[0.9, 0.8, 0.3, 0.2], [0.1, 0.2, 0.3, 0.4]])
    select = DistinctQueriesBetweenLayers(lambda i, hidden: scores, iou=0.8, num_groups=2, folded=True)
    same = [0.1, 0.1, 0.6, 0.6]
    boxes = _boxes(same, same, same, same).expand(2, 4, 4)
    allowed = select(0, torch.zeros(2, 4, 4), boxes, None)
    assert allowed.shape == (4, 1, 1, 2)  # (B * G, 1, 1, Q / G): broadcast over heads and rows
    assert allowed.flatten().tolist() == [True, False, True, False, False, True, False, True]


def test_restrict_attn_mask_blocks_what_either_blocks():
    allowed = torch.tensor([True, False, True])
    assert restrict_attn_mask(None, allowed) is allowed
    base = torch.tensor([[True, True, False]] * 3)
    assert restrict_attn_mask(base, allowed).tolist() == [[True, False, False]] * 3
    bias = torch.ones(3, 3)
    out = restrict_attn_mask(bias, allowed)
    assert torch.isinf(out[:, 1]).all() and (out[:, [0, 2]] == 1).all()


def test_the_model_selects_by_hand_computed_nms_and_silences_the_suppressed():
    images, mask, _ = toy_batch()
    model = _model(DDQ).eval()
    with torch.no_grad():
        out = model(images, mask)
    layers = [*out["aux_outputs"], out]
    suppressed_in = [(o["pred_logits"] == SUPPRESSED_LOGIT).all(-1) for o in layers]
    assert not suppressed_in[0].any()  # the first layer sees every query
    for b in range(2):
        keep = torch.arange(8)
        for i in range(2):  # after layers 1 and 2, among the queries still kept
            scores = layers[i]["pred_logits"][b, keep].sigmoid().amax(-1)
            keep = keep[nms(box_convert(layers[i]["pred_boxes"][b, keep], "cxcywh", "xyxy"), scores, 0.5)]
            expected = torch.ones(8, dtype=torch.bool).index_fill(0, keep, False)
            assert suppressed_in[i + 1][b].tolist() == expected.tolist()
        assert 0 < len(keep) < 8  # the toy's boxes overlap: the selection has work to do
    assert (out["pred_logits"] > SUPPRESSED_LOGIT).any()


def test_suppressed_logits_take_no_gradient_and_the_kept_ones_do():
    images, mask, targets = toy_batch()
    model = _model(DDQ).train()
    out = model(images, mask, targets=targets)
    logits = out["pred_logits"]
    logits.retain_grad()
    (logits.float().sigmoid() * torch.rand_like(logits.float())).sum().backward()
    silent = (logits == SUPPRESSED_LOGIT).all(-1)
    assert silent.any() and (~silent).any()
    assert (logits.grad[silent] == 0).all() and (logits.grad[~silent] != 0).any()


def test_matching_outputs_are_the_same_with_and_without_denoising_queries():
    """The masked selection (denoising queries in front) equals the folded one (none)."""
    images, mask, targets = toy_batch()
    model = _model(DDQ).train()
    with torch.no_grad():
        with_dn = model(images, mask, targets=targets)
        without = model(images, mask)
    assert with_dn["dn_meta"].pad_size > 0
    assert (without["pred_logits"] == SUPPRESSED_LOGIT).all(-1).any()
    for a, b in zip([*with_dn["aux_outputs"], with_dn], [*without["aux_outputs"], without]):
        torch.testing.assert_close(a["pred_logits"], b["pred_logits"], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(a["pred_boxes"], b["pred_boxes"], rtol=1e-5, atol=1e-5)


def test_refused_without_distinct_query_iou():
    with pytest.raises(ValueError, match="distinct_between_layers=True .* needs distinct_query_iou"):
        _model(DINO, dino={"distinct_query_iou": None, "distinct_between_layers": True})
