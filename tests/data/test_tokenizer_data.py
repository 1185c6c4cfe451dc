"""TokenizerDataModule: any folder (recursively), random crops drawn from (seed, epoch, index), held-out
splits, unreadable images skipped with a count or refused by name, the photos set of tools/make_synthetic.py."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from visiontf.data.io import ImageReadError
from visiontf.data.loading import DatasetLayoutError, EpochIndex
from visiontf.tasks.generation.image_folder_data import ImageFolderDataset, TokenizerDataModule, list_images


def _write(path, size=(40, 56), value=None, seed=0):
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    arr = rng.integers(0, 256, (*size, 3), dtype=np.uint8) if value is None else np.full((*size, 3), value, np.uint8)
    Image.fromarray(arr).save(path)
    return path


@pytest.fixture()
def folder(tmp_path):
    root = tmp_path / "imgs"
    _write(root / "a.png", seed=1)
    _write(root / "deeper" / "b.jpg", (64, 48), seed=2)
    _write(root / "deeper" / "even" / "c.png", (33, 70), seed=3)
    (root / ".hidden").mkdir()
    _write(root / ".hidden" / "x.png")
    (root / "notes.txt").write_text("not an image")
    return root


def test_lists_images_recursively_without_hidden(folder):
    assert [p.name for p in list_images(folder)] == ["a.png", "b.jpg", "c.png"]


def test_empty_or_missing_folder_is_refused(tmp_path):
    with pytest.raises(DatasetLayoutError, match="not found"):
        list_images(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetLayoutError, match="no images"):
        list_images(tmp_path / "empty")


def test_train_crops_are_seeded_by_epoch_and_index(folder):
    ds = ImageFolderDataset(list_images(folder), 32, train=True, max_scale=1.0, repeat=2, seed=5)
    assert len(ds) == 6
    a, b = ds[EpochIndex(1, 0)][0], ds[EpochIndex(1, 0)][0]
    assert a.shape == (3, 32, 32) and torch.equal(a, b)
    assert a.min() >= -1 and a.max() <= 1
    assert not torch.equal(a, ds[EpochIndex(1, 1)][0])  # another epoch, another crop


def test_val_split_and_centre_crops(folder):
    dm = TokenizerDataModule(str(folder), val_count=1, crop_size=16, val_size=24, batch_size=2, num_workers=0)
    dm.setup("fit")
    assert len(dm.train_dataset.files) == 2 and [p.name for p in dm.val_dataset.files] == ["c.png"]
    (x,) = next(iter(dm.val_dataloader()))
    assert x.shape == (1, 3, 24, 24)
    with pytest.raises(DatasetLayoutError, match="leaves no training image"):
        TokenizerDataModule(str(folder), val_count=3, num_workers=0).setup("fit")


def test_unreadable_images_are_skipped_and_counted_or_refused(folder):
    bad = folder / "broken.png"
    bad.write_bytes(b"not a png at all")
    files = list_images(folder)
    ds = ImageFolderDataset(files, 16, train=True, seed=0)
    i = files.index(bad)
    x = ds[EpochIndex(i, 0)][0]  # the next readable image instead
    assert x.shape == (3, 16, 16) and ds.skipped == {bad}
    strict = ImageFolderDataset(files, 16, train=True, on_bad_image="raise")
    with pytest.raises(ImageReadError, match="broken.png"):
        strict[EpochIndex(i, 0)]


def test_photos_set_is_written_without_download(tmp_path):
    pytest.importorskip("skimage")
    from visiontf.data.synthetic.photos import make_photos_dataset

    out = make_photos_dataset(tmp_path / "photos", num_train=2, num_val=1)
    assert sorted(p.name for p in (out / "train").iterdir()) == ["astronaut.png", "rocket.png"]
    assert [p.name for p in (out / "val").iterdir()] == ["coffee.png"]


def _crop_stats(ds, n=24):
    crops = torch.stack([ds[EpochIndex(0, i)][0] for i in range(n)])
    return crops, (crops - crops.mean(1, keepdim=True)).abs().mean().item()


def test_color_augment_is_off_by_default_and_colours_grayscale_crops(tmp_path):
    # one grayscale photo: without the option every crop stays gray, with it most crops get colour
    rng = np.random.default_rng(0)
    gray = np.repeat(rng.integers(0, 256, (48, 48, 1), dtype=np.uint8), 3, axis=2)
    Image.fromarray(gray).save(tmp_path / "gray.png")
    files = list_images(tmp_path)
    plain = ImageFolderDataset(files, 32, train=True, seed=3)
    assert plain.transform is None
    assert _crop_stats(plain)[1] < 1e-6
    dm = TokenizerDataModule(str(tmp_path), crop_size=32, batch_size=2, num_workers=0)
    dm.setup("fit")
    assert dm.train_dataset.transform is None  # the data module's default too
    coloured, colourfulness = _crop_stats(ImageFolderDataset(files, 32, train=True, seed=3, color_augment=True))
    assert colourfulness > 0.02
    assert coloured.min() >= -1 and coloured.max() <= 1 and coloured.dtype == torch.float32


def test_color_augment_keeps_geometry_and_is_seeded(tmp_path):
    # a colour photo with a left-to-right ramp: the change is per pixel (no move), the flip is the crop's own
    ramp = np.tile(np.linspace(0, 255, 48, dtype=np.uint8)[None, :, None], (48, 1, 3))
    ramp[..., 1] //= 2
    Image.fromarray(ramp).save(tmp_path / "ramp.png")
    files = list_images(tmp_path)
    plain = ImageFolderDataset(files, 32, train=True, seed=7)
    aug = ImageFolderDataset(files, 32, train=True, seed=7, color_augment=True)
    again = ImageFolderDataset(files, 32, train=True, seed=7, color_augment=True)
    other_seed = ImageFolderDataset(files, 32, train=True, seed=8, color_augment=True)
    changed = 0
    for i in range(12):
        p, a = plain[EpochIndex(2, i)][0], aug[EpochIndex(2, i)][0]
        assert torch.equal(a, again[EpochIndex(2, i)][0])  # same (seed, epoch, index): same colours
        changed += not torch.equal(a, p)
        # the ramp's direction survives any colour change but the negative: rows of the crop stay identical
        assert torch.allclose(a, a[:, :1].expand_as(a), atol=2 / 127.5)
    assert changed >= 8
    assert any(not torch.equal(aug[EpochIndex(2, i)][0], other_seed[EpochIndex(2, i)][0]) for i in range(12))
    # evaluation crops never change colour
    assert ImageFolderDataset(files, 32, train=False, color_augment=True).transform is None


def test_color_augment_keeps_hues(tmp_path):
    # a red photo stays red: channel swaps, full hue turns and negatives would teach a small tokenizer
    # that colour is noise, and it would reconstruct photos grayscale
    rng = np.random.default_rng(1)
    red = np.stack([rng.integers(170, 230, (48, 48)), rng.integers(30, 70, (48, 48)),
                    rng.integers(20, 60, (48, 48))], axis=2).astype(np.uint8)
    Image.fromarray(red).save(tmp_path / "red.png")
    aug = ImageFolderDataset(list_images(tmp_path), 32, train=True, seed=5, color_augment=True)
    for i in range(24):
        crop = aug[EpochIndex(1, i)][0]
        r, g, b = crop.mean(dim=(1, 2)).tolist()
        assert r > g + 0.2 and r > b + 0.2, (i, r, g, b)
