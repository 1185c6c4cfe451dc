"""Restoration data: MATLAB bicubic values, degradations, aligned crops, layouts, bad images, resumable draws."""
from __future__ import annotations

import logging

import cv2
import numpy as np
import pytest
import torch

from visiontf.data.loading import DatasetLayoutError, EpochIndex
from visiontf.data.transforms.imresize import bicubic_downscale, imresize, resize_weights
from visiontf.tasks.restoration.restoration_data import RestorationDataModule
from visiontf.tasks.restoration.restoration_dataset import add_noise
from visiontf.tasks.restoration.restoration_files import ImageReadError, find_records, read_rgb8


def _write(path, array):
    path.parent.mkdir(parents=True, exist_ok=True)
    assert cv2.imwrite(str(path), array)


def _photo(h, w, seed=0):
    """A smooth image with some texture (bicubic of noise looks nothing like a photo, but values are what matter)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([128 + 60 * np.sin(x / 7.0 + c) * np.cos(y / 5.0) for c in range(3)], axis=2)
    return np.clip(base + rng.normal(0, 10, base.shape), 0, 255).astype(np.uint8)


# ---------------------------------------------------------------------------------------- imresize
def test_imresize_x2_kernel_is_matlabs():
    # by hand: cubic(0.25) = 0.8671875, cubic(0.75) = 0.2265625, cubic(1.25) = -0.0703125,
    # cubic(1.75) = -0.0234375, each halved (antialiasing at scale 1/2), sum 1
    weights, indices = resize_weights(20, 10, 0.5)
    expected = np.array([-3, -9, 29, 111, 111, 29, -9, -3]) / 256
    np.testing.assert_array_equal(weights[4], expected)
    np.testing.assert_array_equal(indices[4], np.arange(5, 13))  # output 5 (1-based) reads inputs 6..13
    np.testing.assert_array_equal(indices[0], [2, 1, 0, 0, 1, 2, 3, 4])  # symmetric padding, edge repeated


def test_imresize_ramp_by_hand():
    ramp = np.tile(np.arange(1, 21, dtype=np.float64), (4, 1))
    out = imresize(ramp, 0.5)
    assert out.shape == (2, 10)
    # inside, a linear ramp is sampled at u = 2x - 0.5 exactly
    np.testing.assert_allclose(out[0, 2:8], [5.5, 7.5, 9.5, 11.5, 13.5, 15.5], atol=1e-12)
    # at the left edge the mirrored inputs 3,2,1,1,2,3,4,5 with the weights above: 371 / 256
    assert out[0, 0] == pytest.approx(371 / 256, abs=1e-12)


def test_imresize_uint8_rounds_and_keeps_constants():
    img = np.full((9, 12, 3), 200, np.uint8)
    out = imresize(img, 1 / 3)
    assert out.dtype == np.uint8 and out.shape == (3, 4, 3) and (out == 200).all()
    weights, _ = resize_weights(30, 10, 1 / 3)
    np.testing.assert_allclose(weights.sum(1), 1.0)
    # 14 candidate taps; the kernel is 0 at |d| / 3 = 1 and 2, and MATLAB drops all-zero columns: 9 left,
    # by hand cubic(0, 1/3, 2/3, 4/3, 5/3) / 3 normalised
    assert weights.shape[1] == 9
    np.testing.assert_allclose(weights[3], np.array([-1, -2, 9, 21, 27, 21, 9, -2, -1]) / 81, atol=1e-12)
    lr = bicubic_downscale(_photo(51, 47), 2)
    assert lr.shape == (25, 23, 3) and lr.dtype == np.uint8


def test_upscaling_is_plain_bicubic():
    img = np.zeros((6, 6))
    img[2, 3] = 1.0
    up = imresize(img, 2.0)
    assert up.shape == (12, 12)
    # no antialiasing when enlarging: the weights are cubic(distance) of the a = -0.5 kernel
    assert up[5, 6] == pytest.approx(0.8671875**2)


# ---------------------------------------------------------------------------------------- degradations
def test_noise_is_clamped_and_unquantized():
    clean = np.full((64, 64, 3), 250, np.uint8)
    noisy = add_noise(clean, 30, np.random.default_rng(0))
    assert noisy.dtype == np.float32 and noisy.max() <= 255 and noisy.min() >= 0
    assert (noisy == 255).mean() > 0.3  # clamped at the top, as the original's test
    assert not np.allclose(noisy, np.round(noisy))
    dark = add_noise(np.full((200, 200, 3), 128, np.uint8), 30, np.random.default_rng(1))
    assert dark.std() == pytest.approx(30, rel=0.05)


@pytest.fixture
def photos(tmp_path):
    for i in range(3):
        _write(tmp_path / "train" / f"p{i}.png", _photo(110, 120, i))
    _write(tmp_path / "val" / "v0.png", _photo(64, 70, 9))
    return tmp_path


def test_sr_crops_are_aligned_with_the_benchmark_bicubic(photos):
    dm = RestorationDataModule(photos, tasks=["sr_x2"], patch_size=16, augment=False, num_workers=0)
    dm.setup("fit")
    ds = dm.train_dataset
    lq, hr, task = ds[EpochIndex(1, 0, 0)]
    assert lq.shape == (3, 16, 16) and hr.shape == (3, 32, 32) and task == 0
    full_lr = bicubic_downscale(read_rgb8(ds.records[1].hr), 2)
    lq8 = (lq.permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
    hits = [(y, x) for y in range(full_lr.shape[0] - 15) for x in range(full_lr.shape[1] - 15)
            if np.array_equal(full_lr[y:y + 16, x:x + 16], lq8)]
    assert len(hits) == 1
    y, x = hits[0]
    hr_full = read_rgb8(ds.records[1].hr)
    np.testing.assert_array_equal((hr.permute(1, 2, 0).numpy() * 255).round().astype(np.uint8),
                                  hr_full[2 * y:2 * y + 32, 2 * x:2 * x + 32])


def test_flips_keep_pairs_aligned(photos):
    dm = RestorationDataModule(photos, tasks=["sr_x2"], patch_size=24, num_workers=0)
    dm.setup("fit")
    for i in range(6):
        lq, hr, _ = dm.train_dataset[EpochIndex(i % 3, i, 0)]
        again = bicubic_downscale((hr.permute(1, 2, 0).numpy() * 255).round().astype(np.uint8), 2).astype(float)
        inner = np.abs(again[4:-4, 4:-4] - lq.permute(1, 2, 0).numpy()[4:-4, 4:-4] * 255)
        assert inner.max() <= 1.0  # the crop's own bicubic matches inside (borders differ by padding)


def test_draws_depend_on_seed_epoch_index_only_and_tasks_per_batch(photos):
    dm = RestorationDataModule(photos, tasks=["sr_x2", "denoise_sigma30"], patch_size=16, num_workers=0, batch_size=2)
    dm.setup("fit")
    ds = dm.train_dataset
    a, b = ds[EpochIndex(2, 3, 1)], ds[EpochIndex(2, 3, 1)]
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and a[2] == b[2]
    tasks = {int(ds[EpochIndex(0, e, k)][2]) for e in range(4) for k in range(4)}
    assert tasks == {0, 1}
    for batch in dm.train_dataloader():
        assert batch[2].unique().numel() == 1
        if int(batch[2][0]) == 1:
            assert batch[0].shape[1:] == batch[1].shape[1:] == (3, 16, 16)
    dm.setup("validate")
    assert len(dm.val_dataset) == 2  # one val image x two tasks
    n1, n2 = dm.val_dataset[1], dm.val_dataset[1]
    assert torch.equal(n1[0], n2[0])  # validation noise is the same every time


# ---------------------------------------------------------------------------------------- layouts
def test_benchmark_layouts(tmp_path):
    hr = _photo(40, 44)
    for root, hr_dir, lr_dir, lr_name in ((tmp_path / "Set5", "HR", "LR_bicubic/X2", "babyx2.png"),
                                          (tmp_path / "Set14", "original", "LRbicx2", "baby.png")):
        _write(root / hr_dir / "baby.png", hr)
        _write(root / lr_dir / lr_name, bicubic_downscale(hr, 2)[..., ::-1])
        records, layout = find_records(root, "val", ["sr_x2"])
        assert layout == "benchmark" and len(records) == 1 and records[0].lq["sr_x2"].name == lr_name
    _write(tmp_path / "DIV2K" / "DIV2K_valid_HR" / "0801.png", hr)
    _write(tmp_path / "DIV2K" / "DIV2K_valid_LR_bicubic" / "X2" / "0801x2.png", hr[:20, :22])
    records, layout = find_records(tmp_path / "DIV2K", "valid", ["sr_x2"])
    assert layout == "div2k" and records[0].lq["sr_x2"].name == "0801x2.png"
    _write(tmp_path / "Rain" / "rain" / "rain-001.png", hr)
    _write(tmp_path / "Rain" / "norain" / "norain-001.png", hr)
    records, layout = find_records(tmp_path / "Rain", "val", ["derain"], lq_dir="rain", gt_dir="norain")
    assert layout == "paired" and records[0].lq["derain"].name == "rain-001.png"
    _write(tmp_path / "SRF" / "image_SRF_2" / "img_001_SRF_2_HR.png", hr)
    _write(tmp_path / "SRF" / "image_SRF_2" / "img_001_SRF_2_LR.png", hr[:20, :22])
    records, layout = find_records(tmp_path / "SRF", "val", ["sr_x2"])
    assert layout == "srf" and records[0].lq["sr_x2"].name == "img_001_SRF_2_LR.png"
    _write(tmp_path / "Set5" / "HR" / "bird.png", hr)
    with pytest.raises(DatasetLayoutError, match="bird.png"):
        find_records(tmp_path / "Set5", "val", ["sr_x2"])


def test_paired_lr_files_are_used(tmp_path):
    hr = _photo(64, 64)
    _write(tmp_path / "HR" / "a.png", hr)
    marker = np.full((32, 32, 3), 77, np.uint8)
    _write(tmp_path / "LR_bicubic" / "X2" / "ax2.png", marker)
    dm = RestorationDataModule(tmp_path, val_root=tmp_path, tasks=["sr_x2"], num_workers=0)
    dm.setup("validate")
    lq, hr_t, _ = dm.val_dataset[0]
    assert lq.shape == (3, 32, 32) and torch.allclose(lq, torch.full_like(lq, 77 / 255))
    with pytest.raises(DatasetLayoutError, match="paired"):
        RestorationDataModule(tmp_path, val_root=tmp_path / "HR", tasks=["derain"], num_workers=0).setup("validate")


# ---------------------------------------------------------------------------------------- bad images
def test_bad_images_are_counted_converted_or_refused(tmp_path, caplog):
    good = _photo(100, 100)
    _write(tmp_path / "train" / "good.png", good)
    _write(tmp_path / "train" / "gray.png", good[..., 0])
    _write(tmp_path / "train" / "rgba.png", np.dstack([good, np.full(good.shape[:2], 9, np.uint8)]))
    sixteen = good.astype(np.uint16) * 257
    _write(tmp_path / "train" / "deep.png", sixteen)
    _write(tmp_path / "train" / "small.png", good[:20, :20])
    (tmp_path / "train" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really")
    _write(tmp_path / "val" / "v.png", good)
    with caplog.at_level(logging.INFO):
        dm = RestorationDataModule(tmp_path, tasks=["sr_x2"], num_workers=0)
        dm.setup("fit")
    names = sorted(r.hr.name for r in dm.train_dataset.records)
    assert names == ["deep.png", "good.png", "gray.png", "rgba.png"]
    text = caplog.text
    assert "skipped 1 unreadable" in text and "broken.png" in text and "skipped 1 too small" in text
    assert "16-bit rounded" in text and "grayscale" in text and "alpha channel dropped" in text
    np.testing.assert_array_equal(read_rgb8(tmp_path / "train" / "deep.png"), good[..., ::-1])
    np.testing.assert_array_equal(read_rgb8(tmp_path / "train" / "gray.png"), np.repeat(good[..., :1], 3, 2))
    np.testing.assert_array_equal(read_rgb8(tmp_path / "train" / "rgba.png"), good[..., ::-1])
    with pytest.raises(ImageReadError, match="broken.png"):
        RestorationDataModule(tmp_path, tasks=["sr_x2"], num_workers=0, strict=True).setup("fit")
    with pytest.raises(ImageReadError, match="broken.png"):
        read_rgb8(tmp_path / "train" / "broken.png")
