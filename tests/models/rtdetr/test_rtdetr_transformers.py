"""visiontf's RT-DETR and RT-DETRv2 equal transformers' ``RTDetr(V2)ForObjectDetection`` on the same weights.

transformers is a dev dependency that runs on the CPU: its models are built here at toy widths with random weights
(``tests/rtdetr_helpers.py``), saved as a transformers state dict and loaded into visiontf with
``create_model(name, pretrained=file)``. Compared: the logits and boxes of every returned decoder layer, in
evaluation (the last layer) and in training (every layer, the denoising queries and the selected proposals, with
the same denoising queries given to both), at two image sizes and on a padded batch, in float32 (1e-4) and float64
(1e-8). transformers rewrote two fixed tables of the original (the AIFI position embedding, row-major and in float64;
the anchors in the model's dtype): visiontf builds them as transformers does with ``tables="transformers"`` (here)
and as the original does by default (``tests/models/rtdetr/test_rtdetr_checkpoints.py``); the two agree on square maps in float32.
"""
from __future__ import annotations

import copy

import pytest
import torch
from rtdetr_helpers import (  # noqa: F401 (one_thread: a module fixture)
    NUM_CLASSES,
    fixed_denoising,
    max_diff,
    one_thread,
    padded_batch,
    targets_for,
    transformers_denoising,
    transformers_model,
    visiontf_model,
)

pytest.importorskip("transformers")

TOL = {torch.float32: 1e-4, torch.float64: 1e-8}
#: (image sizes of the batch): a non-square image alone, and two images padded into one batch
BATCHES = {"single_64x96": [(64, 96)], "padded_96x48_and_64x96": [(96, 48), (64, 96)]}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """(transformers model, its state dict file) for v1, v2 and v2 with discrete sampling."""
    folder = tmp_path_factory.mktemp("rtdetr_hf")
    built = {}
    for key, version, extra in [("v1", "v1", {}), ("v2", "v2", {}), ("v2_discrete", "v2", {"decoder_method": "discrete"})]:
        model = transformers_model(version, seed=len(built), **extra)
        path = folder / f"{key}.pth"
        torch.save(model.state_dict(), path)
        built[key] = (model, path)
    return built


def ours_for(models, key: str, **sections):
    version = "v1" if key == "v1" else "v2"
    if key == "v2_discrete":
        sections = {"decoder": {"sampling": "discrete"}, **sections}
    return visiontf_model(version, models[key][1], **sections)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("batch", sorted(BATCHES))
@pytest.mark.parametrize("key", ["v1", "v2", "v2_discrete"])
def test_eval_outputs_equal_transformers(models, key, batch, dtype):
    hf, _ = models[key]
    ours = ours_for(models, key).to(dtype)
    images, _ = padded_batch(BATCHES[batch])
    with torch.no_grad():
        theirs = hf.to(dtype)(pixel_values=images.to(dtype))
        out = ours(images.to(dtype))
    hf.float()
    assert theirs.logits.std() > 0.1 and theirs.pred_boxes.std() > 0.02  # not degenerate
    assert max_diff(out["pred_logits"], theirs.logits) < TOL[dtype]
    assert max_diff(out["pred_boxes"], theirs.pred_boxes) < TOL[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("key", ["v1", "v2"])
def test_train_outputs_with_the_same_denoising_queries_equal_transformers(models, key, dtype, monkeypatch):
    """Every decoder layer's logits and boxes (denoising and matching queries) and the selected proposals."""
    import transformers.models.rt_detr.modeling_rt_detr as v1
    import transformers.models.rt_detr_v2.modeling_rt_detr_v2 as v2

    hf = copy.deepcopy(models[key][0])  # a training step updates its BatchNorm statistics
    ours = ours_for(models, key).to(dtype).train()
    images, _ = padded_batch(BATCHES["padded_96x48_and_64x96"])
    targets = targets_for(2)
    dn = fixed_denoising(targets)
    monkeypatch.setattr(v1 if key == "v1" else v2, "get_contrastive_denoising_training_group", transformers_denoising(dn))
    ours.denoising = lambda *args: dn
    labels = [{"class_labels": t["labels"], "boxes": t["boxes"].to(dtype)} for t in targets]
    theirs = hf.to(dtype).train()(pixel_values=images.to(dtype), labels=labels)
    out = ours(images.to(dtype), targets=targets)
    P = dn.meta.pad_size
    layers = [*out["aux_outputs"], out]
    dn_layers = [*out["dn_outputs"]["aux_outputs"], out["dn_outputs"]]
    for i, (match, noised) in enumerate(zip(layers, dn_layers)):
        assert max_diff(match["pred_logits"], theirs.intermediate_logits[:, i, P:]) < TOL[dtype], i
        assert max_diff(match["pred_boxes"], theirs.intermediate_reference_points[:, i, P:]) < TOL[dtype], i
        assert max_diff(noised["pred_logits"], theirs.intermediate_logits[:, i, :P]) < TOL[dtype], i
        assert max_diff(noised["pred_boxes"], theirs.intermediate_reference_points[:, i, :P]) < TOL[dtype], i
    assert max_diff(out["interm_outputs"]["pred_logits"], theirs.enc_topk_logits) < TOL[dtype]
    assert max_diff(out["interm_outputs"]["pred_boxes"], theirs.enc_topk_bboxes) < TOL[dtype]


def test_a_padding_mask_makes_boxes_relative_to_each_image(models):
    """The network runs on the padded canvas as the originals; with the mask its boxes are each image's."""
    hf, _ = models["v1"]
    ours = ours_for(models, "v1")
    images, mask = padded_batch(BATCHES["padded_96x48_and_64x96"])
    with torch.no_grad():
        canvas = ours(images)
        own = ours(images, mask)
    scale = torch.tensor([[48 / 96, 96 / 96, 48 / 96, 96 / 96], [96 / 96, 64 / 96, 96 / 96, 64 / 96]])[:, None]
    assert torch.equal(canvas["pred_logits"], own["pred_logits"])
    assert max_diff(own["pred_boxes"] * scale, canvas["pred_boxes"]) < 1e-6
    with torch.no_grad():
        unpadded = ours(images, torch.zeros_like(mask))
    assert torch.equal(unpadded["pred_boxes"], canvas["pred_boxes"])


def test_default_tables_equal_transformers_on_square_maps_in_float32(models):
    """The original's tables (visiontf's default) and transformers' agree where both are right: square maps."""
    hf, path = models["v2"]
    ours = visiontf_model("v2", path, tables="original")
    images, _ = padded_batch([(64, 64)])
    with torch.no_grad():
        theirs = hf(pixel_values=images)
        out = ours(images)
    assert max_diff(out["pred_logits"], theirs.logits) < 1e-4 and max_diff(out["pred_boxes"], theirs.pred_boxes) < 1e-4
    assert out["pred_logits"].shape == (1, 10, NUM_CLASSES)
