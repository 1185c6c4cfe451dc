"""Classification data: synthetic generator, ImageFolder dataset, pipelines and the data module."""
from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from visiontf.data.io import ImageReadError
from visiontf.tasks.classification.classification_data import (
    IMAGENET_DEFAULT_MEAN,
    IMAGENET_DEFAULT_STD,
    ClassificationDataModule,
    DatasetLayoutError,
    ImageFolderDataset,
    classification_transforms,
    find_classes,
)
from visiontf.tasks.classification.classification_synthetic import make_classification_dataset


@pytest.fixture(scope="module")
def cls_root(tmp_path_factory) -> Path:
    return make_classification_dataset(tmp_path_factory.mktemp("cls"), num_train=24, num_val=12, num_classes=3,
                                       image_size=40)


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*.png"))}


def test_generator_deterministic_and_balanced(tmp_path, cls_root):
    again = make_classification_dataset(tmp_path / "b", num_train=24, num_val=12, num_classes=3, image_size=40)
    assert _files(again) == _files(cls_root)
    other = make_classification_dataset(tmp_path / "c", num_train=24, num_val=12, num_classes=3, image_size=40,
                                        seed=1)
    assert _files(other).keys() == _files(cls_root).keys()
    assert _files(other) != _files(cls_root)
    # changing the val count must not change training images
    fewer_val = make_classification_dataset(tmp_path / "d", num_train=24, num_val=3, num_classes=3, image_size=40)
    train_only = {k: v for k, v in _files(cls_root).items() if k.startswith("train")}
    assert {k: v for k, v in _files(fewer_val).items() if k.startswith("train")} == train_only
    for split, n in (("train", 24), ("val", 12)):
        counts = [len(list(d.glob("*.png"))) for d in sorted((cls_root / split).iterdir())]
        assert counts == [n // 3] * 3
    assert Image.open(next((cls_root / "train").rglob("*.png"))).size == (40, 40)


def test_classes_differ_in_colour(cls_root):
    # the class signal must be present: mean object colour differs between classes
    means = []
    for d in sorted((cls_root / "train").iterdir()):
        imgs = np.stack([np.asarray(Image.open(p), dtype=np.float32) for p in sorted(d.glob("*.png"))])
        means.append(imgs.reshape(len(imgs), -1, 3).mean(axis=(0, 1)))
    dists = [np.abs(means[i] - means[j]).max() for i in range(3) for j in range(i + 1, 3)]
    assert min(dists) > 3.0


def test_datamodule_batches(cls_root):
    dm = ClassificationDataModule(cls_root, image_size=32, batch_size=4, num_workers=0)
    # available before setup so LightningCLI can link data.num_classes -> model.num_classes
    assert dm.num_classes == 3
    assert dm.class_names == sorted(p.name for p in (cls_root / "train").iterdir())
    dm.setup("fit")
    assert len(dm.train_dataset) == 24 and len(dm.val_dataset) == 12
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (4, 3, 32, 32) and x.dtype == torch.float32
    assert y.dtype == torch.int64 and y.shape == (4,)
    labels = torch.cat([b[1] for b in dm.val_dataloader()])
    assert labels.tolist() == sorted(labels.tolist()) and set(labels.tolist()) == {0, 1, 2}
    x, _ = next(iter(dm.val_dataloader()))
    assert x.shape == (4, 3, 32, 32)
    # normalised: roughly centred, not 0..255 or 0..1
    assert -3 < float(x.mean()) < 3 and float(x.min()) < 0
    dm.setup("predict")
    assert sum(len(b[1]) for b in dm.predict_dataloader()) == 12


def test_same_seed_same_augmentation(cls_root):
    batches = []
    for _ in range(2):
        dm = ClassificationDataModule(cls_root, image_size=24, batch_size=4, num_workers=0, seed=3,
                                      auto_augment="rand-m9-n2")
        dm.setup("fit")
        batches.append(next(iter(dm.train_dataloader())))
    assert torch.equal(batches[0][0], batches[1][0]) and torch.equal(batches[0][1], batches[1][1])


def test_eval_pipeline_normalises_and_centre_crops():
    # thirds red/green/blue, 60x120: shorter side -> floor(32/0.875)=36 so width 72; the centre 32 columns
    # (20..52 of 72) cover source columns 33.3..86.7: ~4 red columns, green, ~4 blue columns
    img = np.zeros((60, 120, 3), np.uint8)
    img[:, :40, 0] = 255
    img[:, 40:80, 1] = 255
    img[:, 80:, 2] = 255
    out = classification_transforms(32, train=False)(image=img)["image"]
    assert out.shape == (3, 32, 32)
    mean = torch.tensor(IMAGENET_DEFAULT_MEAN).view(3, 1, 1)
    std = torch.tensor(IMAGENET_DEFAULT_STD).view(3, 1, 1)
    rgb = (out * std + mean)[:, 16, :]
    assert math.floor(32 / 0.875) == 36
    assert float(rgb[0, :3].min()) > 0.9 and float(rgb[0, 6:].max()) < 0.02
    assert float(rgb[1, 6:26].min()) > 0.98
    assert float(rgb[2, -3:].min()) > 0.9 and float(rgb[2, :26].max()) < 0.02
    flat = classification_transforms(16, train=False)(image=np.full((20, 20, 3), 128, np.uint8))["image"]
    expected = (128 / 255 - mean.flatten()) / std.flatten()
    assert torch.allclose(flat.mean(dim=(1, 2)), expected, atol=1e-4)


def test_workers_get_different_augmentations(tmp_path):
    d = tmp_path / "train" / "a"
    d.mkdir(parents=True)
    img = np.random.default_rng(0).integers(0, 255, (48, 48, 3), dtype=np.uint8)
    for i in range(4):
        Image.fromarray(img).save(d / f"{i}.png")
    ds = ImageFolderDataset(tmp_path / "train", classification_transforms(24, train=True, seed=0))
    from visiontf.data.loading import loader_kwargs

    loader = torch.utils.data.DataLoader(ds, batch_size=1, shuffle=False, **loader_kwargs(2))
    outs = [b[0] for b in loader]
    # worker 0 gets samples 0, 2 and worker 1 gets 1, 3; identical seeds would give outs[0] == outs[1]
    assert not torch.equal(outs[0], outs[1])


# ---- bad input -------------------------------------------------------------------------------

def _write_tree(root: Path, spec: dict[str, int], size: int = 20) -> None:
    for cls, n in spec.items():
        (root / cls).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            Image.fromarray(np.full((size, size, 3), 40 * i, np.uint8)).save(root / cls / f"{i}.png")


def test_missing_split_names_path_and_layout(tmp_path):
    _write_tree(tmp_path / "train", {"a": 1})
    with pytest.raises(DatasetLayoutError, match=r"valid.*split folder not found.*ImageFolder layout"):
        ClassificationDataModule(tmp_path, val_split="valid", num_workers=0).setup("fit")
    with pytest.raises(DatasetLayoutError, match=str(tmp_path / "nope")):
        ClassificationDataModule(tmp_path, train_split="nope")


def test_empty_class_folder_skipped_with_warning(tmp_path, caplog):
    _write_tree(tmp_path / "train", {"a": 2, "b": 0, "c": 2})
    _write_tree(tmp_path / "val", {"a": 1, "c": 1})
    with caplog.at_level(logging.WARNING):
        dm = ClassificationDataModule(tmp_path, image_size=16, batch_size=2, num_workers=0)
    assert dm.class_names == ["a", "c"] and dm.num_classes == 2
    assert "1 empty class folder" in caplog.text and "'b'" in caplog.text
    dm.setup("fit")
    assert sorted(dm.val_dataset.targets) == [0, 1]
    # an empty val folder of a known class is fine (logged), indices unchanged
    (tmp_path / "val" / "a").joinpath("0.png").unlink()
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        ds = ImageFolderDataset(tmp_path / "val", class_names=dm.class_names)
    assert ds.targets == [1] and "hold no images" in caplog.text


def test_all_class_folders_empty_is_an_error(tmp_path):
    _write_tree(tmp_path / "train", {"a": 0, "b": 0})
    with pytest.raises(DatasetLayoutError, match="all 2 class folders are empty"):
        find_classes(tmp_path / "train")


def test_val_class_not_in_train(tmp_path):
    _write_tree(tmp_path / "train", {"a": 1, "b": 0})
    _write_tree(tmp_path / "val", {"a": 1, "b": 1})
    dm = ClassificationDataModule(tmp_path, num_workers=0)
    with pytest.raises(DatasetLayoutError, match=r"val/b.*'b' is not among the 1 training classes"):
        dm.setup("validate")


def test_corrupt_image_names_file(tmp_path):
    _write_tree(tmp_path / "train", {"a": 1})
    bad = tmp_path / "train" / "a" / "bad.png"
    good = (tmp_path / "train" / "a" / "0.png").read_bytes()
    bad.write_bytes(good[: len(good) // 2])
    ds = ImageFolderDataset(tmp_path / "train")
    idx = [p.name for p, _ in ds.samples].index("bad.png")
    with pytest.raises(ImageReadError, match=r"bad\.png.*(corrupt|truncated)"):
        ds[idx]


def test_grayscale_rgba_16bit_converted(tmp_path):
    d = tmp_path / "train" / "a"
    d.mkdir(parents=True)
    Image.fromarray(np.full((20, 30), 100, np.uint8), mode="L").save(d / "gray.png")
    rgba = np.zeros((20, 30, 4), np.uint8)
    rgba[..., 1] = 200
    rgba[..., 3] = 255
    Image.fromarray(rgba, mode="RGBA").save(d / "rgba.png")
    Image.fromarray(np.full((20, 30), 65535, np.uint16)).save(d / "deep.png")
    ds = ImageFolderDataset(tmp_path / "train")
    by_name = {p.name: ds[i][0] for i, (p, _) in enumerate(ds.samples)}
    for arr in by_name.values():
        assert arr.shape == (20, 30, 3) and arr.dtype == np.uint8
    assert (by_name["gray.png"] == 100).all()
    assert (by_name["rgba.png"][..., 1] == 200).all() and (by_name["rgba.png"][..., 0] == 0).all()
    assert (by_name["deep.png"] == 255).all()
    dm = ClassificationDataModule(tmp_path, image_size=16, batch_size=3, num_workers=0, val_split="train")
    dm.setup("validate")
    x, y = next(iter(dm.val_dataloader()))
    assert x.shape == (3, 3, 16, 16) and y.tolist() == [0, 0, 0]


def test_bad_auto_augment_fails_at_construction(cls_root):
    with pytest.raises(ValueError, match="auto_augment='augmix-m5'"):
        ClassificationDataModule(cls_root, auto_augment="augmix-m5")
