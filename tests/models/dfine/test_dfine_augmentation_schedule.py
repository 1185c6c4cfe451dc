"""The real-time DETRs' augmentation schedule on CocoDataModule (``strong_aug_epochs``, ``mosaic_epochs``): D-FINE stops
its strong augmentation for the last epochs, DEIM also starts it late and draws mosaics (its dense one-to-one
matching) only in the first half. Each sample's epoch comes with its key, so the stage is the same in any worker and
on resume."""
from __future__ import annotations

import json
from pathlib import Path

import albumentations as A
import numpy as np
import pytest
from PIL import Image

from visiontf.core.config_checks import ConfigError
from visiontf.data.loading import EpochIndex
from visiontf.data.transforms import detection as DT
from visiontf.data.transforms.detection import AugmentationSchedule
from visiontf.tasks.detection.coco_data import CocoDataModule, ScheduledCocoDetection

SMALL = dict(scales=[96, 112, 128], max_size=200, crop_scales=[96, 112, 128], crop_size=[80, 120], val_size=104)


@pytest.fixture()
def four_images(tmp_path) -> Path:
    """Four 60 x 80 images with one box each, as train and val splits."""
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


def test_the_stages_follow_the_epochs():
    deim = AugmentationSchedule(strong_epochs=(4, 50), mosaic_epochs=(4, 29))  # DEIM-D-FINE-L's [4, 29, 50]
    stages = {epoch: deim.stage(epoch, mosaic=True) for epoch in (0, 3, 4, 28, 29, 49, 50, 57)}
    assert stages == {0: "weak", 3: "weak", 4: "mosaic", 28: "mosaic", 29: "strong", 49: "strong", 50: "plain", 57: "plain"}
    dfine = AugmentationSchedule(strong_epochs=(0, 72))  # D-FINE-L: strong until epoch 72 of 80
    assert [dfine.stage(e, mosaic=False) for e in (0, 71, 72, 79)] == ["strong", "strong", "plain", "plain"]
    assert AugmentationSchedule().stage(1000, mosaic=True) == "mosaic" and deim.stage(None, mosaic=True) == "mosaic"
    with pytest.raises(ValueError, match="start <= stop"):
        AugmentationSchedule(strong_epochs=(5, 2))


def test_the_data_module_switches_the_strong_augmentation_off_in_the_last_epochs(four_images):
    dm = CocoDataModule(four_images, batch_size=2, num_workers=0, mosaic=1.0, strong_aug_epochs=[1, 3], mosaic_epochs=[1, 2], **SMALL)
    dm.setup("fit")
    ds = dm.train_dataset
    assert isinstance(ds, ScheduledCocoDetection) and not isinstance(dm.val_dataset, ScheduledCocoDetection)
    assert isinstance(ds.pipelines["mosaic"].transforms[0], A.Mosaic)
    assert not any(isinstance(t, A.Mosaic) for stage in ("strong", "weak", "plain") for t in ds.pipelines[stage].transforms)
    for epoch, stage in ((0, "weak"), (1, "mosaic"), (2, "strong"), (3, "plain"), (9, "plain")):
        counts, sizes = [], set()
        for index in range(4):
            image, target = ds[EpochIndex(index, epoch)]
            counts.append(len(target["labels"]))
            sizes.add(tuple(image.shape[-2:]))
        assert ds.transform is ds.pipelines[stage], epoch
        if stage == "mosaic":  # four images' boxes in one (a crop may cut some)
            assert max(counts) > 1, counts
        else:
            assert max(counts) == 1
        if stage == "plain":  # one resize to the evaluation size, as the evaluation's own (60 x 80 -> 104 x 138)
            assert sizes == {DT.resized_hw(60, 80, 104, 200)}, sizes
    # a sample's augmentation is a function of its key: the same image and boxes again
    first, again = ds[EpochIndex(2, 1)], ds[EpochIndex(2, 1)]
    assert (first[0] == again[0]).all() and (first[1]["boxes"] == again[1]["boxes"]).all()


def test_without_a_schedule_the_training_set_is_the_plain_one(four_images):
    dm = CocoDataModule(four_images, batch_size=2, num_workers=0, **SMALL)
    dm.setup("fit")
    assert type(dm.train_dataset).__name__ == "CocoDetection"
    with pytest.raises(ConfigError, match="strong_aug_epochs"):
        CocoDataModule(four_images, batch_size=2, num_workers=0, strong_aug_epochs=[3, 1], **SMALL)


def test_the_data_module_logs_what_each_epoch_gets_once(four_images, caplog):
    """The windows are epochs in a config, far from the run: the log says once what each epoch gets."""
    with caplog.at_level("INFO", logger="visiontf.tasks.detection.coco_data"):
        CocoDataModule(four_images, num_workers=0, mosaic=0.5, strong_aug_epochs=[4, 50], mosaic_epochs=[4, 29],
                       mixup={"prob": 0.5, "epochs": [4, 29]}, **SMALL)
    lines = [r.getMessage() for r in caplog.records if "training augmentation by epoch" in r.getMessage()]
    assert lines == ["training augmentation by epoch: epochs 0-3: a flip and the multi-scale resize; epochs 4-49: the "
                     "strong augmentation (the random crop, mosaics with probability 0.5 in epochs 4-28); from epoch 50: "
                     "a flip and one resize to the evaluation size; MixUp with probability 0.5 in epochs 4-28"]
    caplog.clear()
    with caplog.at_level("INFO", logger="visiontf.tasks.detection.coco_data"):  # no schedule: nothing to say
        CocoDataModule(four_images, num_workers=0, **SMALL)
    assert not [r for r in caplog.records if "training augmentation by epoch" in r.getMessage()]
