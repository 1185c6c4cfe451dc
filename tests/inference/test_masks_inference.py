"""Mask models at inference and beyond DETR: the Predictor's masks and panoptic segments, predict.py's files
(RLE results that score as pycocotools' segm, panoptic PNG + JSON that score with pq_compute), ONNX export
with ``pred_masks``, and DETR's mask head on DINO (``dino_tiny_masks``)."""
from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import torch

import visiontf
from visiontf.inference import Predictor
from visiontf.inference.export import example_inputs, export_model, export_onnx, onnx_max_abs_diff
from visiontf.inference.predict_files import predict_to_folder
from visiontf.models import create_model
from visiontf.models.deformable_detr.deformable_detr_segm import MASK_HEAD_PREFIXES
from visiontf.set_prediction import build_criterion

SMALL = dict(arch=dict(enc_layers=1, dec_layers=1, num_queries=8))


def _confident(model):
    """A model whose every query is a thing (class 0) or stuff (class 2) above its panoptic threshold (0.3)."""
    with torch.no_grad():
        model.class_embed.bias.zero_()
        model.class_embed.bias[0] = 8.0
        model.class_embed.bias[2] = 7.5
        model.mask_head.out_lay.bias.fill_(0.5)
    return model.eval()


@pytest.fixture(scope="module")
def panoptic_set(tmp_path_factory):
    from visiontf.tasks.detection.panoptic_synthetic import make_panoptic_dataset

    return make_panoptic_dataset(tmp_path_factory.mktemp("pan"), num_train=0, num_val=4, num_classes=2, seed=3)


@pytest.mark.slow
def test_predictor_returns_masks_and_panoptic_segments(panoptic_set):
    model = _confident(create_model("detr_tiny_masks", num_classes=4, thing_classes=[0, 1], panoptic_threshold=0.3, **SMALL))
    predictor = Predictor(model, class_names=["circle", "square", "sky", "ground"], preprocess={"min_size": 96, "max_size": 160})
    results = predictor(sorted(panoptic_set["val_images"].iterdir()), score_threshold=0.3)
    for r in results:
        h, w = r["image_size"]
        assert r["masks"].shape == (len(r["boxes"]), h, w) and r["masks"].dtype == torch.bool
        assert r["panoptic"]["ids"].shape == (h, w)
        infos = r["panoptic"]["segments_info"]
        assert sum(s["area"] for s in infos) == h * w and {s["isthing"] for s in infos} <= {True, False}
    picture = predictor.adapter.draw(torch.zeros(3, *results[0]["image_size"], dtype=torch.uint8), results[0])
    assert picture.shape[0] == 3 and picture.float().mean() > 0  # the masks' colours over a black image


@pytest.mark.slow
def test_predict_files_score_as_pycocotools_and_panopticapi(panoptic_set, tmp_path):
    """predictions.json (RLE at the original size) and panoptic.json + PNGs score with the standard tools."""
    from pycocotools.coco import COCO

    from visiontf.evaluation.coco import evaluate_coco
    from visiontf.evaluation.panoptic import pq_compute

    model = _confident(create_model("detr_tiny_masks", num_classes=4, thing_classes=[0, 1], panoptic_threshold=0.3, **SMALL))
    l2c = {0: 1, 1: 2, 2: 10, 3: 11}
    predictor = Predictor(model, label_to_cat_id=l2c, preprocess={"min_size": 96, "max_size": 160})
    summary = predict_to_folder(predictor, [panoptic_set["val_images"]], tmp_path, annotations=panoptic_set["val_ann"],
                                score_threshold=0.0)
    assert summary["predicted"] == 4
    records = json.loads((tmp_path / "predictions.json").read_text())
    gt = COCO(str(panoptic_set["val_ann"]))
    for r in records[:20]:
        h, w = gt.imgs[r["image_id"]]["height"], gt.imgs[r["image_id"]]["width"]
        assert r["segmentation"]["size"] == [h, w]
    things = [r for r in records if r["category_id"] in (1, 2)]
    stats = evaluate_coco(panoptic_set["val_ann"], things, iou_type="segm", backend="pycocotools")
    assert 0 <= stats["AP"] <= 1
    panoptic = json.loads((tmp_path / "panoptic.json").read_text())
    assert {c["id"]: c["isthing"] for c in panoptic["categories"]}.items() <= {1: 1, 10: 0}.items()
    assert 1 in {c["id"] for c in panoptic["categories"]}
    assert all(s["id"] > 0 for a in panoptic["annotations"] for s in a["segments_info"])  # 0 stays unlabelled
    gt_json = json.loads(panoptic_set["val_panoptic"].read_text())
    result = pq_compute(panoptic_set["val_panoptic"], tmp_path / "panoptic.json", panoptic_set["val_segments"], tmp_path)
    assert result["All"]["n"] >= 1 and len(panoptic["annotations"]) == len(gt_json["annotations"])
    assert (tmp_path / f"{panoptic['annotations'][0]['file_name'].replace('_panoptic.png', '_segments.png')}").is_file()


@pytest.mark.slow
def test_onnx_export_of_the_masked_model(tmp_path):
    model = create_model("detr_tiny_masks", num_classes=3, **SMALL).eval()
    path = export_onnx(model, tmp_path / "masks.onnx", image_size=(64, 96))
    import onnx

    assert [o.name for o in onnx.load(str(path)).graph.output] == ["pred_logits", "pred_boxes", "pred_masks"]
    padded = example_inputs(model, image_size=(64, 96), batch_size=2, pad=True)
    assert onnx_max_abs_diff(model, path, padded) < 1e-4
    assert onnx_max_abs_diff(model, path, example_inputs(model, image_size=(96, 64), batch_size=3, pad=True)) < 1e-4
    report = export_model(model, tmp_path / "masks.safetensors", onnx=tmp_path / "checked.onnx", image_size=(64, 96))
    assert report["onnx_max_abs_diff"] < 1e-4


# --------------------------------------------------------------------------- the mask head on DINO
def test_dino_mask_head_leaves_the_detector_unchanged(tmp_path, caplog):
    torch.manual_seed(0)
    detector = create_model("dino_tiny", num_classes=3, arch={"num_queries": 20}).eval()
    path = tmp_path / "dino.pth"
    torch.save(detector.state_dict(), path)
    with caplog.at_level(logging.WARNING):
        model = create_model("dino_tiny_masks", num_classes=3, arch={"num_queries": 20}, pretrained=path).eval()
    assert any("no mask head" in r.getMessage() for r in caplog.records)
    images = torch.randn(2, 3, 96, 128)
    mask = torch.zeros(2, 96, 128, dtype=torch.bool)
    mask[1, :, 100:] = True
    with torch.no_grad():
        want, got = detector(images, mask), model(images, mask)
    assert torch.equal(got["pred_logits"], want["pred_logits"]) and torch.equal(got["pred_boxes"], want["pred_boxes"])
    assert got["pred_masks"].shape == (2, 20, 24, 32) and got["pred_masks"].std() > 0


def test_dino_mask_model_trains_with_denoising_and_sigmoid_panoptic():
    from handmade_data import shapes_batch as _shapes_batch

    model = create_model("dino_tiny_masks", num_classes=2, arch={"num_queries": 10}, freeze_detector=True).train()
    assert all(n.startswith(MASK_HEAD_PREFIXES) for n, p in model.named_parameters() if p.requires_grad)
    images, targets = _shapes_batch()
    out = model(images, targets=targets)
    # masks of the matching queries only (a training forward leaves them to the loss: the matched ones)
    assert out["mask_logits_of"].num_queries == 10 and "dn_outputs" in out and "pred_masks" not in out
    terms = build_criterion(model, 2)(out, targets)
    assert terms["loss_mask"] > 0 and terms["loss_dice"] > 0
    terms["loss"].backward()
    assert model.mask_head.lay1.weight.grad is not None and model.class_embed[0].weight.grad is None

    from visiontf.tasks.detection.mask_eval import panoptic_predictions

    model.eval()
    model.mask_options = visiontf.models.mask_options.MaskOptions(panoptic_threshold=0.0, thing_classes=(0,))
    with torch.no_grad():
        out = model(images)
    (ids, info), _ = panoptic_predictions(model, out, [[64, 64]] * 2, [[64, 64]] * 2)
    assert ids.shape == (64, 64) and info and sum(s["area"] for s in info) == 64 * 64
    assert np.array_equal(np.unique(ids), np.arange(len(info)))
