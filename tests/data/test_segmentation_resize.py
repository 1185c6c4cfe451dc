"""mmseg's test-time resize: mmcv's ``rescale_size`` rule and cv2 ``INTER_LINEAR`` on uint8 images,
in the data module's eval transform and in the adapter's preprocessing alike."""
from __future__ import annotations

import cv2
import numpy as np
import pytest
import torch
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from torchvision.transforms.v2 import functional as TF

from visiontf.data.transforms.segmentation import keep_ratio_size, resize_image_like_mmcv, segmentation_transforms
from visiontf.tasks.segmentation.segmentation_inference import SegmentationPreprocess, SegmentationSettings


def mmcv_rescale_size(w: int, h: int, scale: tuple[int, int]) -> tuple[int, int]:
    """mmcv.image.geometric.rescale_size written out: old size (w, h) -> new (w, h)."""
    factor = min(max(scale) / max(h, w), min(scale) / min(h, w))
    return int(w * float(factor) + 0.5), int(h * float(factor) + 0.5)


@pytest.mark.parametrize("scale", [(2048, 512), (2049, 1025), (512, 2048)])
def test_keep_ratio_size_is_mmcv_rescale_size(scale):
    rng = np.random.default_rng(0)
    sizes = [(300, 400), (512, 683), (683, 512), (1024, 2048), (1025, 2049), (375, 500), (7, 3000), (256, 256)]
    sizes += [tuple(int(v) for v in rng.integers(16, 3000, 2)) for _ in range(300)]
    for h, w in sizes:
        nw, nh = mmcv_rescale_size(w, h, scale)
        assert keep_ratio_size(h, w, scale) == (nh, nw), (h, w, scale)
    # the +0.5 rounding, not int() truncation nor round-half-even: 400 * 512/300 = 682.67 -> 683
    assert keep_ratio_size(300, 400, (2048, 512)) == (512, 683)


def _image(h: int, w: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


@pytest.mark.parametrize("hw,out", [((120, 170), (64, 91)), ((64, 90), (96, 135)), ((100, 100), (50, 50)),
                                    ((33, 47), (33, 47))])
def test_resize_is_cv2_inter_linear_bit_for_bit(hw, out):
    img = _image(*hw)
    expected = cv2.resize(img, (out[1], out[0]), interpolation=cv2.INTER_LINEAR)
    x = torch.from_numpy(img).permute(2, 0, 1).float() / 255
    got = resize_image_like_mmcv(x, out)
    assert got.shape == (3, *out) and got.dtype == torch.float32
    assert torch.equal((got * 255).round().to(torch.uint8).permute(1, 2, 0), torch.from_numpy(expected))
    # float inputs (not uint8 values) take cv2's float path: same interpolation, no quantisation
    xf = x + 0.3 / 255
    ref = cv2.resize(xf.permute(1, 2, 0).numpy(), (out[1], out[0]), interpolation=cv2.INTER_LINEAR)
    assert torch.allclose(resize_image_like_mmcv(xf, out), torch.from_numpy(ref).permute(2, 0, 1), atol=1e-6)


def test_torchvision_antialias_is_not_mmsegs_resize():
    """Why cv2: torchvision's default antialiasing low-pass filters when downscaling; mmseg does not."""
    img = _image(120, 170)
    x = torch.from_numpy(img).permute(2, 0, 1).float()
    expected = torch.from_numpy(cv2.resize(img, (91, 64), interpolation=cv2.INTER_LINEAR)).permute(2, 0, 1).float()
    assert (TF.resize(x, [64, 91], antialias=True) - expected).abs().max() > 20
    # without antialiasing it is the same interpolation, off by cv2's fixed-point uint8 rounding only
    assert (TF.resize(x, [64, 91], antialias=False) - expected).abs().max() <= 1.0


def test_adapter_preprocessing_equals_the_data_modules_eval_transform():
    """A Predictor and validation feed the model the same tensor (mmseg's Resize + normalisation)."""
    img = _image(90, 130, seed=1)
    scale = (160, 48)
    settings = SegmentationSettings(mean=IMAGENET_DEFAULT_MEAN, std=IMAGENET_DEFAULT_STD, resize=scale)
    pre = SegmentationPreprocess(settings)(torch.from_numpy(img).permute(2, 0, 1).float() / 255)
    val = segmentation_transforms(train=False, base_size=scale)(image=img, mask=np.zeros(img.shape[:2], np.uint8))
    assert pre.shape == (1, 3, *keep_ratio_size(90, 130, scale)) == (1, *val["image"].shape)
    assert torch.allclose(pre[0], val["image"], atol=1e-5)
    # and both are mmseg's: cv2 INTER_LINEAR on the uint8 image, then (x - 255 mean) / (255 std)
    h, w = keep_ratio_size(90, 130, scale)
    ref = cv2.resize(img, (w, h), interpolation=cv2.INTER_LINEAR).astype(np.float32)
    ref = (ref - 255 * np.array(IMAGENET_DEFAULT_MEAN, np.float32)) / (255 * np.array(IMAGENET_DEFAULT_STD, np.float32))
    assert torch.allclose(pre[0], torch.from_numpy(ref).permute(2, 0, 1), atol=1e-5)
