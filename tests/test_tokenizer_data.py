"""TokenizerDataModule: any folder (recursively), random crops drawn from (seed, epoch, index), held-out
splits, unreadable images skipped with a count or refused by name, the photos set of tools/make_synthetic.py."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from visiontf.data.image_folder import ImageFolderDataset, TokenizerDataModule, list_images
from visiontf.data.io import ImageReadError
from visiontf.data.loading import DatasetLayoutError, EpochIndex


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
