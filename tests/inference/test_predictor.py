"""Predictor: every input form, coordinate mapping back to the original image, checkpoints and files."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn
from torchvision.ops import box_convert

import visiontf
from visiontf.inference.predictor import Predictor, infer_task, load_inputs
from visiontf.models.contract import Detector, PretrainedCfg, Segmenter


@pytest.fixture(scope="module")
def vit():
    torch.manual_seed(0)
    return visiontf.create_model("vit_tiny_patch16_224", num_classes=5, img_size=32, depth=1).eval()


def _rgb(h: int, w: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def test_every_input_form_classification(vit, tmp_path):
    a, b = _rgb(40, 50, 1), _rgb(33, 71, 2)
    Image.fromarray(a).save(tmp_path / "a.png")
    Image.fromarray(b).save(tmp_path / "b.png")
    (tmp_path / "notes.txt").write_text("not an image")
    p = Predictor(vit, class_names=list("abcde"), device="cpu")
    forms = {
        "path": str(tmp_path / "a.png"),
        "folder": tmp_path,
        "pil": Image.fromarray(a),
        "numpy": a,
        "uint8": torch.from_numpy(a).permute(2, 0, 1),
        "float": torch.from_numpy(a).permute(2, 0, 1).float() / 255,
        "batch": torch.from_numpy(np.stack([a, a])).permute(0, 3, 1, 2),
        "mixed list": [a, str(tmp_path / "b.png"), Image.fromarray(b)],
    }
    counts = {"folder": 2, "batch": 2, "mixed list": 3}
    ref = None
    for name, x in forms.items():
        res = p(x, top_k=3)
        assert len(res) == counts.get(name, 1), name
        r = res[0]
        assert r["labels"].shape == (3,) and r["scores"].shape == (3,)
        assert torch.all(r["scores"][:-1] >= r["scores"][1:]), "top-k sorted by score"
        assert r["class_names"] == [list("abcde")[i] for i in r["labels"].tolist()]
        if ref is None:
            ref = r["scores"]
        # every form of image a is the same pixels, so the same probabilities
        torch.testing.assert_close(r["scores"], ref, atol=1e-5, rtol=0)
    assert p(forms["mixed list"])[1]["image_size"] == (33, 71)
    assert p(forms["folder"])[0]["source"].endswith("a.png")


def test_bad_inputs_raise_clear_errors(vit, tmp_path):
    p = Predictor(vit, device="cpu")
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        p(torch.rand(3, 20, 20) * 255)
    with pytest.raises(FileNotFoundError, match="no image files"):
        p(tmp_path)
    with pytest.raises(TypeError, match="unsupported input"):
        p(12)
    with pytest.raises(ValueError, match="class names"):
        Predictor(vit, class_names=["only", "two"])


def test_task_inference(vit):
    assert infer_task(vit) == "classification"
    assert infer_task(visiontf.create_model("setr_naive_vit_tiny_patch16", num_classes=3,
                                            encoder={"img_size": 32, "kwargs": {"depth": 4}})) == "segmentation"
    with pytest.raises(ValueError, match="task="):
        infer_task(nn.Linear(2, 2))


class BoxFinder(Detector):
    """A DETR stand-in: one query whose box is the bright rectangle, normalised like DETR's boxes
    (relative to each image's unpadded extent, read from the padding mask)."""

    pretrained_cfg = PretrainedCfg(mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0), min_size=48, max_size=80)
    num_classes = 2

    def __init__(self) -> None:
        super().__init__()
        self.masks_seen: list = []

    def forward(self, images, mask=None):
        self.masks_seen.append(mask)
        B, _, H, W = images.shape
        boxes = []
        for i in range(B):
            valid = ~mask[i] if mask is not None else torch.ones(H, W, dtype=torch.bool)
            h, w = int(valid.any(1).sum()), int(valid.any(0).sum())
            ys, xs = torch.nonzero(images[i, 0] > 0.5, as_tuple=True)
            xyxy = torch.tensor([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1], dtype=torch.float32)
            boxes.append(box_convert(xyxy / torch.tensor([w, h, w, h]), "xyxy", "cxcywh"))
        logits = torch.tensor([0.0, 5.0, 0.0]).expand(B, 1, 3)
        return {"pred_logits": logits, "pred_boxes": torch.stack(boxes)[:, None]}


def _rect_image(h: int, w: int, box: tuple[int, int, int, int]) -> torch.Tensor:
    img = torch.zeros(3, h, w, dtype=torch.uint8)
    x0, y0, x1, y1 = box
    img[:, y0:y1, x0:x1] = 255
    return img


def test_detection_boxes_map_back_to_original_pixels_through_resize_and_padding():
    small_box, large_box = (10, 5, 30, 20), (25, 60, 70, 100)
    small = _rect_image(37, 53, small_box)  # odd size, upscaled (padded in a mixed batch)
    large = _rect_image(121, 90, large_box)  # downscaled, sets a mixed batch's size
    model = BoxFinder()
    p = Predictor(model, task="detection", device="cpu", batch_size=2)
    res = p([small, large], score_threshold=0.5)
    # two sizes: each went through the model apart, unpadded (padding would change a real model's detections)
    assert len(model.masks_seen) == 2 and all(m is None for m in model.masks_seen)
    # the padded path still maps back (evaluation pads to size_divisibility): one mixed batch, as before
    padded = p.adapter._predict_batch(model, p.preprocess, [small.float() / 255, large.float() / 255], 0.5, None, p.class_name)
    assert model.masks_seen[-1] is not None and bool(model.masks_seen[-1].any()), "the batch was padded"
    for r, box in [*zip(res, (small_box, large_box)), *zip(padded, (small_box, large_box))]:
        assert r["boxes"].shape == (1, 4) and r["labels"].tolist() == [1]
        # one resized pixel is at most ~2 original pixels here
        torch.testing.assert_close(r["boxes"][0], torch.tensor(box, dtype=torch.float32), atol=2.0, rtol=0)
    alone = p([small])[0]
    torch.testing.assert_close(alone["boxes"], res[0]["boxes"], atol=1e-4, rtol=0)
    # min_size override: a different resize, the same original-pixel box
    res2 = Predictor(model, task="detection", device="cpu", preprocess={"min_size": 96, "max_size": 200})([small, large])
    torch.testing.assert_close(res2[0]["boxes"][0], torch.tensor(small_box, dtype=torch.float32), atol=1.0, rtol=0)


@pytest.mark.slow
def test_real_detr_tiny_thresholds_and_top_k():
    model = visiontf.create_model("detr_tiny", num_classes=3, arch={"enc_layers": 1, "dec_layers": 1})
    p = Predictor(model, device="cpu", preprocess={"min_size": 64, "max_size": 96}, class_names=["a", "b", "c"])
    assert p.task == "detection"
    imgs = [torch.rand(3, 50, 70), torch.randint(0, 256, (3, 90, 41), dtype=torch.uint8)]
    res = p(imgs, score_threshold=None, top_k=4)
    for r, (h, w) in zip(res, [(50, 70), (90, 41)]):
        assert r["boxes"].shape == (4, 4) and r["scores"].shape == (4,)
        assert torch.all(r["scores"][:-1] >= r["scores"][1:])
        # sigmoid boxes: centres inside the image
        cx, cy = (r["boxes"][:, 0] + r["boxes"][:, 2]) / 2, (r["boxes"][:, 1] + r["boxes"][:, 3]) / 2
        assert torch.all((cx >= 0) & (cx <= w) & (cy >= 0) & (cy <= h))
        assert all(n in "abc" for n in r["class_names"])
    high = p(imgs, score_threshold=0.99)
    assert all(len(r["boxes"]) == 0 or torch.all(r["scores"] > 0.99) for r in high)


class Threshold(Segmenter):
    """Segmentation stand-in: class 1 where the red channel is bright (logits at the input size)."""

    pretrained_cfg = PretrainedCfg(mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0))
    num_classes = 2

    def forward(self, x):
        c = x[:, :1] - 0.5
        return torch.cat([-c, c], dim=1)


def test_segmentation_label_map_at_original_resolution():
    img = torch.zeros(3, 45, 61, dtype=torch.uint8)
    img[0, 10:30, 5:40] = 255
    expected = (img[0] > 127).to(torch.int64)
    r = Predictor(Threshold(), task="segmentation", device="cpu")(img)[0]
    assert r["label_map"].shape == (45, 61) and r["label_map"].dtype == torch.int64
    assert torch.equal(r["label_map"], expected)
    # resized for the network (mmseg keep-ratio scale), logits resized back to 45 x 61
    r = Predictor(Threshold(), task="segmentation", device="cpu", preprocess={"resize": (128, 96)})(img)[0]
    assert r["label_map"].shape == (45, 61)
    assert (r["label_map"] == expected).float().mean() > 0.97


def test_setr_tiny_whole_and_slide():
    model = visiontf.create_model("setr_naive_vit_tiny_patch16", num_classes=3, encoder={"img_size": 32, "kwargs": {"depth": 4}})
    for mode in ("whole", "slide"):
        r = Predictor(model, device="cpu", preprocess={"test_mode": mode})([torch.rand(3, 50, 37), torch.rand(3, 20, 70)])
        assert [x["label_map"].shape for x in r] == [(50, 37), (20, 70)]
        assert all(int(x["label_map"].max()) < 3 for x in r)


def test_from_file_round_trip(vit, tmp_path):
    path = visiontf.save_model(vit, tmp_path / "vit.safetensors")
    x = torch.rand(2, 3, 40, 44)
    a = Predictor(vit, device="cpu")(x)
    b = Predictor.from_file(path, device="cpu", class_names=list("vwxyz"))(x)
    for ra, rb in zip(a, b):
        torch.testing.assert_close(ra["scores"], rb["scores"])
        assert rb["class_names"][0] in "vwxyz"


@pytest.mark.slow
def test_from_lightning_checkpoint(tmp_path):
    import lightning as L
    from torch.utils.data import DataLoader, TensorDataset

    from visiontf.tasks.classification.classification_task import ClassificationTask

    task = ClassificationTask("vit_tiny_patch16_224", num_classes=4, model_kwargs={"img_size": 32, "depth": 1}, warmup_steps=0)
    data = DataLoader(TensorDataset(torch.randn(4, 3, 32, 32), torch.tensor([0, 1, 2, 3])), batch_size=2)
    trainer = L.Trainer(max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, accelerator="cpu", limit_val_batches=0)
    trainer.fit(task, data)
    ckpt = tmp_path / "last.ckpt"
    trainer.save_checkpoint(ckpt)
    p = Predictor.from_checkpoint(ckpt, class_names=["w", "x", "y", "z"], device="cpu")
    x = torch.rand(3, 32, 32)
    got = p(x, top_k=4)[0]
    with torch.no_grad():
        ref = task.model.eval()(p.preprocess([im.tensor for im in load_inputs(x)])).softmax(-1)[0]
    torch.testing.assert_close(got["scores"], ref.sort(descending=True).values, atol=1e-5, rtol=0)
    assert set(got["class_names"]) == {"w", "x", "y", "z"}


@pytest.fixture(scope="module")
def dino():
    """dino_tiny with DINO's options (two-stage mixed query selection, look forward twice, shared heads,
    decoder norm, denoising off at inference), small, with biases moved off their init so that the
    detections differ from image to image."""
    torch.manual_seed(0)
    model = visiontf.create_model("dino_tiny", num_classes=3, arch={"num_queries": 30, "enc_layers": 1, "dec_layers": 2},
                                  backbone={"pretrained": False}, dino={"num_query_groups": 2})
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.2 * torch.randn_like(p))
    return model.eval()


def _direct_detections(model, images, min_size, max_size):
    """What the Predictor should return, written out: resize, normalise, pad with a mask, the model,
    the model's post-processing at the original sizes, boxes clipped to the image."""
    from visiontf.set_prediction import build_postprocess
    from visiontf.tasks.detection.detection_inference import DetectionPreprocess, DetectionSettings

    prep = DetectionPreprocess(DetectionSettings(min_size=min_size, max_size=max_size, mean=model.pretrained_cfg.mean,
                                                 std=model.pretrained_cfg.std))
    batch, _ = prep(images)
    with torch.no_grad():
        out = model(batch.images, batch.mask if batch.padded else None)
    sizes = torch.tensor([tuple(im.shape[-2:]) for im in images])
    dets = build_postprocess(model)(out, sizes)
    for d, (h, w) in zip(dets, sizes.tolist()):
        d["boxes"][:, 0::2] = d["boxes"][:, 0::2].clamp(0, w)
        d["boxes"][:, 1::2] = d["boxes"][:, 1::2].clamp(0, h)
    return dets


@pytest.mark.parametrize("batch_size", [1, 2])
def test_dino_predictor_equals_model_and_postprocessing(dino, batch_size):
    """The Predictor on dino_tiny (DINO's options on) gives the detections of the model + its
    post-processing called directly, on images of different sizes and aspect ratios, at batch 1 or 2:
    images of different sizes never share a (padded) batch, so each equals the model on it alone."""
    images = [torch.rand(3, 70, 100, generator=torch.Generator().manual_seed(1)),
              torch.rand(3, 120, 64, generator=torch.Generator().manual_seed(2)),
              torch.rand(3, 96, 96, generator=torch.Generator().manual_seed(3))]
    p = Predictor(dino, device="cpu", batch_size=batch_size, preprocess={"min_size": 96, "max_size": 160})
    got = p(images, score_threshold=None)
    want = [d for image in images for d in _direct_detections(dino, [image], 96, 160)]
    assert [r["image_size"] for r in got] == [(70, 100), (120, 64), (96, 96)]
    for r, d in zip(got, want):
        assert len(r["scores"]) == min(dino.postprocess_options.num_top, 30 * 3) == len(d["scores"])
        torch.testing.assert_close(r["scores"], d["scores"], atol=0, rtol=0)
        torch.testing.assert_close(r["labels"], d["labels"], atol=0, rtol=0)
        torch.testing.assert_close(r["boxes"], d["boxes"], atol=0, rtol=0)
    # non-trivial: different images give different detections
    assert not torch.equal(got[0]["boxes"][:5], got[2]["boxes"][:5])
