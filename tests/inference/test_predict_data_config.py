"""tools/predict.py and tools/export.py read a ``--config``'s data section (with ``--data.*``
overrides) through jsonargparse, as tools/train.py does: values are type-checked and coerced, an
unknown key is refused naming it, a short class_path resolves, the data stays optional.

Cost: one hand-made COCO set of 6 tiny images; the data modules' imports (a few seconds).
"""
from __future__ import annotations

import logging

import pytest
from handmade_data import make_dataset

from visiontf.cli.predict import datamodule_from_config
from visiontf.core.errors import UsageError

CONFIG = "configs/detr/detr_tiny_shapes.yaml"  # data: visiontf.tasks.detection.coco_data.CocoDataModule, root data/demo_det
PATHS = {"train_images": "images/train", "val_images": "images/val",
         "init_args.train_ann": "annotations/train.json", "init_args.val_ann": "annotations/val.json"}


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return str(make_dataset(tmp_path_factory.mktemp("data") / "coco", "coco"))


def test_a_typed_override_is_coerced_and_a_short_class_path_resolves(root):
    dm, init_args = datamodule_from_config(CONFIG, {"root": root, **PATHS, "init_args.batch_size": "4"}, required=True)
    assert type(dm).__name__ == "CocoDataModule"
    assert dm.batch_size == 4 and type(dm.batch_size) is int  # the command line's "4", read as the int it is typed
    assert init_args["batch_size"] == 4 and init_args["root"] == root
    assert dm.class_names == ["circle", "square", "bar"]
    # a short class name (as LightningCLI takes it) is one of the task table's data modules
    dm, _ = datamodule_from_config(CONFIG, {"class_path": "CocoDataModule", "root": root, **PATHS}, required=True)
    assert type(dm).__name__ == "CocoDataModule"


@pytest.mark.parametrize("override, message", [
    ({"rot": "x"}, "--data.init_args.rot: not an option of CocoDataModule; did you mean root?"),
    ({"init_args.batch_size": "four"}, "--data.init_args.batch_size: expected an int, got four"),
])
def test_an_unknown_key_or_a_wrong_type_is_refused_naming_it(root, override, message):
    with pytest.raises(UsageError) as error:
        datamodule_from_config(CONFIG, {"root": root, **override}, required=True)
    assert str(error.value) == f"{message} (--config {CONFIG}'s data section with the --data.* options)"


def test_the_data_is_optional_unless_data_options_were_given(tmp_path, caplog):
    # the config's data/demo_det is not there: a warning, no data module
    missing = str(tmp_path / "moved")
    with caplog.at_level(logging.WARNING, logger="visiontf.cli.predict"):
        dm, init_args = datamodule_from_config(CONFIG, {"root": missing}, required=False)
    assert dm is None and init_args["root"] == missing
    assert "could not build the data module visiontf.tasks.detection.coco_data.CocoDataModule" in caplog.text
    assert "dataset root not found" in caplog.text
    with pytest.raises(Exception, match="dataset root not found"):
        datamodule_from_config(CONFIG, {"root": missing}, required=True)


def test_config_mistakes_are_usage_errors(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("data: [unclosed\n")
    no_data = tmp_path / "model_only.yaml"
    no_data.write_text("model:\n  class_path: visiontf.tasks.detection.detection_task.DetectionTask\n")
    with pytest.raises(UsageError, match=r"--data.root needs --config \(the config names the data module\)"):
        datamodule_from_config(None, {"root": "x"})
    with pytest.raises(UsageError, match="nope.yaml: file not found"):
        datamodule_from_config(tmp_path / "nope.yaml")
    with pytest.raises(UsageError, match="bad.yaml: not valid YAML"):
        datamodule_from_config(bad)
    assert datamodule_from_config(no_data) == (None, {})
    with pytest.raises(UsageError, match="--data.root: .*model_only.yaml has no data section"):
        datamodule_from_config(no_data, {"root": "x"}, required=True)
