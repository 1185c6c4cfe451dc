"""The DINO-line training options of Deformable DETR: denoising queries, mixed query
selection, look forward twice, Group DETR, shared heads; the registered DINO models; bad input.

Toy sizes (ResNet-18 trunk at 64x96, d 32, 8 queries) throughout. Cost: about 15 s.
"""
from __future__ import annotations

import dataclasses
import logging

import pytest
import torch
from dino_helpers import DINO, toy
from dino_helpers import toy_batch as _inputs

import visiontf.models.deformable_detr.denoising as dn
from visiontf.models import create_model, list_models
from visiontf.models.deformable_detr.build import build_deformable_detr
from visiontf.models.deformable_detr.deformable_detr import DeformableDETR
from visiontf.models.deformable_detr.denoising import build_contrastive_denoising, denoising_attn_mask
from visiontf.models.deformable_detr.queries import self_attn_mask
from visiontf.set_prediction import build_postprocess


def _model(*parts: dict, seed: int = 0, **sections) -> DeformableDETR:
    torch.manual_seed(seed)
    return build_deformable_detr(DeformableDETR, **toy(*parts, **sections))


def _empty(n: int = 2):
    return [{"labels": torch.zeros(0, dtype=torch.int64), "boxes": torch.zeros(0, 4)} for _ in range(n)]


def test_training_outputs_and_single_group_inference():
    images, mask, targets = _inputs()
    model = _model(DINO, dino={"num_query_groups": 3}).train()
    out = model(images, mask, targets=targets)
    assert out["pred_logits"].shape == (2, 3 * 8, 5) and out["num_query_groups"] == 3
    assert out["interm_outputs"]["pred_boxes"].shape == (2, 8, 4) and out["interm_outputs"]["pred_logits"].shape == (2, 8, 5)
    meta = out["dn_meta"]
    assert meta.num_groups == 6 // 2 and meta.pad_size == 2 * 2 * 3  # n_max 2, 3 groups of positives + negatives
    assert out["dn_outputs"]["pred_logits"].shape == (2, meta.pad_size, 5)
    assert len(out["dn_outputs"]["aux_outputs"]) == len(out["aux_outputs"]) == 1
    model.eval()
    with torch.no_grad():
        ev = model(images, mask, targets=targets)  # eval: no denoising, one group
    assert ev["pred_logits"].shape == (2, 8, 5)
    assert not {"dn_outputs", "dn_meta", "num_query_groups"} & set(ev)


def test_matching_queries_never_see_the_denoising_queries():
    """DINO's mask: the matching outputs are the same with and without denoising queries in front."""
    images, mask, targets = _inputs()
    model = _model(DINO)
    model.train()
    with torch.no_grad():
        with_dn = model(images, mask, targets=targets)
        without = model(images, mask)
    assert with_dn["dn_meta"].pad_size > 0
    torch.testing.assert_close(with_dn["pred_logits"], without["pred_logits"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(with_dn["pred_boxes"], without["pred_boxes"], rtol=1e-5, atol=1e-5)


def test_self_attention_mask():
    # one matching group: the complement of the denoising module's mask (True there = blocked)
    allowed = self_attn_mask(12, 4, 5, 1)
    torch.testing.assert_close(allowed, ~denoising_attn_mask(12, 4, 5))
    # two matching groups: each sees itself only; denoising queries see both
    allowed = self_attn_mask(4, 4, 6, 2)
    assert allowed[:4].all()
    assert allowed[4:7, 4:7].all() and not allowed[4:7, 7:].any() and not allowed[4:, :4].any()
    # no denoising: block-diagonal groups
    allowed = self_attn_mask(0, 0, 4, 2)
    assert torch.equal(allowed, torch.block_diag(torch.ones(2, 2), torch.ones(2, 2)).bool())


def test_groups_are_independent_and_the_first_is_the_inference_set():
    """Group DETR: group 0 of a 3-group training forward equals the 1-group forward of the same weights."""
    images, mask, _ = _inputs()
    for parts in (({"arch": {"with_box_refine": True}},), (DINO, {"dino": {"num_denoising": 0}})):
        model = _model(*parts, dino={"num_query_groups": 3}).train()
        with torch.no_grad():
            grouped = model(images, mask)
            model.dino_options = dataclasses.replace(model.dino_options, num_query_groups=1)
            single = model(images, mask)
        torch.testing.assert_close(grouped["pred_logits"][:, :8], single["pred_logits"], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(grouped["pred_boxes"][:, :8], single["pred_boxes"], rtol=1e-5, atol=1e-5)
        assert not torch.allclose(grouped["pred_logits"][:, 8:16], single["pred_logits"])  # own queries per group


def test_mixed_query_selection_takes_the_best_proposals_as_anchors():
    images, mask, _ = _inputs()
    model = _model(DINO).eval()
    with torch.no_grad():
        enc = model.encode(images, mask)
        q = model.initial_queries(enc)
        features, proposals = model.transformer.proposals(enc.memory, enc.padding_mask, enc.layout, enc.valid_counts)
        scores = model.class_embed[-1](features).amax(-1).masked_fill(torch.isinf(proposals).any(-1), float("-inf"))
        boxes = (model.bbox_embed[-1](features) + proposals).sigmoid()
    top = scores.topk(8, dim=1).indices
    expected = torch.gather(boxes, 1, top[..., None].expand(-1, -1, 4))
    torch.testing.assert_close(q["reference"], expected)
    torch.testing.assert_close(q["interm_outputs"]["pred_boxes"], expected)
    assert q["query_pos"] is None  # positions come from each layer's anchors (ref_point_head)
    torch.testing.assert_close(q["tgt"][0], model.tgt_embed.weight)  # content queries are learned
    assert torch.isfinite(q["reference"]).all() and not (q["reference"] == 1).all(-1).any()  # no padded position chosen


def test_look_forward_twice_sends_the_box_loss_of_a_layer_to_the_previous_one():
    images, mask, _ = _inputs()
    for lft in (False, True):
        model = _model(DINO, dino={"num_denoising": 0, "look_forward_twice": lft, "share_decoder_heads": False}).train()
        for head in model.bbox_embed:  # zero-initialised last layers would pass no gradient back
            torch.nn.init.normal_(head.layers[-1].weight, std=0.1)
        out = model(images, mask)
        out["pred_boxes"].sum().backward()  # the last layer's boxes only
        # layer 0's box head reaches the last boxes only through the reference, detached unless LFT
        first_head = model.bbox_embed[0].layers[0].weight.grad
        if lft:
            assert first_head.abs().sum() > 0
        else:
            assert first_head is None or first_head.abs().sum() == 0
        # the forward values are the same either way: only the gradient path differs
        if not lft:
            reference = out["pred_boxes"].detach()
        else:
            torch.testing.assert_close(out["pred_boxes"].detach(), reference)


def test_every_parameter_gets_a_gradient_also_for_a_batch_without_boxes():
    """DDP without find_unused_parameters: every option's parameters take part in every training step."""
    from visiontf.set_prediction.set_loss import build_criterion

    images, mask, targets = _inputs()
    model = _model(DINO, dino={"num_query_groups": 2}).train()
    criterion = build_criterion(model, 5, criterion_kwargs={"class_loss": "vfl"})
    for batch_targets in (targets, _empty()):
        model.zero_grad()
        out = model(images, mask, targets=batch_targets)
        terms = criterion(out, batch_targets)
        assert torch.isfinite(terms["loss"])
        terms["loss"].backward()
        missing = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
        assert not missing, missing
    assert float(terms["loss_ce_dn"]) == 0 and out["dn_meta"].pad_size == 0  # all-empty batch: no denoising queries


def test_more_boxes_than_denoising_slots_shrink_to_one_group_logged_once(caplog, monkeypatch):
    monkeypatch.setattr(dn, "_logged_oversize", False)
    images, mask, _ = _inputs()
    crowded = [{"labels": torch.arange(5) % 5, "boxes": torch.rand(5, 4) * 0.3 + 0.3}, _empty(1)[0]]
    model = _model(DINO, dino={"num_denoising": 3}).train()
    with caplog.at_level(logging.WARNING, logger="visiontf.models.deformable_detr.denoising"):
        for _ in range(2):
            out = model(images, mask, targets=crowded)
    assert out["dn_meta"].num_groups == 1 and out["dn_meta"].pad_size == 10
    assert sum("more than num_denoising" in r.getMessage() for r in caplog.records) == 1


def test_distinct_query_selection_takes_the_best_proposals_that_nms_keeps():
    from torchvision.ops import box_convert, box_iou, nms

    images, mask, _ = _inputs()

    def large_proposals(model):  # proposals of a quarter of the image overlap: NMS has work to do
        with torch.no_grad():
            list(model.bbox_embed[-1].parameters())[-1][2:] = 2.5
        return model.eval()

    model = large_proposals(_model(DINO, dino={"distinct_query_iou": 0.5}))
    with torch.no_grad():
        enc = model.encode(images, mask)
        q = model.initial_queries(enc)
        features, proposals = model.transformer.proposals(enc.memory, enc.padding_mask, enc.layout, enc.valid_counts)
        scores = model.class_embed[-1](features).amax(-1).masked_fill(torch.isinf(proposals).any(-1), float("-inf"))
        boxes = (model.bbox_embed[-1](features) + proposals).sigmoid()
    for b in range(2):
        valid = torch.isfinite(scores[b]).nonzero().squeeze(1)
        xyxy = box_convert(boxes[b, valid], "cxcywh", "xyxy")
        keep = valid[nms(xyxy, scores[b, valid], 0.5)]  # sorted by score, as the selection must be
        assert len(keep) >= 8
        torch.testing.assert_close(q["reference"][b], boxes[b, keep[:8]])
        chosen = box_convert(q["reference"][b], "cxcywh", "xyxy")
        assert (torch.triu(box_iou(chosen, chosen), diagonal=1) <= 0.5).all()  # no two anchors on one object
    plain = large_proposals(_model(DINO))
    with torch.no_grad():
        ref = box_convert(plain.initial_queries(plain.encode(images, mask))["reference"][0], "cxcywh", "xyxy")
    assert torch.triu(box_iou(ref, ref), diagonal=1).max() > 0.5  # the option changes the choice on these proposals


def test_bad_option_combinations_are_refused():
    with pytest.raises(ValueError, match="needs mixed_query_selection=True"):
        _model(arch={"with_box_refine": True, "two_stage": True}, dino={"distinct_query_iou": 0.8})
    with pytest.raises(ValueError, match=r"distinct_query_iou must be in \(0, 1\]"):
        _model(DINO, dino={"distinct_query_iou": 0.0})
    with pytest.raises(ValueError, match="larger than num_queries"):
        _model(dino={"num_query_groups": 9})
    with pytest.raises(ValueError, match="num_query_groups must be >= 1"):
        _model(dino={"num_query_groups": 0})
    with pytest.raises(ValueError, match="needs two_stage=True"):
        _model(arch={"with_box_refine": True}, dino={"mixed_query_selection": True})
    with pytest.raises(ValueError, match="needs with_box_refine=True"):
        _model(dino={"look_forward_twice": True})
    with pytest.raises(ValueError, match="4-d anchors"):
        _model(arch={"with_box_refine": True}, dino={"num_denoising": 10})
    with pytest.raises(ValueError, match="same queries"):
        _model(arch={"with_box_refine": True, "two_stage": True}, dino={"num_query_groups": 2})
    with pytest.raises(ValueError, match=r"dn_label_noise_ratio must be in \[0, 1\]"):
        _model(dino={"dn_label_noise_ratio": 1.5})
    with pytest.raises(ValueError, match="dn_box_noise_scale must be >= 0"):
        _model(dino={"dn_box_noise_scale": -0.1})
    # the decoder itself refuses a group count that does not divide its queries
    model = _model(arch={"with_box_refine": True}).eval()
    images, mask, _ = _inputs()
    with torch.no_grad():
        enc = model.encode(images, mask)
        with pytest.raises(ValueError, match="must divide the number of queries"):
            model.decode(model.initial_queries(enc), enc, num_groups=3)


def test_pure_two_stage_with_denoising_runs():
    images, mask, targets = _inputs()
    model = _model(arch={"with_box_refine": True, "two_stage": True}, dino={"num_denoising": 4}).train()
    out = model(images, mask, targets=targets)
    assert out["dn_outputs"]["pred_boxes"].shape[1] == out["dn_meta"].pad_size > 0 and "enc_outputs" in out


def test_registered_dino_models():
    assert {"dino_resnet50_4scale", "dino_tiny"} <= set(list_models("dino_*"))
    with torch.device("meta"):
        model = create_model("dino_resnet50_4scale")
    arch = model.arch_options
    assert (arch.num_queries, model.dino_options.num_denoising, arch.num_feature_levels, arch.hidden_dim) == (900, 100, 4, 256)
    assert model.transformer.encoder.layers[0].mlp.fc1.out_features == 2048
    options = model.dino_options
    assert options.mixed_query_selection and options.look_forward_twice and options.share_decoder_heads
    assert model.position_embedding.temperature == 20 and len(model.class_embed) == 2  # shared decoder head + proposals
    assert build_postprocess(model).num_top == 300
    assert model.label_enc.num_embeddings == 92 and model.tgt_embed.num_embeddings == 900
    assert not hasattr(model.transformer, "pos_trans")
    # the faithful models keep every option off
    with torch.device("meta"):
        plain = create_model("deformable_detr_resnet50_two_stage")
    options = plain.dino_options
    assert not (options.mixed_query_selection or options.look_forward_twice or options.num_denoising or options.share_decoder_heads)
    assert options.num_query_groups == 1 and build_postprocess(plain).num_top == 100


def test_denoising_builder_runs_on_the_targets_device_without_cuda():
    _, _, targets = _inputs()
    q = build_contrastive_denoising(targets, 5, 8, num_denoising=4)
    assert q.labels.device.type == "cpu" and q.attn_mask.shape == (q.meta.pad_size + 8,) * 2


def test_dino_r50_has_the_original_parameter_count():
    """IDEA-Research/DINO's DINO-4scale R50 with 91 classes has 46,893,182 parameters (its build_dino on the
    meta device, CUDA op stubbed); the decoder's output norm is the last 512 of them."""
    with torch.device("meta"):
        model = create_model("dino_resnet50_4scale", num_classes=91)
    assert sum(p.numel() for p in model.parameters()) == 46_893_182


def test_decoder_norm_predicts_from_normalised_outputs():
    images, mask, _ = _inputs()
    model = _model(DINO, dino={"num_denoising": 0}, arch={"decoder_norm": True}).eval()
    with torch.no_grad():
        torch.nn.init.normal_(model.bbox_embed[0].layers[-1].weight, std=0.1)  # zero at init: no deltas
        torch.nn.init.normal_(model.decoder_norm.bias, std=0.5)  # at init it repeats the layers' own final norm
        enc = model.encode(images, mask)
        dec = model.decode(model.initial_queries(enc), enc)
        logits, boxes = model.predict(dec)
        normed = model.decoder_norm(dec["hidden"])
    torch.testing.assert_close(logits, model.class_embed[0](normed))
    assert not torch.allclose(boxes[-1], dec["new_references"][-1])  # DINO: predictions differ from the next reference


@pytest.mark.parametrize("method", ["gather", "grid_sample"])
def test_training_after_a_prediction_in_inference_mode(method):
    """The level layouts are cached per image size: a first forward under torch.inference_mode (a
    prediction, a validation) must not cache inference tensors that a later training step refuses."""
    model = _model(DINO)
    model.set_attn_method(method)
    images = torch.randn(1, 3, 72, 104)  # a size no other test uses, so the caches start empty
    with torch.inference_mode():
        model.eval()(images)
    model.train()
    out = model(images, targets=[{"labels": torch.tensor([1]), "boxes": torch.tensor([[0.5, 0.5, 0.3, 0.3]])}])
    out["pred_boxes"].sum().backward()
    assert model.input_proj[0][0].weight.grad is not None


def test_distinct_ranking_keeps_the_order_of_saturated_scores():
    """Scores whose sigmoid is 1.0 in float32 keep their order (an exported graph must pick the same anchors)."""
    from visiontf.models.deformable_detr.queries import distinct_first

    scores = torch.tensor([[20.0, 30.0, 25.0, float("-inf"), 29.0]])
    far_apart = torch.tensor([[[-3.0, -3.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0], [3.0, 3.0, 0.0, 0.0],
                               [0.0, 0.0, 0.0, 0.0], [0.05, 0.0, 0.0, 0.0]]])  # the last overlaps the second
    ranked = distinct_first(scores, far_apart, 0.5)
    assert ranked.topk(3).indices.tolist() == [[1, 2, 0]]  # 29.0 is suppressed by 30.0
    assert ranked[0, 3] == float("-inf")


@pytest.mark.parametrize("spread", [0.5, 0.05])
def test_distinct_ranking_of_the_best_candidates_picks_what_the_nms_over_all_picks(spread):
    """With ``count`` the NMS runs over each image's best 4 * count proposals first: the first ``count`` of the ranking
    are those of the NMS over all, in the same order, whether an image keeps enough of its candidates (spread-out
    boxes) or too few (boxes crowded on a few spots: it then runs over all)."""
    from visiontf.models.deformable_detr import queries
    from visiontf.models.deformable_detr.queries import distinct_first

    g = torch.Generator().manual_seed(0)
    B, S, count = 3, 600, 20
    scores = torch.randn(B, S, generator=g)
    scores[1, :37] = float("-inf")  # border positions of one image
    centres = torch.rand(B, S, 2, generator=g) * spread + (1 - spread) / 2
    boxes = torch.cat([centres, torch.full((B, S, 2), 0.15) + 0.05 * torch.rand(B, S, 2, generator=g)], -1).logit()
    full = distinct_first(scores, boxes, 0.5)
    calls = []
    nms_of = queries._kept
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(queries, "_kept", lambda s, *a: calls.append(s.shape[1]) or nms_of(s, *a))
        fast = distinct_first(scores, boxes, 0.5, count)
    assert calls[0] == 4 * count
    assert (len(calls) == 2) == (spread == 0.05)  # crowded: too few kept among the candidates, the NMS over all
    assert torch.equal(fast.topk(count).indices, full.topk(count).indices)
    assert torch.equal(fast.topk(count).values, full.topk(count).values)
    assert fast[1, :37].eq(float("-inf")).all()
