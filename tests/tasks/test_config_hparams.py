"""A task and its data module must never save one hyper-parameter name with two values: Lightning
merges both into the logged hparams and refuses the run ("present in both ... different values").

A task option named like a data-module option (the segmentation task's former ``eval_protocol``)
broke every fit of the generic segmentation layout that way; these checks catch the next one before
a user does.
"""
from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from visiontf.core.config_files import read_config
from visiontf.tasks.classification.classification_data import ClassificationDataModule
from visiontf.tasks.classification.classification_task import ClassificationTask
from visiontf.tasks.detection.coco_data import CocoDataModule
from visiontf.tasks.detection.detection_task import DetectionTask
from visiontf.tasks.segmentation.segmentation_data import SegmentationDataModule
from visiontf.tasks.segmentation.segmentation_task import SegmentationTask

ROOT = Path(__file__).resolve().parents[2]
PAIRS = [(ClassificationTask, ClassificationDataModule), (DetectionTask, CocoDataModule),
         (SegmentationTask, SegmentationDataModule)]
#: names both sides take on purpose; each must hold one value in a run (num_classes is linked by the CLI)
SHARED_ON_PURPOSE = {"num_classes", "crop_size", "ignore_index"}


def _params(cls) -> dict[str, inspect.Parameter]:
    return {k: v for k, v in inspect.signature(cls.__init__).parameters.items() if k != "self"}


@pytest.mark.parametrize("task, data", PAIRS, ids=[t.__name__ for t, _ in PAIRS])
def test_tasks_and_data_modules_share_no_new_argument_names(task, data):
    shared = set(_params(task)) & set(_params(data))
    assert shared <= SHARED_ON_PURPOSE, f"{task.__name__} and {data.__name__} both take {sorted(shared - SHARED_ON_PURPOSE)}"


@pytest.mark.parametrize("config", sorted(p.relative_to(ROOT) for p in (ROOT / "configs").rglob("*.yaml")
                                           if "_base" not in p.parts), ids=str)
def test_every_config_gives_shared_names_one_value(config):
    import importlib

    cfg = read_config(ROOT / config)  # with its base files

    def cls_and_args(section: str):
        class_path = cfg[section]["class_path"]
        module, name = class_path.rsplit(".", 1)
        return getattr(importlib.import_module(module), name), cfg[section].get("init_args") or {}

    (task, model), (data, data_args) = cls_and_args("model"), cls_and_args("data")
    task_params, data_params = _params(task), _params(data)
    for key in (set(task_params) & set(data_params)) - {"num_classes"}:  # num_classes: linked by the CLI
        ours = model.get(key, task_params[key].default)
        theirs = data_args.get(key, data_params[key].default)
        assert ours == theirs, f"{config}: model.{key}={ours!r} but data.{key}={theirs!r} (defaults included)"
