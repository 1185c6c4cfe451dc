"""mmseg's evaluation protocol: images resized, annotations kept at their original size (reduce-zero-label,
ignore 255), logits without the batch padding resized to the annotation, IoU counted there.

The reference below is mmseg 1.x's ``IoUMetric`` written out (``intersect_and_union`` with ``histc``,
``total_area_to_metrics``), fed by an independent pipeline: cv2 image reading and resizing, mmcv's
``rescale_size``, mmseg's ``LoadAnnotations(reduce_zero_label=True)`` arithmetic on uint8.
"""
from __future__ import annotations

import cv2
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD

from visiontf.models.contract import Segmenter
from visiontf.tasks.segmentation.segmentation_data import SegmentationDataModule, segmentation_collate, segmentation_transforms
from visiontf.tasks.segmentation.segmentation_files import ade20k_pairs
from visiontf.tasks.segmentation.segmentation_synthetic import make_segmentation_dataset
from visiontf.tasks.segmentation.segmentation_task import SegmentationTask

IGN = 255


# ---- mmseg's IoUMetric, written out ---------------------------------------------------------------
def mmseg_intersect_and_union(pred: torch.Tensor, label: torch.Tensor, k: int, ignore: int = IGN):
    keep = label != ignore
    pred, label = pred[keep].float(), label[keep].float()
    inter = pred[pred == label]
    area = [torch.histc(t, bins=k, min=0, max=k - 1) for t in (inter, pred, label)]
    return area[0], area[1] + area[2] - area[0], area[1], area[2]


def mmseg_metrics(results: list) -> dict[str, torch.Tensor]:
    # mmseg sums float32 histograms; float64 here so equality is not blurred by rounding (counts are exact)
    inter, union, _, label = (sum(r[i] for r in results).double() for i in range(4))
    iou, acc = inter / union, inter / label  # 0/0 -> NaN, left out of the means
    return {"IoU": iou, "mIoU": iou.nanmean(), "mAcc": acc.nanmean(), "aAcc": inter.sum() / label.sum()}


def mmseg_reduce_zero_label(gt: np.ndarray) -> np.ndarray:
    """mmseg's LoadAnnotations(reduce_zero_label=True) on the uint8 map."""
    gt = gt.copy()
    gt[gt == 0] = 255
    gt = gt - 1
    gt[gt == 254] = 255
    return gt


def mmcv_rescale(w: int, h: int, scale: tuple[int, int]) -> tuple[int, int]:
    f = min(max(scale) / max(h, w), min(scale) / min(h, w))
    return int(w * f + 0.5), int(h * f + 0.5)


def _task_metrics(task: SegmentationTask) -> dict[str, torch.Tensor]:
    cm = task.confmat.compute()
    task.confmat.reset()
    tp = cm.diagonal().double()
    union = cm.sum(0) + cm.sum(1) - cm.diagonal()
    return {"IoU": tp / union, "aAcc": tp.sum() / cm.sum(), "cm": cm}


def _assert_same(task_metrics, ref):
    assert torch.allclose(task_metrics["IoU"], ref["IoU"].double(), equal_nan=True, atol=1e-9)
    assert torch.nanmean(task_metrics["IoU"]).item() == pytest.approx(ref["mIoU"].item(), abs=1e-9)
    assert task_metrics["aAcc"].item() == pytest.approx(ref["aAcc"].item(), abs=1e-9)


class ImageIsLogits(Segmenter):
    """A model whose logits are its input, so test cases can be written as logits by hand."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def _stub_task(k: int, **kw) -> SegmentationTask:
    task = SegmentationTask("setr_naive_vit_tiny_patch16", num_classes=k, log_per_class=False,
                            model_kwargs={"encoder": {"img_size": 32, "kwargs": {"depth": 4}}}, **kw)
    task.model = ImageIsLogits()
    return task.eval()


# ---- hand-made -------------------------------------------------------------------------------------
def test_hand_made_case_is_scored_at_the_original_annotation():
    # the model saw a 1x2 image: left pixel class 0, right pixel class 1
    logits = torch.tensor([[[5.0, -5.0]], [[-5.0, 5.0]], [[-9.0, -9.0]]])  # (K=3, 1, 2)
    # the ADE-style annotation of the original 2x4 image: 0 = other (ignored), class k stored as k + 1
    raw = np.array([[1, 1, 2, 2], [1, 0, 2, 3]], np.uint8)
    gt = torch.from_numpy(mmseg_reduce_zero_label(raw)).long()  # [[0, 0, 1, 1], [0, 255, 1, 2]]
    images, masks, sizes = segmentation_collate([(logits, gt)], with_sizes=True)
    assert sizes.tolist() == [[1, 2, 2, 4]]
    task = _stub_task(3)
    task.validation_step((images, masks, sizes), 0)
    got = _task_metrics(task)
    # by hand: bilinear 1x2 -> 2x4 (align_corners=False) puts columns 0-1 on the left pixel, 2-3 on the
    # right: prediction [[0, 0, 1, 1], [0, 0, 1, 1]]; (1, 1) is ignored. Class 0: 3/3, class 1: 3/4
    # (gt 3, pred 4), class 2: 0/1 (gt 1, never predicted): mIoU (1 + 3/4 + 0) / 3, aAcc 6/7
    assert got["IoU"].tolist() == pytest.approx([1.0, 0.75, 0.0])
    assert got["aAcc"].item() == pytest.approx(6 / 7)
    pred = F.interpolate(logits[None], size=(2, 4), mode="bilinear", align_corners=False)[0].argmax(0)
    _assert_same({"IoU": got["IoU"], "aAcc": got["aAcc"]}, mmseg_metrics([mmseg_intersect_and_union(pred, gt, 3)]))

    # the former protocol scores the annotation resized (nearest) to 1x2 instead: [[0, 1]], a perfect score
    task = _stub_task(3, score_resolution="resized")
    task.validation_step((images, masks, sizes), 0)
    assert torch.nanmean(_task_metrics(task)["IoU"]).item() == pytest.approx(1.0)


def test_padded_batch_of_different_sizes_matches_mmseg_per_image():
    """Two images of different sizes in one padded batch: each one's padding is dropped before its logits
    are resized to its own annotation, so the batch scores as the images one by one (mmseg's
    ``postprocess_result`` with ``padding_size``)."""
    g = torch.Generator().manual_seed(0)
    samples = [(torch.randn(4, 3, 5, generator=g), torch.randint(0, 4, (7, 11), generator=g)),
               (torch.randn(4, 6, 2, generator=g), torch.randint(0, 4, (9, 4), generator=g))]
    samples[1][1][0, :2] = IGN
    batch = segmentation_collate(samples, with_sizes=True)
    images, masks, sizes = batch
    assert images.shape == (2, 4, 6, 5) and masks.shape == (2, 9, 11)
    assert sizes.tolist() == [[3, 5, 7, 11], [6, 2, 9, 4]]
    assert (masks[0, 7:] == IGN).all() and (masks[1, :, 4:] == IGN).all()
    task = _stub_task(4)
    task.validation_step(batch, 0)
    got = _task_metrics(task)
    ref = []
    for logits, gt in samples:
        pred = F.interpolate(logits[None], size=gt.shape, mode="bilinear", align_corners=False)[0].argmax(0)
        ref.append(mmseg_intersect_and_union(pred, gt, 4))
    _assert_same(got, mmseg_metrics(ref))
    # without dropping the padding the second image's logits would be stretched: the scores differ
    wrong = []
    for i, (_, gt) in enumerate(samples):
        pred = F.interpolate(images[i:i + 1], size=gt.shape, mode="bilinear", align_corners=False)[0].argmax(0)
        wrong.append(mmseg_intersect_and_union(pred, gt, 4))
    assert not torch.allclose(got["IoU"], mmseg_metrics(wrong)["IoU"].double(), equal_nan=True)


# ---- the synthetic set, end to end -----------------------------------------------------------------
SCALE = (80, 40)  # 48x64 images -> 40x53 (mmcv: factor min(80/64, 40/48))


@pytest.fixture(scope="module")
def ade_root(tmp_path_factory):
    return make_segmentation_dataset(tmp_path_factory.mktemp("ade"), layout="ade20k", num_train=1, num_val=3,
                                     num_classes=4, image_size=(48, 64))


@pytest.fixture(scope="module")
def tiny_task():
    torch.manual_seed(0)
    task = SegmentationTask("setr_naive_vit_tiny_patch16", num_classes=4, log_per_class=False,
                            model_kwargs={"encoder": {"img_size": 32, "kwargs": {"patch_size": 8, "depth": 4}}},
                            inference_mode="slide", crop_size=32, stride=21)
    with torch.no_grad():  # varied predictions rather than one class everywhere
        task.model.decode_head.cls_seg.weight.normal_(0, 1.0)
    return task.eval()


def _reference(root, task, k=4) -> dict[str, torch.Tensor]:
    """mmseg's test pipeline and IoUMetric on the files, with the task's network."""
    mean, std = 255 * np.array(IMAGENET_DEFAULT_MEAN, np.float32), 255 * np.array(IMAGENET_DEFAULT_STD, np.float32)
    results = []
    for img_path, ann_path in ade20k_pairs(root, "validation"):
        img = cv2.imread(str(img_path), cv2.IMREAD_COLOR)[:, :, ::-1]  # LoadImageFromFile (BGR), to_rgb
        h, w = img.shape[:2]
        nw, nh = mmcv_rescale(w, h, SCALE)
        img = cv2.resize(img, (nw, nh), interpolation=cv2.INTER_LINEAR).astype(np.float32)  # Resize(keep_ratio)
        x = torch.from_numpy((img - mean) / std).permute(2, 0, 1)[None]  # SegDataPreProcessor
        gt = torch.from_numpy(mmseg_reduce_zero_label(np.array(Image.open(ann_path)))).long()
        with torch.no_grad():
            logits = task.model.inference(x, "slide", crop=32, stride=21)
        assert gt.shape == (h, w) and logits.shape[-2:] == (nh, nw) != (h, w)
        pred = F.interpolate(logits, size=(h, w), mode="bilinear", align_corners=False)[0].argmax(0)  # postprocess
        results.append(mmseg_intersect_and_union(pred, gt, k))
    return mmseg_metrics(results)


def _validate(task, dm) -> dict[str, torch.Tensor]:
    dm.setup("validate")
    with torch.no_grad():
        for i, batch in enumerate(dm.val_dataloader()):
            task.validation_step(batch, i)
    return _task_metrics(task)


def test_synthetic_ade20k_set_scores_as_mmseg(ade_root, tiny_task):
    dm = SegmentationDataModule(ade_root, layout="ade20k", base_size=SCALE, val_batch_size=2, num_workers=0)
    assert dm.eval_protocol == "mmseg"  # the ADE20K / Cityscapes default
    batch = next(iter((dm.setup("validate"), dm.val_dataloader())[1]))
    assert len(batch) == 3 and batch[0].shape[-2:] == (40, 53) and batch[1].shape[-2:] == (48, 64)
    got = _validate(tiny_task, dm)
    ref = _reference(ade_root, tiny_task)
    _assert_same(got, ref)
    assert 0.0 < ref["mIoU"].item() < 1.0

    # the former protocol (annotation resized with the image) is another number, from the same model
    old = _validate(tiny_task, SegmentationDataModule(ade_root, layout="ade20k", base_size=SCALE, num_workers=0,
                                                      eval_protocol="resized"))
    assert old["cm"].sum() < got["cm"].sum()  # 40x53 pixels scored per image instead of 48x64
    # and the task's "resized" option on mmseg batches reproduces it exactly (cv2 INTER_NEAREST masks)
    tiny_task.hparams.score_resolution = "resized"
    try:
        assert torch.equal(_validate(tiny_task, dm)["cm"], old["cm"])
    finally:
        tiny_task.hparams.score_resolution = "original"


def test_multiscale_and_flip_average_probabilities_at_the_original_size(ade_root, tiny_task):
    dm = SegmentationDataModule(ade_root, layout="ade20k", base_size=SCALE, val_batch_size=1, num_workers=0)
    dm.setup("validate")
    images, masks, sizes = next(iter(dm.val_dataloader()))
    tiny_task.test_scales, tiny_task.hparams.test_flip = [0.75, 1.0], True
    try:
        with torch.no_grad():
            (probs,) = tiny_task.predict_original_size(images, sizes)
            tiny_task.validation_step((images, masks, sizes), 0)
            # mmseg's TTA: every view (scale x flip) resized to the original annotation, softmax there, mean
            views = []
            for s in (0.75, 1.0):
                size = (round(40 * s), round(53 * s))  # views are scaled from the resized image
                x = F.interpolate(images, size=size, mode="bilinear", align_corners=False) if s != 1.0 else images
                for flip in (False, True):
                    logits = tiny_task.model.inference(x.flip(-1) if flip else x, "slide", crop=32, stride=21)
                    logits = logits.flip(-1) if flip else logits
                    views.append(F.interpolate(logits, size=(48, 64), mode="bilinear", align_corners=False)[0].softmax(0))
    finally:
        tiny_task.test_scales, tiny_task.hparams.test_flip = [1.0], False
    assert probs.shape == (4, 48, 64)
    assert torch.allclose(probs.sum(0), torch.ones(48, 64), atol=1e-5)
    assert torch.allclose(probs, torch.stack(views).mean(0), atol=1e-6)
    assert _task_metrics(tiny_task)["cm"].sum() == int((masks != IGN).sum())


def test_eval_transform_keeps_the_annotation_at_its_original_size():
    img, mask = np.zeros((30, 40, 3), np.uint8), (np.arange(1200).reshape(30, 40) % 5).astype(np.uint8)
    out = segmentation_transforms(train=False, base_size=(60, 20), resize_mask=False)(image=img, mask=mask)
    assert tuple(out["image"].shape) == (3, 20, 27) and np.array_equal(np.asarray(out["mask"]), mask)


def test_bad_protocol_is_named(ade_root):
    with pytest.raises(ValueError, match="eval_protocol='orig'.*'mmseg'"):
        SegmentationDataModule(ade_root, layout="ade20k", eval_protocol="orig", num_workers=0)
    with pytest.raises(ValueError, match="score_resolution='orig'.*'original'"):
        _stub_task(3, score_resolution="orig")


def test_validation_pictures_of_mmseg_batches(ade_root, tiny_task):
    """LogPredictionImages draws mmseg-protocol batches at the image's size (annotation resized to it)."""
    from visiontf.tasks.task_inference import adapter_for_task

    dm = SegmentationDataModule(ade_root, layout="ade20k", base_size=SCALE, val_batch_size=2, num_workers=0)
    dm.setup("validate")
    batch = next(iter(dm.val_dataloader()))
    with torch.no_grad():
        adapter = adapter_for_task("segmentation")
        settings = adapter.settings_type(mean=IMAGENET_DEFAULT_MEAN, std=IMAGENET_DEFAULT_STD)
        pictures = adapter.render_batch(tiny_task, batch, settings, None, 2, 0.5)
    assert [tuple(p.shape) for p in pictures] == [(3, 40, 106)] * 2 and pictures[0].dtype == torch.uint8
