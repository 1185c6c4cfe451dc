"""Relation-DETR's position relation in the deformable decoder (``position_relation=True``).

The relation's formula against hand-computed values; the bias it adds: none in the first layer,
nothing at all when its projection is zero, the denoising and Group DETR masks kept; gradients;
the refusal. Toy sizes of tests/dino_helpers.py. Cost: a few seconds.
"""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from dino_helpers import DINO, toy, toy_batch

from visiontf.models.deformable_detr.build import build_deformable_detr
from visiontf.models.deformable_detr.deformable_detr import DeformableDETR
from visiontf.nn.position_relation import PositionRelationEmbedding, box_relation

THREE_LAYERS = {"arch": {"dec_layers": 3}}  # two layers after the first: the option acts from the second on


def _model(*parts: dict, seed: int = 0, **sections) -> DeformableDETR:
    torch.manual_seed(seed)
    return build_deformable_detr(DeformableDETR, **toy(THREE_LAYERS, *parts, **sections))



def _all_layers(out: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(layers, B, Q, K) logits and (layers, B, Q, 4) boxes, the last layer last."""
    layers = out["aux_outputs"] + [out]
    return torch.stack([o["pred_logits"] for o in layers]), torch.stack([o["pred_boxes"] for o in layers])


def test_box_relation_is_the_papers_formula():
    src = torch.tensor([[[0.5, 0.5, 0.2, 0.4], [0.1, 0.2, 0.1, 0.1]]])
    tgt = torch.tensor([[[0.6, 0.3, 0.1, 0.2]]])
    rel = box_relation(src, tgt, eps=0.0)
    assert rel.shape == (1, 2, 1, 4)
    expected = [[math.log(1 + 0.1 / 0.2), math.log(1 + 0.2 / 0.4), math.log(2.0), math.log(2.0)],
                [math.log(1 + 0.5 / 0.1), math.log(1 + 0.1 / 0.1), math.log(1.0), math.log(0.5)]]
    torch.testing.assert_close(rel[0, :, 0], torch.tensor(expected), rtol=1e-5, atol=1e-6)
    assert box_relation(src, src).diagonal(dim1=1, dim2=2).abs().max() < 1e-4  # a box with itself: 0


def test_bias_is_non_negative_per_head_and_sends_no_gradient_to_the_boxes():
    torch.manual_seed(0)
    relation = PositionRelationEmbedding(num_heads=3)
    src = torch.rand(2, 5, 4, requires_grad=True)
    tgt = torch.rand(2, 7, 4, requires_grad=True)
    bias = relation(src, tgt)
    assert bias.shape == (2, 3, 5, 7) and (bias >= 0).all() and (bias > 0).any()
    bias.sum().backward()
    assert src.grad is None and tgt.grad is None
    assert relation.proj.weight.grad.abs().sum() > 0


def test_first_layer_is_unchanged_and_a_zero_projection_changes_nothing():
    images, mask, _ = toy_batch()
    plain = _model(DINO).eval()
    for head in plain.bbox_embed:  # zero-initialised: boxes would equal the anchors whatever the attention
        torch.nn.init.normal_(head.layers[-1].weight, std=0.1)
    related = _model(DINO, dino={"position_relation": True}).eval()
    missing, unexpected = related.load_state_dict(plain.state_dict(), strict=False)
    assert missing == ["transformer.decoder.position_relation.proj.weight", "transformer.decoder.position_relation.proj.bias"]
    assert not unexpected
    with torch.no_grad():
        base = _all_layers(plain(images, mask))
        torch.nn.init.normal_(related.transformer.decoder.position_relation.proj.weight, std=1.0)
        biased = _all_layers(related(images, mask))
        torch.nn.init.zeros_(related.transformer.decoder.position_relation.proj.weight)
        torch.nn.init.zeros_(related.transformer.decoder.position_relation.proj.bias)
        zero = _all_layers(related(images, mask))
    for b, r, z in zip(base, biased, zero):
        torch.testing.assert_close(r[0], b[0], rtol=1e-5, atol=1e-5)  # layer 1 attends without a relation
        assert not torch.allclose(r[1:], b[1:], atol=1e-4)  # the later layers use it
        torch.testing.assert_close(z, b, rtol=1e-5, atol=1e-5)


def test_matching_queries_still_never_see_the_denoising_queries():
    images, mask, targets = toy_batch()
    model = _model(DINO, dino={"position_relation": True}).train()
    torch.nn.init.normal_(model.transformer.decoder.position_relation.proj.bias, 1.0, 1.0)
    with torch.no_grad():
        with_dn = model(images, mask, targets=targets)
        without = model(images, mask)
    assert with_dn["dn_meta"].pad_size > 0
    torch.testing.assert_close(_all_layers(with_dn), _all_layers(without), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("num_denoising", [0, 6], ids=["groups_folded", "groups_masked"])
def test_query_groups_stay_independent(num_denoising):
    images, mask, targets = toy_batch()
    model = _model(DINO, dino={"num_denoising": num_denoising, "position_relation": True, "num_query_groups": 3}).train()
    torch.nn.init.normal_(model.transformer.decoder.position_relation.proj.bias, 1.0, 1.0)
    with torch.no_grad():
        grouped = model(images, mask, targets=targets)
        model.dino_options = dataclasses.replace(model.dino_options, num_query_groups=1)
        single = model(images, mask, targets=targets)
    logits, boxes = _all_layers(grouped)
    single_logits, single_boxes = _all_layers(single)
    torch.testing.assert_close(logits[:, :, :8], single_logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(boxes[:, :, :8], single_boxes, rtol=1e-5, atol=1e-5)


def test_the_projection_learns_from_the_detection_losses():
    images, mask, targets = toy_batch()
    model = _model(DINO, dino={"position_relation": True}).train()
    out = model(images, mask, targets=targets)
    out["pred_logits"].sigmoid().sum().backward()
    assert model.transformer.decoder.position_relation.proj.weight.grad.abs().sum() > 0


def test_refused_without_two_stage_boxes():
    with pytest.raises(ValueError, match="position_relation=True .* needs two_stage=True"):
        _model(arch={"with_box_refine": True}, dino={"position_relation": True})
