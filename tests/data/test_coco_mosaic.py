"""The training mosaic (CocoDataModule(mosaic=p), DEIM's dense one-to-one matching): four images in one,
every box on its own object and labelled with its own image's class, reproducible per sample key."""
from __future__ import annotations

import json
from pathlib import Path

import albumentations as A
import numpy as np
import pytest
import torch
from PIL import Image

from visiontf.core.config_checks import ConfigError
from visiontf.data.loading import EpochIndex
from visiontf.data.transforms import detection as DT
from visiontf.tasks.detection.coco_annotations import AnnotationError
from visiontf.tasks.detection.coco_data import CocoDataModule

MEAN = np.array(DT.IMAGENET_MEAN)[:, None, None]
STD = np.array(DT.IMAGENET_STD)[:, None, None]
# image i holds one rectangle of category i + 1, in that category's colour, on grey
COLOURS = {1: (255, 0, 0), 2: (0, 255, 0), 3: (0, 0, 255), 4: (255, 255, 0)}
H, W = 60, 80
SMALL = dict(scales=[96, 112, 128], max_size=200, crop_scales=[96, 112, 128], crop_size=[80, 120], val_size=96)


@pytest.fixture()
def four_images(tmp_path) -> Path:
    for split in ("train2017", "val2017"):
        (tmp_path / split).mkdir()
    images, anns = [], []
    rng = np.random.default_rng(0)
    for i, cat in enumerate(COLOURS):
        img = np.full((H, W, 3), 128, np.uint8)
        x, y, w, h = int(rng.integers(0, 40)), int(rng.integers(0, 25)), 30 + 2 * i, 24 + i
        img[y:y + h, x:x + w] = COLOURS[cat]
        for split in ("train2017", "val2017"):
            Image.fromarray(img).save(tmp_path / split / f"{i}.png")  # lossless: colours stay pure
        images.append({"id": i + 1, "file_name": f"{i}.png", "width": W, "height": H})
        anns.append({"id": i + 1, "image_id": i + 1, "category_id": cat, "bbox": [x, y, w, h], "area": w * h, "iscrowd": 0})
    (tmp_path / "annotations").mkdir()
    coco = {"images": images, "annotations": anns, "categories": [{"id": c, "name": f"c{c}"} for c in COLOURS]}
    for split in ("train2017", "val2017"):
        (tmp_path / "annotations" / f"instances_{split}.json").write_text(json.dumps(coco))
    return tmp_path


def _pixels(image: torch.Tensor) -> np.ndarray:
    return ((image.numpy() * STD + MEAN) * 255.0).transpose(1, 2, 0)


def test_every_mosaic_box_sits_on_an_object_of_its_own_class(four_images):
    dm = CocoDataModule(four_images, batch_size=2, num_workers=0, mosaic=1.0, **SMALL)
    dm.setup("fit")
    ds = dm.train_dataset
    assert isinstance(ds.transforms.transforms[0], A.Mosaic) and ds.mosaic
    assert not dm.val_dataset.mosaic and not any(isinstance(t, A.Mosaic) for t in dm.val_dataset.transforms.transforms)
    counts, checked = [], 0
    for epoch in range(6):
        for index in range(4):
            image, target = ds[EpochIndex(index, epoch)]
            th, tw = target["size"].tolist()
            pix = _pixels(image)
            counts.append(len(target["labels"]))
            for (cx, cy, bw, bh), label in zip(target["boxes"].tolist(), target["labels"].tolist()):
                x0, y0, x1, y1 = (cx - bw / 2) * tw, (cy - bh / 2) * th, (cx + bw / 2) * tw, (cy + bh / 2) * th
                if x1 - x0 < 6 or y1 - y0 < 6:  # a sliver left by a crop: interpolation blurs it away
                    continue
                # the middle of the box is its object's colour: geometry and the label lookup both right
                inner = pix[int(y0 + (y1 - y0) * 0.3):int(y1 - (y1 - y0) * 0.3) + 1, int(x0 + (x1 - x0) * 0.3):int(x1 - (x1 - x0) * 0.3) + 1]
                colour = np.array(COLOURS[ds.label_to_cat_id[label]])
                assert np.abs(inner.reshape(-1, 3).mean(0) - colour).max() < 40, (epoch, index, label)
                checked += 1
    # four images' objects in one (a crop may cut some away): the mosaic was applied and its boxes kept
    assert np.mean(counts) > 2.5 and max(counts) == 4, counts
    assert checked > 50


def test_the_mosaic_is_the_same_for_the_same_sample_key(four_images):
    """Partners and placement come from the sample's seeded generator: a resumed run sees the same images."""
    dm = CocoDataModule(four_images, batch_size=2, num_workers=0, mosaic=1.0, **SMALL)
    dm.setup("fit")
    key = EpochIndex(2, 3)
    (a, ta), (b, tb) = dm.train_dataset[key], dm.train_dataset[key]
    assert torch.equal(a, b) and torch.equal(ta["boxes"], tb["boxes"]) and torch.equal(ta["labels"], tb["labels"])
    other, _ = dm.train_dataset[EpochIndex(2, 4)]
    assert other.shape != a.shape or not torch.equal(other, a)


def test_mosaic_settings_are_checked(four_images):
    with pytest.raises(ConfigError, match=r"data.init_args.mosaic=1.5: must be a number in \[0, 1\]"):
        CocoDataModule(four_images, mosaic=1.5)
    coco = json.loads((four_images / "annotations" / "instances_train2017.json").read_text())
    for im in coco["images"]:
        del im["width"], im["height"]
    (four_images / "annotations" / "instances_train2017.json").write_text(json.dumps(coco))
    dm = CocoDataModule(four_images, num_workers=0, mosaic=0.5, **SMALL)
    with pytest.raises(AnnotationError, match="instances_train2017.json: data.init_args.mosaic needs the images' width and height"):
        dm.setup("fit")
    with pytest.raises(ValueError, match="mosaic needs mosaic_cell"):
        DT.build_train_transforms(mosaic=0.5)


def test_images_without_boxes_take_part_in_a_mosaic():
    t = DT.build_train_transforms(scales=[96], max_size=200, crop_scales=[96], crop_size=[80, 120], mosaic=1.0,
                                  mosaic_cell=(60, 80), seed=0)
    empty = {"image": np.zeros((60, 80, 3), np.uint8), "bboxes": np.zeros((0, 4), np.float32),
             "labels": np.zeros(0, np.int64), "ann_index": np.zeros(0, np.int64)}
    out = t(**empty, mosaic_metadata=[dict(empty) for _ in range(3)])
    assert out["image"].shape[-2] == 96 and len(out["bboxes"]) == 0
