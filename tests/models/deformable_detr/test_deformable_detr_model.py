"""Deformable DETR model: registered variants, outputs, initialisation, optimiser hooks, the decoder's
DINO-ready interface, the vectorised geometry against what the original's loops computed, and bad input.

Toy sizes throughout; the R50 parameter counts are checked on the meta device against the counts of the
original's own build (``tests/fixtures/deformable_detr/r50_layouts.txt``). The geometry (valid ratios, encoder
reference points, two-stage proposals, the sine embedding) is compared with the recorded ``geometry`` fixture,
which the original's own functions wrote. Cost: about 10 s.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from deformable_helpers import VARIANT_NAMES, VARIANTS, fixture, inputs, max_diff, r50_layouts, randomize, toy

from visiontf.models import create_model, list_models
from visiontf.models.deformable_detr.build import build_deformable_detr
from visiontf.models.deformable_detr.deformable_detr import DeformableDETR
from visiontf.models.deformable_detr.deformable_transformer import (
    DeformableTransformer,
    encoder_reference_points,
    level_layout,
    refine_boxes,
    valid_counts,
)
from visiontf.nn import PositionEmbeddingSine2d
from visiontf.set_prediction import SetCriterion

#: parameters with 91 classes, as the original code builds them (REFERENCE.md: 40.07 M, 40.85 M, 41.18 M; r50_layouts.txt)
R50_PARAMETERS = {
    "deformable_detr_resnet50": 40_069_665,
    "deformable_detr_resnet50_box_refine": 40_849_660,
    "deformable_detr_resnet50_two_stage": 41_181_529,
}


def _toy(variant: str = "plain", **kw) -> DeformableDETR:
    torch.manual_seed(0)
    return build_deformable_detr(DeformableDETR, **toy(variant, **kw))


def test_registered_models_and_exact_r50_parameter_counts():
    assert set(R50_PARAMETERS) | {"deformable_detr_tiny"} <= set(list_models("deformable_detr_*"))
    assert {VARIANT_NAMES[variant]: params for variant, (params, _) in r50_layouts().items()} == R50_PARAMETERS
    for name, expected in R50_PARAMETERS.items():
        with torch.device("meta"):
            model = create_model(name)
        assert sum(p.numel() for p in model.parameters()) == expected, name
        arch = model.arch_options
        assert arch.num_queries == 300 and arch.num_feature_levels == 4 and arch.hidden_dim == 256


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_outputs(variant):
    model = _toy(variant).eval()
    images, mask = inputs(H=64, W=96)
    with torch.no_grad():
        out = model(images, mask)
    assert out["pred_logits"].shape == (2, 12, 7) and out["pred_boxes"].shape == (2, 12, 4)
    assert out["pred_boxes"].dtype == torch.float32 and 0 <= out["pred_boxes"].min() and out["pred_boxes"].max() <= 1
    assert len(out["aux_outputs"]) == 1 and out["aux_outputs"][0]["pred_boxes"].shape == (2, 12, 4)
    if variant == "two_stage":
        positions = 8 * 12 + 4 * 6 + 2 * 3 + 1 * 2  # strides 8, 16, 32, 64 of 64x96
        assert out["enc_outputs"]["pred_logits"].shape == (2, positions, 7)
    else:
        assert "enc_outputs" not in out
    # no padding: mask=None is the same as an all-False mask
    with torch.no_grad():
        a, b = model(images[:1]), model(images[:1], torch.zeros(1, 64, 96, dtype=torch.bool))
    torch.testing.assert_close(a["pred_boxes"], b["pred_boxes"])


def test_initialisation_follows_the_original():
    for variant in VARIANTS:
        model = _toy(variant)
        prior = -math.log((1 - 0.01) / 0.01)
        assert all(torch.allclose(h.bias, torch.full_like(h.bias, prior)) for h in model.class_embed)
        last = [h.layers[-1] for h in model.bbox_embed]
        assert all(l.weight.abs().max() == 0 for l in last)
        expected_hw = [0.0] * len(last) if variant == "two_stage" else [-2.0] + [0.0] * (len(last) - 1)
        assert [l.bias[2:].tolist() for l in last] == [[v, v] for v in expected_hw]
        assert len(model.class_embed) == {"plain": 1, "box_refine": 2, "two_stage": 3}[variant]
        for proj in model.input_proj:
            assert isinstance(proj[1], torch.nn.GroupNorm) and proj[1].num_groups == 32 and proj[0].bias.abs().max() == 0
    # the stride-64 level is a 3x3 stride-2 conv on C5
    conv = _toy().input_proj[3][0]
    assert conv.kernel_size == (3, 3) and conv.stride == (2, 2) and conv.in_channels == 512


def test_optimiser_hooks():
    model = _toy("two_stage")
    assert model.class_head == "sigmoid" and model.no_weight_decay() == set()
    groups = {name: model.param_group(name) for name, _ in model.named_parameters()}
    assert groups["backbone.body.layer2.0.conv1.weight"] == "backbone"
    assert groups["transformer.encoder.layers.0.self_attn.sampling_offsets.weight"] == "offsets"
    assert groups["transformer.decoder.layers.1.cross_attn.sampling_offsets.bias"] == "offsets"
    assert groups["transformer.decoder.layers.1.cross_attn.attention_weights.weight"] == "default"
    assert _toy().param_group("transformer.reference_points.weight") == "offsets"
    assert set(groups.values()) == {"backbone", "offsets", "default"}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_geometry_equals_the_original(dtype):
    """Valid ratios, encoder reference points and two-stage proposals: vectorised, equal to the original's loops' results."""
    fx = fixture("geometry")
    recorded = fx.outputs[str(dtype)[6:]]
    shapes = [tuple(s) for s in fx.meta["settings"]["spatial_shapes"]]
    masks = [fx.inputs[f"geometry.mask.{lvl}"] for lvl in range(len(shapes))]
    B = masks[0].shape[0]
    flat = torch.cat([m.flatten(1) for m in masks], 1)
    layout = level_layout(tuple(shapes), torch.device("cpu"))
    counts = valid_counts(flat, layout, B)
    ratios = counts / layout.size
    assert torch.equal(ratios, recorded["geometry.valid_ratios"])
    assert torch.equal(encoder_reference_points(layout, ratios), recorded["geometry.reference_points"])
    d = fx.meta["settings"]["d_model"]
    transformer = DeformableTransformer(d, 2, 1, 1, 2 * d, 0.0, len(shapes), 2, 2, two_stage=True).to(dtype)
    weights = {k.removeprefix("transformer."): v.to(dtype) for k, v in fx.weights.items()}
    missing, unexpected = transformer.load_state_dict(weights, strict=False)
    assert not unexpected and not [k for k in missing if k.startswith("enc_output")]
    with torch.no_grad():
        feats, props = transformer.proposals(fx.inputs["geometry.memory"].to(dtype), flat, layout, counts)
    assert torch.equal(props, recorded["geometry.proposals"])  # inf where padded or at the border, as the original
    assert props.isinf().any() and props.isfinite().any()
    assert max_diff(feats, recorded["geometry.proposal_features"]) < (1e-6 if dtype == torch.float32 else 1e-12)


def test_sine_embedding_offset_option():
    fx = fixture("geometry")
    mask = fx.inputs["position.mask"]
    features = fx.meta["settings"]["position_features"]
    detr, deformable = PositionEmbeddingSine2d(features), PositionEmbeddingSine2d(features, offset=0.5)
    assert torch.equal(deformable(mask), fx.outputs["float32"]["position.embedding"])  # the original's, bit for bit
    y = (~mask).float().cumsum(1)
    assert torch.allclose(detr(mask)[:, 0], (y / (y[:, -1:] + 1e-6) * 2 * math.pi).sin())  # DETR's, unchanged


def test_decoder_query_groups_and_mask():
    """Groups folded into the batch give each group's own decoding; a mask reaches the self-attention."""
    model = _toy("box_refine").eval()
    randomize(model)
    images, mask = inputs(H=64, W=96)
    with torch.no_grad():
        enc = model.encode(images, mask)
        q = model.initial_queries(enc)
        both = {k: torch.cat([v, v.flip(1)], 1) for k, v in q.items()}  # two groups of 12
        grouped = model.decode(both, enc, num_groups=2)
        alone = [model.decode({k: v[:, i * 12:(i + 1) * 12] for k, v in both.items()}, enc) for i in range(2)]
        for i in range(2):
            torch.testing.assert_close(grouped["hidden"][:, :, i * 12:(i + 1) * 12], alone[i]["hidden"], rtol=0, atol=1e-5)
        block = torch.ones(24, 24, dtype=torch.bool).tril()  # any mask changes the result
        assert not torch.allclose(model.decode(both, enc, self_attn_mask=block)["hidden"], model.decode(both, enc)["hidden"])
        with pytest.raises(ValueError, match="num_groups=5 must divide"):
            model.decode(both, enc, num_groups=5)
    # references: each layer's input (detached, 2-d then refined 4-d boxes) and the undetached new ones
    out = model.decode(q, enc)
    assert [r.shape[-1] for r in out["references"]] == [2, 4]
    assert not out["references"][1].requires_grad and out["new_references"][0].requires_grad
    assert torch.equal(out["references"][1], out["new_references"][0].detach())
    # look forward twice: layer 1's boxes from layer 0's undetached boxes and layer 1's delta
    lft = refine_boxes(out["new_references"][0], out["deltas"][1])
    torch.testing.assert_close(lft.detach(), out["new_references"][1].detach())
    lft.sum().backward()
    assert model.bbox_embed[0].layers[0].weight.grad is not None  # reaches layer 0's head
    # external 4-d reference boxes and queries (denoising queries will come this way)
    boxes = torch.rand(2, 5, 4)
    ext = model.decode({"tgt": torch.randn(2, 5, 64), "query_pos": torch.randn(2, 5, 64), "reference": boxes}, enc)
    assert ext["hidden"].shape == (2, 2, 5, 64) and torch.equal(ext["references"][0], boxes)


def test_attention_methods_agree_in_the_model():
    model = _toy("two_stage").eval()
    randomize(model)  # at initialisation boxes ignore the features (zero last layer)
    images, mask = inputs(H=64, W=96)
    with torch.no_grad():
        a = model(images, mask)
        model.set_attn_method("grid_sample")
        b = model(images, mask)
    torch.testing.assert_close(a["pred_boxes"], b["pred_boxes"], rtol=0, atol=1e-5)
    torch.testing.assert_close(a["pred_logits"], b["pred_logits"], rtol=0, atol=1e-4)


# ------------------------------------------------------------------------------ bad input
def test_mask_of_another_shape_is_refused():
    model = _toy()
    images, mask = inputs(H=64, W=96)
    with pytest.raises(ValueError, match=r"mask must have shape \(B, H, W\) = \(2, 64, 96\).*got \(2, 64, 95\)"):
        model(images, mask[..., :95])
    with pytest.raises(ValueError, match=r"images of shape \(B, 3, H, W\)"):
        model(images[:, :1])


@pytest.mark.parametrize("size", [(40, 50), (17, 23)])
def test_images_smaller_than_64px(size):
    """The stride-64 level (and C5) are 1x1: still finite outputs, and training works."""
    model = _toy("box_refine")
    H, W = size
    images, mask = inputs(H=H, W=W)
    enc = model.encode(images, mask)
    assert enc.spatial_shapes[-1] == (1, 1) and torch.isfinite(enc.valid_ratios).all() and (enc.valid_ratios > 0).all()
    out = model(images, mask)
    assert torch.isfinite(out["pred_boxes"]).all() and torch.isfinite(out["pred_logits"]).all()
    targets = [{"labels": torch.tensor([1]), "boxes": torch.tensor([[0.5, 0.5, 0.3, 0.4]])}] * 2
    SetCriterion(7, class_loss="focal")(out, targets)["loss"].backward()
    assert torch.isfinite(model.transformer.encoder.layers[0].self_attn.sampling_offsets.weight.grad).all()


def test_two_stage_on_images_too_small_for_its_proposals():
    model = _toy("two_stage", arch={"num_queries": 100})
    with pytest.raises(ValueError, match="num_queries=100 proposals, but .* have only 22 positions; use larger images or fewer queries"):
        model(torch.randn(1, 3, 32, 32))


def test_image_without_targets_trains():
    model = _toy("two_stage")
    images, mask = inputs(H=64, W=96)
    targets = [{"labels": torch.zeros(0, dtype=torch.int64), "boxes": torch.zeros(0, 4)},
               {"labels": torch.tensor([2, 4]), "boxes": torch.tensor([[0.3, 0.3, 0.2, 0.2], [0.6, 0.5, 0.3, 0.4]])}]
    terms = SetCriterion(7, class_loss="focal")(model(images, mask), targets)
    assert torch.isfinite(terms["loss"]) and {"loss_ce_enc", "loss_bbox_0"} <= set(terms)
    terms["loss"].backward()
    empty = [{"labels": torch.zeros(0, dtype=torch.int64), "boxes": torch.zeros(0, 4)}] * 2
    model.zero_grad()
    loss = SetCriterion(7, class_loss="focal")(model(images, mask), empty)["loss"]
    loss.backward()  # only the "no object" side of the focal loss: still a gradient
    assert loss > 0 and model.class_embed[0].bias.grad.abs().sum() > 0


def test_non_finite_offsets_are_reported_not_hidden():
    """NaN sampling offsets (a diverged model) give NaN outputs, never garbage reads; the loss names the cause."""
    model = _toy("box_refine")
    with torch.no_grad():
        model.transformer.encoder.layers[0].self_attn.sampling_offsets.bias[0] = float("nan")
    images, mask = inputs(H=64, W=96)
    out = model(images, mask)
    assert torch.isnan(out["pred_boxes"]).any()
    targets = [{"labels": torch.tensor([1]), "boxes": torch.tensor([[0.5, 0.5, 0.2, 0.2]])}] * 2
    with pytest.raises(ValueError, match="non-finite values .* diverged"):
        SetCriterion(7, class_loss="focal")(out, targets)


def test_invalid_configurations():
    with pytest.raises(ValueError, match="two_stage=True needs with_box_refine=True"):
        build_deformable_detr(DeformableDETR, **toy(arch={"two_stage": True}))
    with pytest.raises(ValueError, match="multiple of 32"):
        build_deformable_detr(DeformableDETR, **toy(arch={"hidden_dim": 48}))
    # 2 and 3 levels take the last stages of the backbone
    assert [s for s in _toy(arch={"num_feature_levels": 2}).backbone.strides] == [16, 32]
    assert _toy(arch={"num_feature_levels": 3}).backbone.channels == [128, 256, 512]


def test_images_in_a_batch_are_independent():
    """Changing one image (its padding) leaves the other image's predictions unchanged."""
    model = _toy("box_refine").eval()
    randomize(model)
    images, mask = inputs(H=64, W=96)
    noisy = images.clone()
    noisy[mask[:, None].expand_as(images)] = 5.0
    with torch.no_grad():
        a, b = model(images, mask), model(noisy, mask)
    # the backbone sees the padding (as in the original), so only image 0 is exactly unaffected
    torch.testing.assert_close(a["pred_boxes"][0], b["pred_boxes"][0])
    assert F.l1_loss(a["pred_boxes"][1], b["pred_boxes"][1]) > 0
