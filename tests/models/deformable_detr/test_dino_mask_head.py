"""The mask head on the DINO family (``dino_tiny_masks``): its attention maps (the original's, peak-normalised,
with the box prior); and the training forward of both mask models (DETR's and DINO's), which runs the head on
the matched queries alone and must give the loss and gradients of the head run on every query."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from handmade_data import shapes_batch as _shapes_batch

from visiontf.models import create_model
from visiontf.models.deformable_detr.build import merge_sections
from visiontf.models.deformable_detr.deformable_detr_segm import MASK_HEAD_PREFIXES, box_log_prior
from visiontf.models.detr.detr_segm import MASK_HEAD_PREFIXES as DETR_MASK_HEAD_PREFIXES
from visiontf.models.detr.mask_head import MHAttentionMap
from visiontf.models.matched_masks import MASK_LOGITS_OF
from visiontf.set_prediction import build_criterion

SMALL = dict(arch=dict(enc_layers=1, dec_layers=2, num_queries=10), postprocess=dict(num_top=10))


def _model(**kwargs):
    torch.manual_seed(0)
    return create_model("dino_tiny_masks", num_classes=2, **{**SMALL, **kwargs})


# --------------------------------------------------------------------------- attention maps
def test_peak_normalised_maps_are_each_heads_softmax_over_its_maximum():
    torch.manual_seed(0)
    attn = MHAttentionMap(16, 16, 4, peak_normalised=True)
    q, k = torch.randn(2, 3, 16), torch.randn(2, 16, 5, 6)
    pad = torch.zeros(2, 5, 6, dtype=torch.bool)
    pad[1, :, 4:] = True
    bias = torch.randn(2, 3, 5, 6)
    got = attn(q, k, mask=pad, bias=bias)
    scores = torch.einsum("bqnc,bnchw->bqnhw", attn.q_linear(q).view(2, 3, 4, 4) * 0.5,
                          attn.k_linear(k.permute(0, 2, 3, 1)).permute(0, 3, 1, 2).reshape(2, 4, 4, 5, 6))
    scores = (scores + bias[:, :, None]).masked_fill(pad[:, None, None], float("-inf"))
    want = F.softmax(scores.flatten(3), -1).view(scores.shape)
    want = want / want.flatten(3).amax(-1)[..., None, None]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert torch.allclose(got.flatten(3).amax(-1), torch.ones(2, 3, 4)) and got[1, ..., 4:].abs().max() == 0
    # the original's: one softmax over every head and position of a query
    attn.peak_normalised = False
    assert torch.allclose(attn(q, k, mask=pad).flatten(2).sum(-1), torch.ones(2, 3))


def test_box_prior_is_flat_inside_a_box_and_falls_outside_it_on_the_unpadded_grid():
    # two images on an 8 x 10 grid; the second's unpadded part is its left half (5 columns)
    boxes = torch.tensor([[[0.5, 0.5, 0.5, 0.5]], [[0.5, 0.5, 0.5, 0.5]]])
    ratios = torch.tensor([[1.0, 1.0], [0.5, 1.0]])
    prior = box_log_prior(boxes, (8, 10), ratios)
    assert prior.shape == (2, 1, 8, 10)
    # image 0: the box spans columns 2.5..7.5 and rows 2..6 of cell units; cell centres 3..6 are inside
    inside, outside = prior[0, 0, 3:5, 4:6], prior[0, 0, 0, 0]
    assert inside.min() > -1.0 and outside < -3.5
    torch.testing.assert_close(prior[0, 0], prior[0, 0].flip(0))
    torch.testing.assert_close(prior[0, 0], prior[0, 0].flip(1))
    # image 1: the same normalised box over its 5 unpadded columns sits around column 2.5, not 5
    row = prior[1, 0, 4]
    assert row.argmax() == 2 and row[2] > -1.0 and row[7] < -3.5
    assert not prior.requires_grad and not box_log_prior(boxes.requires_grad_(), (8, 10), ratios).requires_grad


def test_box_maps_make_each_query_draw_its_own_mask_where_the_originals_do_not():
    images, _ = _shapes_batch()
    spread = {}
    for maps in ("detr", "peak", "box"):
        model = _model(attention_maps=maps).eval()
        with torch.no_grad():
            masks = model(images)["pred_masks"]
        # how much the masks differ between queries, against how much they vary over the image
        spread[maps] = float(masks.std(1).mean() / masks.std((2, 3)).mean())
    # at initialisation, 8 to 12 times (seeds 0-4); the original's maps are of order 1 / (heads * h * w)
    assert spread["box"] > 5 * spread["detr"] and spread["peak"] > 5 * spread["detr"], spread


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="attention_maps"):
        _model(attention_maps="soft")
    with pytest.raises(ValueError, match="train_masks"):
        _model(train_masks="some")
    with pytest.raises(ValueError, match="train_masks"):
        create_model("detr_tiny_masks", num_classes=2, train_masks="some")


# --------------------------------------------------------------------------- matched-only training forward
def _loss_and_grads(name: str, train_masks: str, targets) -> tuple[dict, dict]:
    torch.manual_seed(0)
    if name == "dino_tiny_masks":
        model = create_model(name, num_classes=2, train_masks=train_masks, **merge_sections(SMALL, {"arch": {"dropout": 0.0}})).train()
    else:  # DETR's own head, as the original's
        model = create_model(name, num_classes=2, train_masks=train_masks, arch=dict(dropout=0.0, num_queries=10, enc_layers=1, dec_layers=2),
                             backbone={"frozen_bn": False}).train()
    images, _ = _shapes_batch()
    torch.manual_seed(1)  # the denoising queries' noise
    out = model(images, targets=targets) if model.forward_takes_targets else model(images)
    assert (MASK_LOGITS_OF in out) == (train_masks == "matched") and ("pred_masks" in out) == (train_masks == "all")
    terms = build_criterion(model, 2)(out, targets, sync_num_boxes=False)
    terms["loss"].backward()
    prefixes = MASK_HEAD_PREFIXES if name == "dino_tiny_masks" else DETR_MASK_HEAD_PREFIXES
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if n.startswith(prefixes)}
    return terms, grads


@pytest.mark.parametrize("name", ["dino_tiny_masks", "detr_tiny_masks"])
def test_masks_of_the_matched_queries_give_the_full_heads_loss_and_gradients(name):
    _, targets = _shapes_batch()
    full_terms, full_grads = _loss_and_grads(name, "all", targets)
    terms, grads = _loss_and_grads(name, "matched", targets)
    for k in ("loss_mask", "loss_dice", "loss"):
        torch.testing.assert_close(terms[k], full_terms[k], rtol=1e-5, atol=1e-6)
    assert full_terms["loss_dice"] > 0.1 and len(grads) == len(full_grads) > 20
    for key, g in full_grads.items():
        torch.testing.assert_close(grads[key], g, rtol=1e-4, atol=1e-6, msg=key)
    assert any(g.abs().max() > 0 for key, g in grads.items() if key.startswith("mask_head."))


@pytest.mark.parametrize("name", ["dino_tiny_masks", "detr_tiny_masks"])
def test_a_batch_without_objects_still_gives_every_mask_parameter_a_gradient(name):
    _, targets = _shapes_batch()
    empty = [{**t, "boxes": t["boxes"][:0], "labels": t["labels"][:0], "masks": t["masks"][:0]} for t in targets]
    terms, grads = _loss_and_grads(name, "matched", empty)
    assert terms["loss_mask"] == 0 and terms["loss_dice"] == 0
    assert grads and all(g.abs().max() == 0 for g in grads.values())


def test_the_pairs_maps_keep_the_channels_last_layout_of_the_full_heads():
    from visiontf.models.matched_masks import take_images

    x = torch.randn(3, 8, 5, 6).contiguous(memory_format=torch.channels_last)
    got = take_images(x, torch.tensor([2, 0, 2]))
    assert torch.equal(got, x[[2, 0, 2]]) and got.is_contiguous(memory_format=torch.channels_last) and not got.is_contiguous()
    plain = torch.randn(3, 8, 5, 6)
    assert take_images(plain, torch.tensor([1])).is_contiguous()


@pytest.mark.slow
def test_the_box_map_head_exports_to_onnx_with_dynamic_size(tmp_path):
    import onnx

    from visiontf.inference.export import example_inputs, export_onnx, onnx_max_abs_diff

    model = _model(attention_maps="box").eval()
    path = export_onnx(model, tmp_path / "dino_masks.onnx", image_size=(128, 128))
    assert [o.name for o in onnx.load(str(path)).graph.output] == ["pred_logits", "pred_boxes", "pred_masks"]
    # another size and batch than the export's, the second image padded: the box prior follows the valid ratios
    inputs = example_inputs(model, image_size=(160, 224), batch_size=2, pad=True)
    assert onnx_max_abs_diff(model, path, inputs) < 1e-4
