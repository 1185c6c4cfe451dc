"""Deformable DETR at inference: the Predictor, the sampling-point picture, ONNX through the
grid_sample core (compared with onnxruntime on a padded batch of two), tools/export.py and
tools/predict.py --attention."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.ops import box_convert

import visiontf
from visiontf.cli import export_main, predict_main
from visiontf.inference.predictor import Predictor
from visiontf.nn.ms_deform_attn import MSDeformAttn
from visiontf.set_prediction import DeformablePostProcess
from visiontf.tasks.detection.deformable_attention import deformable_sampling_points, save_sampling_points_figure

TINY = {"arch": {"hidden_dim": 64, "nheads": 2, "enc_layers": 1, "dec_layers": 2, "dim_feedforward": 64, "num_queries": 12}}


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return visiontf.create_model("deformable_detr_tiny", num_classes=3, **TINY).eval()


def test_predictor_equals_the_model_and_sigmoid_postprocessing_image_by_image(model):
    """Two sizes asked for together: each runs alone (no padding that would change its detections)."""
    p = Predictor(model, device="cpu", preprocess={"min_size": 64, "max_size": 96}, class_names=["a", "b", "c"])
    images = [torch.rand(3, 50, 70), torch.rand(3, 90, 41)]
    res = p(images, score_threshold=None, top_k=5)
    assert p.preprocess(images)[0].padded  # together they would need padding
    ref = []
    for image in images:
        batch, _ = p.preprocess([image])
        with torch.no_grad():
            ref += DeformablePostProcess()(model(batch.images, batch.mask), torch.tensor([image.shape[1:]]), top_k=5)
    for r, q in zip(res, ref):
        torch.testing.assert_close(r["boxes"], q["boxes"])
        torch.testing.assert_close(r["scores"], q["scores"])
        assert r["labels"].tolist() == q["labels"].tolist() and all(n in "abc" for n in r["class_names"])
    high = p(images, score_threshold=0.5)
    assert all(torch.all(r["scores"] > 0.5) for r in high)


def test_sampling_points_land_on_the_reference_with_zero_offsets(tmp_path):
    """Offsets zeroed: every sample of every level lies on the reference point, which with an image
    whose sides are multiples of the coarsest stride is exactly (x W, y H) on every level."""
    torch.manual_seed(1)
    model = visiontf.create_model("deformable_detr_tiny", num_classes=3, arch={**TINY["arch"], "with_box_refine": False}).eval()
    for m in model.transformer.decoder.modules():
        if isinstance(m, MSDeformAttn):
            torch.nn.init.zeros_(m.sampling_offsets.weight)
            torch.nn.init.zeros_(m.sampling_offsets.bias)
    image = (np.random.default_rng(0).random((64, 96, 3)) * 255).astype(np.uint8)
    data = deformable_sampling_points(model, image, preprocess={"min_size": 64, "max_size": 96}, max_queries=2, score_threshold=1.0)
    assert data["strides"] == [8, 16, 32] and len(data["query_indices"]) == 1  # none above 1.0: the best one
    n, heads, levels, points, _ = data["points"].shape
    assert (n, heads, levels, points) == (1, TINY["arch"]["nheads"], 3, 4)
    np.testing.assert_allclose(data["points"].reshape(-1, 2), np.broadcast_to(data["reference"][0], (heads * levels * points, 2)), atol=1e-3)
    np.testing.assert_allclose(data["weights"].sum((-1, -2)), 1.0, atol=1e-5)
    with pytest.raises(ValueError, match="out of range"):
        deformable_sampling_points(model, image, query_indices=[TINY["arch"]["num_queries"]], preprocess={"min_size": 64, "max_size": 96})


def test_sampling_points_figure(model, tmp_path):
    image = np.full((72, 120, 3), 40, dtype=np.uint8)
    data = deformable_sampling_points(model, image, query_indices=[0, 5], preprocess={"min_size": 64, "max_size": 128})
    assert data["points"].shape[0] == 2 and data["boxes"].shape == (2, 4)
    path = save_sampling_points_figure(data, tmp_path / "points.png")
    pic = np.asarray(Image.open(path).convert("RGB")).astype(int)
    assert pic.shape[1] > pic.shape[0] > 100
    lime = (pic[..., 1] > 200) & (pic[..., 0] < 80) & (pic[..., 2] < 80)
    assert lime.sum() > 20, "reference crosses drawn"
    detr = visiontf.create_model("detr_tiny", num_classes=3, arch={"enc_layers": 1, "dec_layers": 1})
    with pytest.raises(ValueError, match="no sampling locations"):  # DETR's need_weights gives dense maps
        deformable_sampling_points(detr, image, preprocess={"min_size": 64, "max_size": 128})


def _fake_checkpoint(model, path: Path, kwargs: dict) -> Path:
    """What DetectionTask's Lightning checkpoint holds for the network (``model.*`` keys, hparams)."""
    ckpt = {
        "state_dict": {f"model.{k}": v for k, v in model.state_dict().items()} | {"criterion.empty_weight": torch.ones(4)},
        "hyper_parameters": {"model_name": "deformable_detr_tiny", "num_classes": 3, "model_kwargs": kwargs},
        "preprocess": {"min_size": 64, "max_size": 96},
        "class_names": ["car", "person", "dog"],
        "epoch": 0,
    }
    torch.save(ckpt, path)
    return path


def test_export_onnx_and_predict_with_attention_clis(tmp_path, capsys):
    """Two-stage (box refinement, proposals, top-k): ONNX from the grid_sample core equals PyTorch's
    gather core on a padded batch of two; the graph's batch, H and W are dynamic."""
    import onnxruntime as ort

    from visiontf.inference.export import example_inputs, onnx_max_abs_diff

    kwargs = {"arch": {**TINY["arch"], "two_stage": True}}
    torch.manual_seed(2)
    model = visiontf.create_model("deformable_detr_tiny", num_classes=3, **kwargs).eval()
    ckpt = _fake_checkpoint(model, tmp_path / "d.ckpt", kwargs)
    out, onnx = tmp_path / "export" / "d.safetensors", tmp_path / "export" / "d.onnx"
    assert export_main(["--ckpt_path", str(ckpt), "--output", str(out), "--onnx", str(onnx), "--image_size", "64", "96"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["onnx_max_abs_diff"] < 1e-4
    print(f"ONNX vs PyTorch (padded batch of 2, 64x96): max abs diff {report['onnx_max_abs_diff']:.2e}")
    back = visiontf.load_model(out).eval()
    assert all(m.method == "gather" for m in back.modules() if isinstance(m, MSDeformAttn))
    sess = ort.InferenceSession(str(onnx), providers=["CPUExecutionProvider"])
    assert sess.get_inputs()[0].shape == ["batch", 3, "height", "width"]
    three = example_inputs(back, image_size=(96, 64), batch_size=3, pad=True)
    assert onnx_max_abs_diff(back, onnx, three) < 1e-4

    images = tmp_path / "images"
    images.mkdir()
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (81, 37, 3), dtype=np.uint8)).save(images / "000000000042.png")
    pred_dir = tmp_path / "pred"
    assert predict_main(["--weights", str(out), "--input", str(images), "--output", str(pred_dir), "--score_threshold", "0.0",
                         "--top_k", "3", "--attention", "--device", "cpu"]) == 0
    preds = json.loads((pred_dir / "predictions.json").read_text())
    assert len(preds) == 3 and {p["image_id"] for p in preds} == {42}
    assert np.asarray(Image.open(pred_dir / "000000000042.png")).shape == (81, 37, 3)
    picture = np.asarray(Image.open(pred_dir / "000000000042_attention.png").convert("RGB")).astype(int)
    assert ((picture[..., 1] > 200) & (picture[..., 0] < 80) & (picture[..., 2] < 80)).sum() > 20, "reference crosses drawn"
    # the same boxes as the Python API, with the exported preprocessing
    r = Predictor.from_file(out, device="cpu")(images, score_threshold=0.0, top_k=3)[0]
    x0, y0, bw, bh = preds[0]["bbox"]
    np.testing.assert_allclose([x0, y0, x0 + bw, y0 + bh], r["boxes"][0].numpy(), atol=0.02)
    assert box_convert(r["boxes"], "xyxy", "cxcywh")[:, 2:].min() >= 0
