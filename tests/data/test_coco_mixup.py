"""DEIM's MixUp (``data.init_args.mixup``: :class:`visiontf.data.mixup.MixUp`): a batch mixed with itself shifted by one at
one ratio in [0.45, 0.55], both images' boxes kept, only in its epoch window, drawn the same on every run; on padded
batches, the boxes follow the union of the two images' areas."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from visiontf.core.config_checks import ConfigError
from visiontf.data.loading import EpochIndex
from visiontf.data.mixup import MixUp, MixUpCollate, mix_batch
from visiontf.tasks.detection.coco_data import CocoDataModule

SMALL = dict(scales=[96], max_size=200, crop_scales=[96], crop_size=[80, 120], val_size=96)


def _item(h, w, boxes, labels, image_id, epoch=None, value=1.0):
    target = {"boxes": torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4), "labels": torch.tensor(labels),
              "image_id": image_id, "orig_size": torch.tensor([h, w]), "size": torch.tensor([h, w])}
    if epoch is not None:
        target["epoch"] = epoch
    return torch.full((3, h, w), value), target


def test_mixing_keeps_both_images_boxes_in_the_union_of_their_areas():
    a = _item(40, 60, [[0.5, 0.5, 0.2, 0.4]], [1], 1, value=1.0)   # a 12 x 16 box at (30, 20)
    b = _item(50, 30, [[0.5, 0.2, 0.4, 0.2], [0.1, 0.9, 0.2, 0.2]], [2, 3], 2, value=3.0)
    images, mask, targets = MixUpCollate(MixUp(prob=0.0))([a, b])
    mixed, new_mask, out = mix_batch(images, mask, targets, 0.5)
    # image 0 mixes with image 1 (the batch shifted by one), image 1 with image 0
    assert mixed[0, 0, 0, 0] == 2.0 and mixed[0, 0, 45, 10] == 1.5 and mixed[0, 0, 10, 50] == 0.5
    assert not new_mask[0, 45, 10] and not new_mask[0, 10, 50] and new_mask[0, 45, 50]  # padding only where both pad
    assert out[0]["size"].tolist() == [50, 60] and out[0]["labels"].tolist() == [1, 2, 3]
    # the boxes in pixels are where they were: a's (30, 20, 12, 16) and b's (15, 10, 12, 10) and (3, 45, 6, 10)
    pixels = out[0]["boxes"] * torch.tensor([60, 50, 60, 50])
    assert torch.allclose(pixels, torch.tensor([[30.0, 20, 12, 16], [15, 10, 12, 10], [3, 45, 6, 10]]), atol=1e-5)
    assert out[1]["labels"].tolist() == [2, 3, 1] and out[1]["image_id"] == 2
    assert torch.equal(targets[0]["labels"], torch.tensor([1]))  # the inputs are left as they were


def _batch(epoch):
    return [_item(32, 32, [[0.5, 0.5, 0.2, 0.2]], [i], i + 1, epoch=epoch, value=float(i)) for i in range(4)]


def test_the_collate_mixes_in_its_window_at_one_ratio_and_drops_the_epoch():
    collate = MixUpCollate(MixUp(prob=1.0, epochs=(2, 4)), seed=0)
    for epoch in (0, 1, 4, 7):
        images, _, targets = collate(_batch(epoch))
        assert [len(t["labels"]) for t in targets] == [1] * 4 and "epoch" not in targets[0]
        assert torch.equal(images[:, 0, 0, 0], torch.arange(4.0))
    images, _, targets = collate(_batch(2))
    assert [t["labels"].tolist() for t in targets] == [[0, 3], [1, 0], [2, 1], [3, 2]]
    r = float(images[1, 0, 0, 0])  # r * 1 + (1 - r) * 0
    assert 0.45 <= r <= 0.55 and round(r, 6) == pytest.approx(r, abs=1e-6)
    assert torch.allclose(images[:, 0, 0, 0], torch.tensor([3 * (1 - r), r, 2 * r + (1 - r), 3 * r + 2 * (1 - r)]))
    again, _, _ = collate(_batch(2))
    assert torch.equal(images, again)  # a function of (seed, epoch, image ids): the same in any worker and on resume


def test_the_probability_is_per_batch():
    collate = MixUpCollate(MixUp(prob=0.5), seed=0)
    mixed = sum(len(collate(_batch(e))[2][0]["labels"]) == 2 for e in range(80))
    assert 25 < mixed < 55
    single = collate([_item(32, 32, [[0.5, 0.5, 0.2, 0.2]], [0], 1, epoch=0)])
    assert len(single[2][0]["labels"]) == 1  # one image is never mixed with itself


@pytest.fixture()
def four_images(tmp_path) -> Path:
    rng = np.random.default_rng(0)
    images, anns = [], []
    for split in ("train2017", "val2017"):
        (tmp_path / split).mkdir()
    for i in range(4):
        img = rng.integers(0, 255, (60, 80, 3), dtype=np.uint8)
        for split in ("train2017", "val2017"):
            Image.fromarray(img).save(tmp_path / split / f"{i}.png")
        images.append({"id": i + 1, "file_name": f"{i}.png", "width": 80, "height": 60})
        anns.append({"id": i + 1, "image_id": i + 1, "category_id": 1, "bbox": [10 + i, 12, 30, 24], "area": 720, "iscrowd": 0})
    (tmp_path / "annotations").mkdir()
    coco = {"images": images, "annotations": anns, "categories": [{"id": 1, "name": "thing"}]}
    for split in ("train2017", "val2017"):
        (tmp_path / "annotations" / f"instances_{split}.json").write_text(json.dumps(coco))
    return tmp_path


@pytest.mark.parametrize("schedule", [{}, {"strong_aug_epochs": [0, 3]}])
def test_the_data_module_mixes_training_batches_only(four_images, schedule):
    dm = CocoDataModule(four_images, batch_size=2, num_workers=0, mixup={"prob": 1.0, "epochs": [0, 2]}, **SMALL, **schedule)
    assert dm.hparams.mixup == {"prob": 1.0, "epochs": [0, 2], "ratio": [0.45, 0.55]}
    dm.setup("fit")
    assert dm.train_dataset[EpochIndex(0, 5)][1]["epoch"] == 5
    images, mask, targets = next(iter(dm.train_dataloader()))
    assert [len(t["labels"]) for t in targets] == [2, 2] and "epoch" not in targets[0]
    _, _, val_targets = next(iter(dm.val_dataloader()))
    assert all(len(t["labels"]) == 1 and "epoch" not in t for t in val_targets)


def test_bad_sections_are_named(four_images):
    with pytest.raises(ConfigError, match="mixup.prob"):
        CocoDataModule(four_images, mixup={"prob": 2.0})
    with pytest.raises(ConfigError, match="mixup: unknown field"):
        CocoDataModule(four_images, mixup={"p": 0.5})
    with pytest.raises(ConfigError, match="mixup.epochs"):
        CocoDataModule(four_images, mixup={"prob": 0.5, "epochs": [5, 2]})
