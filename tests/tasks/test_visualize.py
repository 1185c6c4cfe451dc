"""Pictures: drawn boxes/masks/captions, DETR attention maps, ViT rollout, TensorBoard images, curves."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import visiontf
from visiontf.tasks.attention_pictures import (
    attention_rollout,
    detr_attention_maps,
    save_detr_attention_figure,
    save_rollout_overlay,
    vit_attention_rollout,
)
from visiontf.tasks.drawing import (
    color_for,
    draw_caption,
    draw_detections,
    draw_segmentation,
    save_image,
    to_uint8_chw,
)

ROOT = Path(__file__).resolve().parents[2]


def _gray(h: int, w: int) -> torch.Tensor:
    return torch.full((3, h, w), 128, dtype=torch.uint8)


def test_draw_detections_png(tmp_path):
    img = _gray(60, 80)
    result = {"boxes": torch.tensor([[10.0, 12.0, 50.0, 40.0]]), "labels": torch.tensor([2]), "scores": torch.tensor([0.87])}
    drawn = draw_detections(img, result, class_names=["a", "b", "cat"])
    path = save_image(drawn, tmp_path / "det.png")
    back = np.asarray(Image.open(path))
    assert back.shape == (60, 80, 3) and back.std() > 0
    # the right edge of the box carries the class colour; far from the box the image is untouched
    assert tuple(back[30, 50]) == color_for(2)
    assert (back[55:, 60:] == 128).all()
    # HWC numpy input and float input give the same picture
    hwc = img.permute(1, 2, 0).numpy()
    assert torch.equal(draw_detections(hwc, result, ["a", "b", "cat"]), drawn)
    assert torch.equal(draw_detections(img.float() / 255, result, ["a", "b", "cat"]), drawn)
    # thresholding removes the box
    assert torch.equal(draw_detections(img, result, score_threshold=0.9), img)


def test_draw_segmentation_and_caption():
    img = _gray(40, 50)
    lm = torch.full((40, 50), 255, dtype=torch.int64)
    lm[5:20, 5:25] = 1
    lm[25:35, 30:45] = 3
    out = draw_segmentation(img, lm, num_classes=4, alpha=0.5)
    assert out.shape == img.shape and out.dtype == torch.uint8
    expected = (torch.tensor(color_for(1)) * 0.5 + 128 * 0.5).to(torch.uint8)
    assert torch.allclose(out[:, 10, 10].float(), expected.float(), atol=1)
    assert not torch.equal(out[:, 30, 40], img[:, 30, 40])
    assert torch.equal(out[:, 0, 0], img[:, 0, 0]), "ignored pixels keep the image"
    cap = draw_caption(img, ["cat 0.91", "dog 0.05"])
    assert cap.shape == img.shape and not torch.equal(cap[:, :5], img[:, :5]) and torch.equal(cap[:, -3:], img[:, -3:])
    with pytest.raises(ValueError, match="does not match"):
        draw_segmentation(img, lm[:10], 4)
    assert to_uint8_chw(np.zeros((5, 6), np.uint8)).shape == (3, 5, 6)


@pytest.fixture(scope="module")
def detr():
    torch.manual_seed(0)
    return visiontf.create_model("detr_tiny", num_classes=3, arch={"enc_layers": 1, "dec_layers": 1}).eval()


@pytest.mark.slow
def test_detr_attention_maps(detr, tmp_path):
    image = torch.rand(3, 50, 70)
    maps = detr_attention_maps(detr, image, query_indices=[0, 7], points=[(3.0, 4.0), (69.0, 49.0)], preprocess={"min_size": 64, "max_size": 100})
    h, w = maps["feature_size"]
    assert maps["dec_attn"].shape == (2, 50, 70) and maps["dec_attn_grid"].shape == (2, h, w)
    assert maps["enc_attn"].shape == (2, 50, 70) and maps["enc_attn_grid"].shape == (2, h, w)
    # softmax over all h*w cells (one unpadded image): each map sums to 1
    np.testing.assert_allclose(maps["dec_attn_grid"].sum((1, 2)), 1.0, atol=1e-4)
    np.testing.assert_allclose(maps["enc_attn_grid"].sum((1, 2)), 1.0, atol=1e-4)
    # the points pick the first and last feature cells' rows of the encoder attention
    from visiontf.inference.predictor import Predictor, load_inputs

    p = Predictor(detr, preprocess={"min_size": 64, "max_size": 100}, device="cpu")
    batch, _ = p.preprocess([im.tensor for im in load_inputs(image)])  # the adapter's preprocessing module
    x = batch.images
    with torch.no_grad():
        out = detr(x, None, need_weights=True)
    enc = out["enc_attn"][0].reshape(-1, h, w).numpy()
    np.testing.assert_allclose(maps["enc_attn_grid"][0], enc[0], atol=1e-6)
    np.testing.assert_allclose(maps["enc_attn_grid"][1], enc[-1], atol=1e-6)
    np.testing.assert_allclose(maps["dec_attn_grid"][1], out["dec_attn"][0, 7].reshape(h, w).numpy(), atol=1e-6)
    path = save_detr_attention_figure(maps, tmp_path / "attn.png")
    pic = np.asarray(Image.open(path))
    assert pic.shape[0] > 100 and pic.std() > 0
    with pytest.raises(ValueError, match="outside"):
        detr_attention_maps(detr, image, points=[(80.0, 4.0)], preprocess={"min_size": 64, "max_size": 100})
    auto = detr_attention_maps(detr, image, score_threshold=0.0, max_queries=3, preprocess={"min_size": 64, "max_size": 100})
    assert 1 <= len(auto["query_indices"]) <= 3 and len(auto["points"]) >= 1


def _rollout_reference(maps: list[np.ndarray]) -> np.ndarray:
    """Abnar & Zuidema written out with numpy loops, per image."""
    B, N, _ = maps[0].shape
    out = np.zeros((B, N, N))
    for b in range(B):
        r = np.eye(N)
        for a in maps:
            m = 0.5 * a[b] + 0.5 * np.eye(N)
            m = m / m.sum(axis=1, keepdims=True)
            r = m @ r
        out[b] = r
    return out


def test_attention_rollout_matches_reference_and_rows_sum_to_one(tmp_path):
    g = torch.Generator().manual_seed(0)
    maps = [torch.rand(2, 5, 5, generator=g).softmax(-1) for _ in range(3)]
    rolled = attention_rollout(maps)
    np.testing.assert_allclose(rolled.numpy(), _rollout_reference([m.numpy() for m in maps]), atol=1e-5)
    torch.testing.assert_close(rolled.sum(-1), torch.ones(2, 5))
    eye = [torch.eye(4).expand(1, 4, 4)] * 2
    torch.testing.assert_close(attention_rollout(eye)[0], torch.eye(4))

    vit = visiontf.create_model("vit_tiny_patch16_224", num_classes=3, img_size=48, depth=2).eval()
    ro = vit_attention_rollout(vit, [torch.rand(3, 60, 50), torch.rand(3, 48, 48)])
    assert ro.shape == (2, 3, 3)
    s = ro.sum((1, 2))
    assert torch.all(s > 0) and torch.all(s < 1), "the CLS row keeps part of its mass on the prefix token"
    path = save_rollout_overlay(torch.rand(3, 48, 48), ro[0], tmp_path / "rollout.png")
    pic = np.asarray(Image.open(path))
    assert pic.shape == (48, 48, 3) and pic.std() > 0


def test_tensorboard_callback_writes_images(tmp_path):
    import lightning as L
    from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
    from tensorboard.backend.event_processing import event_accumulator

    from visiontf.callbacks import LogPredictionImages
    from visiontf.tasks.classification.classification_task import ClassificationTask

    task = ClassificationTask("vit_tiny_patch16_224", num_classes=3, model_kwargs={"img_size": 32, "depth": 1}).eval()
    batch = (torch.randn(3, 3, 32, 32), torch.tensor([0, 1, 2]))
    cb = LogPredictionImages(num_images=2)
    tb = TensorBoardLogger(tmp_path, name="tb")
    trainer = L.Trainer(logger=[CSVLogger(tmp_path), tb], accelerator="cpu", enable_progress_bar=False)
    cb.on_validation_batch_end(trainer, task, None, batch, 0)
    tb.experiment.flush()
    events = list(Path(tb.log_dir).glob("events.out.tfevents.*"))
    assert events
    acc = event_accumulator.EventAccumulator(str(events[0]), size_guidance={event_accumulator.IMAGES: 0})
    acc.Reload()
    assert sorted(acc.Tags()["images"]) == ["val_predictions/0", "val_predictions/1"]
    assert acc.Images("val_predictions/0")[0].width == 32
    # no TensorBoard logger: nothing happens
    plain = L.Trainer(logger=CSVLogger(tmp_path / "csv"), accelerator="cpu", enable_progress_bar=False)
    LogPredictionImages().on_validation_batch_end(plain, task, None, batch, 0)


def test_callback_renders_detection_and_segmentation(detr):
    from types import SimpleNamespace

    from visiontf.callbacks import LogPredictionImages

    cb = LogPredictionImages(num_images=2, score_threshold=0.0)
    images = torch.randn(2, 3, 64, 80)
    mask = torch.zeros(2, 64, 80, dtype=torch.bool)
    mask[1, :, 60:] = True
    targets = [{"size": torch.tensor([64, 80])}, {"size": torch.tensor([64, 60])}]
    pics = cb.render(None, SimpleNamespace(model=detr), (images, mask, targets))
    assert [tuple(p.shape) for p in pics] == [(3, 64, 80), (3, 64, 60)]
    setr = visiontf.create_model("setr_naive_vit_tiny_patch16", num_classes=3, encoder={"img_size": 32, "kwargs": {"depth": 4}}).eval()
    masks = torch.randint(0, 3, (2, 32, 48))
    pics = cb.render(None, SimpleNamespace(model=setr, hparams={"ignore_index": 255}), (torch.randn(2, 3, 32, 48), masks))
    assert [tuple(p.shape) for p in pics] == [(3, 32, 96)] * 2, "ground truth | prediction side by side"


def test_plot_logs_from_fake_metrics_csv(tmp_path):
    run = tmp_path / "run" / "csv" / "version_0"
    run.mkdir(parents=True)
    rows = ["epoch,step,train/loss,val/loss,val/mAP,lr-AdamW"]
    for step in range(1, 31):
        rows.append(f"{step // 10},{step},{2.0 / step},,,{1e-4}")
        if step % 10 == 0:
            rows.append(f"{step // 10 - 1},{step},,{1.5 / step},{0.01 * step},")
    (run / "metrics.csv").write_text("\n".join(rows) + "\n")
    out = tmp_path / "curves.png"
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "plot_logs.py"), str(tmp_path / "run"), "--output", str(out)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    pic = np.asarray(Image.open(out).convert("RGB"))
    assert pic.shape[1] >= 3 * 500 and pic.std() > 0, "three panels: loss, val metrics, lr"
    from visiontf.evaluation.training_curves import load_run

    df = load_run(run / "metrics.csv")
    assert set(df.name) == {"train/loss", "val/loss", "val/mAP", "lr-AdamW"}
    assert len(df[df.name == "val/mAP"]) == 3
