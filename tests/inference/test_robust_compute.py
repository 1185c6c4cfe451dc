"""Robust compute and bounded memory.

Cost: a 1-block SETR step, small DETR/ViT forwards, PNG files of 10 x 2000 pixels, and (slow) two
fresh processes predicting 8 and 40 images for the memory check: about 25 s on 2 shared cores.
"""
from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader, TensorDataset

import visiontf
from visiontf.data.io import ImageReadError, read_image, set_max_image_pixels
from visiontf.data.transforms.detection import resized_hw
from visiontf.inference.predict_files import predict_to_folder
from visiontf.inference.predictor import Predictor
from visiontf.models.contract import Classifier, PretrainedCfg

ROOT = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------------------------------- segmentation loss
def test_a_batch_with_every_pixel_ignored_trains_with_a_zero_loss_counted_in_the_log(tmp_path):
    from visiontf.tasks.segmentation.segmentation_task import SegmentationTask

    task = SegmentationTask(model_name="setr_naive_vit_tiny_patch16", num_classes=3, lr=1e-3, optimizer="adamw",
                            model_kwargs={"encoder": {"img_size": 32, "kwargs": {"depth": 4}}})
    images = torch.rand(4, 3, 32, 32)
    masks = torch.randint(0, 3, (4, 32, 32))
    masks[:2] = 255  # the first batch (batch size 2) has no labelled pixel
    loader = DataLoader(TensorDataset(images, masks), batch_size=2)
    seen = []

    class Losses(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            seen.append(float(outputs["loss"]))

    trainer = L.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[Losses()], default_root_dir=tmp_path)
    trainer.fit(task, loader)  # on_nonfinite defaults to "raise": a NaN would stop here
    assert seen[0] == 0.0 and seen[1] > 0
    assert float(trainer.callback_metrics["train/unlabelled_batches"]) == 1.0
    assert all(torch.isfinite(p).all() for p in task.parameters())


# ---------------------------------------------------------------------------------------- sizes
def test_extreme_aspect_ratios_resize_to_at_least_one_pixel():
    assert resized_hw(10, 10000, 800, 1333) == (1, 1000)
    assert resized_hw(3, 10000, 800, 1333) == (1, 3333)  # used to be (0, 0): "sizes should be greater than 0"
    assert resized_hw(480, 640, 800, 1333) == (800, 1066)  # ordinary images unchanged (DETR's rounding)


def _save(path: Path, h: int, w: int, value: int = 200) -> Path:
    img = np.zeros((h, w, 3), np.uint8)
    img[h // 4 : 3 * h // 4 + 1, w // 4 : 3 * w // 4 + 1] = value
    Image.fromarray(img).save(path)
    return path


def test_detection_predictor_handles_or_refuses_each_odd_image_and_runs_the_rest(tmp_path, caplog):
    torch.manual_seed(0)
    model = visiontf.create_model("detr_tiny", num_classes=2, arch={"num_queries": 5}).eval()
    p = Predictor(model, device="cpu", preprocess={"min_size": 64, "max_size": 128}, batch_size=4)
    normal = _save(tmp_path / "normal.png", 48, 64)
    wide = _save(tmp_path / "wide.png", 10, 2000)
    with caplog.at_level(logging.WARNING):
        res = p([normal, wide, torch.zeros(3, 0, 0)], score_threshold=None)
    assert len(res) == 3 and "boxes" in res[0] and res[0]["boxes"].shape == (5, 4)
    assert res[1]["boxes"].shape == (5, 4) and res[1]["image_size"] == (10, 2000)  # handled: resized to 1 x 128
    assert bool((res[1]["boxes"][:, 2] <= 2000).all() and (res[1]["boxes"][:, 3] <= 10).all())  # in original pixels
    assert res[2]["error"].startswith("tensor: image of 0x0 pixels") and "not predicted: tensor: image of 0x0" in caplog.text
    with pytest.raises(ValueError, match="0x0 pixels"):  # alone, an unusable input is an error, not an empty list
        p(torch.zeros(3, 0, 0))


def test_a_model_failing_on_one_image_fails_that_image_only(tmp_path, caplog):
    class PicksyViT(Classifier):
        """Fails on any batch holding an image whose crop is all dark (stands in for an odd image)."""

        pretrained_cfg = PretrainedCfg(input_size=(3, 16, 16), crop_pct=1.0, mean=(0, 0, 0), std=(1, 1, 1))
        num_classes = 2

        def forward(self, x):
            if (x.flatten(1).amax(1) == 0).any():
                raise RuntimeError("Input and output sizes should be greater than 0")
            return torch.stack([x.mean((1, 2, 3)), -x.mean((1, 2, 3))], 1)

    p = Predictor(PicksyViT(), task="classification", device="cpu", batch_size=3)
    ok = torch.full((3, 20, 20), 0.5)
    with caplog.at_level(logging.WARNING):
        res = p([ok, torch.zeros(3, 20, 20), ok])
    assert "labels" in res[0] and "labels" in res[2]
    assert "the model failed on this image: RuntimeError: Input and output sizes" in res[1]["error"]
    with pytest.raises(RuntimeError, match="sizes should be greater"):  # nothing works: the model's problem, raised
        p(torch.zeros(3, 20, 20))


def test_classifier_on_a_10_by_10000_image_crops_before_resizing(tmp_path):
    from visiontf.tasks.classification.classification_inference import classification_view

    x = torch.linspace(0, 60, 10000)
    image = torch.stack([0.5 + 0.4 * torch.sin(x), 0.5 + 0.4 * torch.cos(x / 3), x / 60])[:, None, :].expand(3, 10, 10000)
    image = image * torch.linspace(0.6, 1.0, 10)[None, :, None]  # smooth: a sub-pixel offset changes little
    view = classification_view(image, (3, 224, 224), 0.875)
    assert view.shape == (3, 224, 224)
    # the same crop as resize-then-crop (timm's order) up to the filter at the edges
    full = torch.nn.functional.interpolate(image[None], size=(256, 256000), mode="bicubic", antialias=True)[0]
    ref = full[:, 16:240, 128000 - 112 : 128000 + 112].clamp(0, 1)
    assert (view - ref).abs().mean() < 0.02
    ordinary = torch.rand(3, 300, 400)  # ordinary images keep timm's exact order
    from torchvision.transforms.v2 import functional as TF

    exact = TF.center_crop(TF.resize(ordinary, [256], interpolation=TF.InterpolationMode.BICUBIC, antialias=True), [224, 224])
    torch.testing.assert_close(classification_view(ordinary, (3, 224, 224), 0.875), exact.clamp(0, 1))


def test_training_transforms_take_extreme_aspect_ratios(tmp_path):
    from visiontf.data.transforms import detection as DT
    image = np.full((10, 2000, 3), 128, np.uint8)
    boxes = np.array([[100, 2, 50, 5]], np.float32)
    for tf in (DT.build_train_transforms(DT.DETR_SCALES, DT.DETR_MAX_SIZE, DT.DETR_CROP_SCALES, DT.DETR_CROP_SIZE, seed=0),
               DT.build_val_transforms(800, 1333)):
        out = tf(image=image, bboxes=boxes, labels=np.array([0]), ann_index=np.arange(1))
        assert min(out["image"].shape[-2:]) >= 1


# ---------------------------------------------------------------------------------------- decompression bomb
def test_decompression_bomb_guard_refuses_at_1x_its_one_limit_and_quotes_it(tmp_path, recwarn):
    from PIL import Image as PILImage

    before = PILImage.MAX_IMAGE_PIXELS
    try:
        set_max_image_pixels(10_000)
        _save(tmp_path / "at.png", 100, 100)  # exactly the limit: loads, without Pillow's warning
        assert read_image(tmp_path / "at.png").shape == (100, 100, 3)
        _save(tmp_path / "over.png", 100, 101)  # 1.01x: refused (Pillow alone would only warn up to 2x)
        with pytest.raises(ImageReadError, match=r"over\.png: image larger than the decompression-bomb limit of 10,000 "
                                                 r"pixels \(101x100 = 10,100 pixels\).*set_max_image_pixels"):
            read_image(tmp_path / "over.png")
        _save(tmp_path / "far.png", 200, 200)  # 4x: above Pillow's own error threshold, the same limit quoted
        with pytest.raises(ImageReadError, match=r"far\.png: image larger than the decompression-bomb limit of 10,000 pixels"):
            read_image(tmp_path / "far.png")
        assert not [w for w in recwarn if "DecompressionBomb" in type(w.message).__name__]
    finally:
        set_max_image_pixels(before)
    from visiontf.data import io

    assert io.MAX_IMAGE_PIXELS == PILImage.MAX_IMAGE_PIXELS == 178_956_970


# ---------------------------------------------------------------------------------------- streaming
def test_predict_streams_files_through_workers_in_order(tmp_path):
    torch.manual_seed(0)
    vit = visiontf.create_model("vit_tiny_patch16_224", num_classes=3, img_size=32, depth=1).eval()
    folder = tmp_path / "images"
    folder.mkdir()
    for i in range(7):
        _save(folder / f"{i}.png", 30 + i, 40, value=30 * i)
    (folder / "6.png").write_bytes(b"not a png")  # unreadable: fails alone, in its worker
    p = Predictor(vit, device="cpu", batch_size=2, num_workers=2)
    streamed = list(p.stream(folder))
    assert [Path(r["source"]).name for _, r in streamed] == [f"{i}.png" for i in range(7)]
    assert "not a readable image" in streamed[6][1]["error"]
    eager = Predictor(vit, device="cpu", batch_size=7, num_workers=0)(sorted(folder.glob("[0-5].png")))
    for (_, s), e in zip(streamed, eager):
        torch.testing.assert_close(s["scores"], e["scores"])
    report = predict_to_folder(p, [folder], tmp_path / "out")
    assert report["predicted"] == 6 and len(report["failed"]) == 1
    failed = json.loads((tmp_path / "out" / "failed.json").read_text())
    assert failed[0]["input"].endswith("6.png") and "not a readable image" in failed[0]["error"]
    assert len(json.loads((tmp_path / "out" / "predictions.json").read_text())) == 6


@pytest.mark.slow
def test_predict_peak_memory_does_not_grow_with_the_number_of_files():
    """Fresh processes (benchmarks/predict_memory.py) on 8 and 40 images of 384^2: the streamed peak
    stays within 16 MiB, where decoding all first would add about 32 x 384^2 x 15 bytes = 70 MiB."""
    sys.path.insert(0, str(ROOT))
    from benchmarks import predict_memory

    rows = predict_memory.run(counts=(8, 40), side=384, kinds=("streamed",))
    assert all(r["same_result"] for r in rows)
    assert rows[1]["growth_mib"] < 16, rows
