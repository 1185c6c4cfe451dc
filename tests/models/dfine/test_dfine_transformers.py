"""visiontf's D-FINE equals transformers' ``DFineForObjectDetection`` on the same weights.

transformers is a dev dependency that runs on the CPU: its D-FINE is built here at toy widths with random weights
(``tests/dfine_helpers.py``), saved as a transformers state dict and loaded into visiontf with
``create_model("dfine_s", pretrained=file)`` (the HGNetv2 backbone's, the encoder's and the decoder's names mapped,
q/k/v fused, the heads stored twice kept once). Compared: evaluation logits and boxes at two image sizes (a single
non-square image, a padded batch of two) and, in training with the same denoising queries given to both, every
decoder layer's logits, boxes and edge logits, the first layer's extra box, the selected proposals and the
denoising queries' outputs; in float32 (1e-4) and float64 (1e-8). In float32 the training step normalises with the
BatchNorms' running statistics: with the batch's, float32 rounding grows through the encoder's 40 BatchNorms of this
narrow model (transformers' own float32 differs from its float64 by 8e-4 to 3e-2 over 12 weight seeds), where with the
running statistics it stays within 1e-5; float64 runs them on the batch's statistics. transformers' tables (row-major float64 position
embedding, anchors in the model's dtype) are visiontf's ``tables="transformers"``, as for RT-DETR. The original's
own outputs are compared in ``tests/models/dfine/test_dfine_checkpoints.py``.
"""
from __future__ import annotations

import copy

import pytest
import torch
from dfine_helpers import transformers_model, visiontf_model
from rtdetr_helpers import (  # noqa: F401 (one_thread: a module fixture)
    NUM_CLASSES,
    fixed_denoising,
    max_diff,
    one_thread,
    padded_batch,
    targets_for,
    transformers_denoising,
)

pytest.importorskip("transformers")

TOL = {torch.float32: 1e-4, torch.float64: 1e-8}
BATCHES = {"single_64x96": [(64, 96)], "padded_96x48_and_64x96": [(96, 48), (64, 96)]}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """(transformers model, visiontf model loaded from its state dict file)."""
    path = tmp_path_factory.mktemp("dfine_hf") / "dfine.pth"
    hf = transformers_model(seed=0)
    torch.save(hf.state_dict(), path)
    return hf, visiontf_model(path), path


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("batch", sorted(BATCHES))
def test_eval_outputs_equal_transformers(models, batch, dtype):
    hf, ours, _ = models
    images, _ = padded_batch(BATCHES[batch])
    with torch.no_grad():
        theirs = hf.to(dtype)(pixel_values=images.to(dtype))
        out = ours.to(dtype)(images.to(dtype))
    hf.float(), ours.float()
    assert theirs.logits.std() > 0.1 and theirs.pred_boxes.std() > 0.02  # not degenerate
    assert max_diff(out["pred_logits"], theirs.logits) < TOL[dtype]
    assert max_diff(out["pred_boxes"], theirs.pred_boxes) < TOL[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_train_outputs_with_the_same_denoising_queries_equal_transformers(models, dtype, monkeypatch):
    """Every layer's logits, boxes and edge logits, the first layer's extra box, the proposals, the denoising queries'."""
    import transformers.models.d_fine.modeling_d_fine as modeling

    hf = copy.deepcopy(models[0]).to(dtype).train()  # a training step updates BatchNorm statistics
    ours = copy.deepcopy(models[1]).to(dtype).train()
    if dtype == torch.float32:  # the running statistics (see the module docstring)
        for module in [*hf.modules(), *ours.modules()]:
            if isinstance(module, torch.nn.BatchNorm2d):
                module.eval()
    images, _ = padded_batch(BATCHES["padded_96x48_and_64x96"])
    targets = targets_for(2)
    dn = fixed_denoising(targets)
    monkeypatch.setattr(modeling, "get_contrastive_denoising_training_group", transformers_denoising(dn))
    ours.denoising = lambda *args: dn
    labels = [{"class_labels": t["labels"], "boxes": t["boxes"].to(dtype)} for t in targets]
    theirs = hf.model(pixel_values=images.to(dtype), labels=labels)  # the outputs without transformers' loss
    out = ours(images.to(dtype), targets=targets)
    P, tol = dn.meta.pad_size, TOL[dtype]
    logits, boxes = theirs.intermediate_logits, theirs.intermediate_reference_points  # [:, 0]: the first layer's extra box
    corners, initial = theirs.intermediate_predicted_corners, theirs.initial_reference_points
    for group, part in ((out, slice(P, None)), (out["dn_outputs"], slice(None, P))):
        for i, layer in enumerate([*group["aux_outputs"], group]):
            assert max_diff(layer["pred_logits"], logits[:, i + 1, part]) < tol, i
            assert max_diff(layer["pred_boxes"], boxes[:, i + 1, part]) < tol, i
            assert max_diff(layer["pred_corners"], corners[:, i, part]) < tol, i
            assert max_diff(layer["ref_points"], initial[:, i, part]) < tol, i
        assert max_diff(group["pre_outputs"]["pred_logits"], logits[:, 0, part]) < tol
        assert max_diff(group["pre_outputs"]["pred_boxes"], boxes[:, 0, part]) < tol
    assert max_diff(out["interm_outputs"]["pred_logits"], theirs.enc_topk_logits) < tol
    assert max_diff(out["interm_outputs"]["pred_boxes"], theirs.enc_topk_bboxes) < tol
    assert corners.abs().max() > 0.5  # the edge logits are not degenerate


def test_every_tensor_has_one_place_and_attention_projections_stay_apart(models):
    """The converter is strict and fuses q, k and v in that order: a transformers file whose k and v were given one
    weight (transformers#40253's conversion bug) would show here as equal blocks of the fused projection."""
    hf, ours, _ = models
    theirs = hf.state_dict()
    qkv = ours.decoder.layers[0].self_attn.qkv.weight
    d = qkv.shape[1]
    assert torch.equal(qkv[:d], theirs["model.decoder.layers.0.self_attn.q_proj.weight"])
    assert torch.equal(qkv[d:2 * d], theirs["model.decoder.layers.0.self_attn.k_proj.weight"])
    assert torch.equal(qkv[2 * d:], theirs["model.decoder.layers.0.self_attn.v_proj.weight"])
    assert not torch.equal(qkv[d:2 * d], qkv[2 * d:])
    from visiontf.models import WeightsLayoutError
    from visiontf.models.dfine.convert import convert_state_dict

    with pytest.raises(WeightsLayoutError, match="no place for"):
        convert_state_dict({**theirs, "model.decoder.extra.weight": torch.zeros(1)}, ours)


def test_a_padding_mask_makes_boxes_relative_to_each_image(models):
    _, ours, _ = models
    images, mask = padded_batch(BATCHES["padded_96x48_and_64x96"])
    with torch.no_grad():
        canvas, own = ours(images), ours(images, mask)
    scale = torch.tensor([[48 / 96, 96 / 96, 48 / 96, 96 / 96], [96 / 96, 64 / 96, 96 / 96, 64 / 96]])[:, None]
    assert torch.equal(canvas["pred_logits"], own["pred_logits"])
    assert max_diff(own["pred_boxes"] * scale, canvas["pred_boxes"]) < 1e-6


def test_default_tables_equal_transformers_on_square_maps_in_float32(models):
    hf, _, path = models
    ours = visiontf_model(path, tables="original")
    images, _ = padded_batch([(64, 64)])
    with torch.no_grad():
        theirs, out = hf(pixel_values=images), ours(images)
    assert max_diff(out["pred_logits"], theirs.logits) < 1e-4 and max_diff(out["pred_boxes"], theirs.pred_boxes) < 1e-4
    assert out["pred_logits"].shape == (1, 10, NUM_CLASSES)


def test_a_silu_decoder_with_relu_quality_estimators_equals_transformers(tmp_path):
    """transformers' ``DFineLQE`` (as D-FINE's code) is ReLU whatever ``decoder_activation_function`` says, where DEIM's
    estimators take the decoder's activation (visiontf's default): ``decoder.lqe_act: relu`` rebuilds the former."""
    hf = transformers_model(seed=1, decoder_activation_function="silu")
    torch.save(hf.state_dict(), tmp_path / "silu.pth")
    images, _ = padded_batch(BATCHES["single_64x96"])
    with torch.no_grad():
        theirs = hf.double()(pixel_values=images.double())
        relu = visiontf_model(tmp_path / "silu.pth", decoder={"activation": "silu", "lqe_act": "relu"}).double()(images.double())
        silu = visiontf_model(tmp_path / "silu.pth", decoder={"activation": "silu"}).double()(images.double())
    assert max_diff(relu["pred_logits"], theirs.logits) < TOL[torch.float64]
    assert max_diff(relu["pred_boxes"], theirs.pred_boxes) < TOL[torch.float64]
    assert max_diff(silu["pred_logits"], theirs.logits) > 1e-3  # the estimators' activation is what differed
