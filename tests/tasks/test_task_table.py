"""The task table (visiontf/tasks/task_table.py): every row names classes that exist and agree with
it, and every reader takes its list of tasks from there.

Cost: imports of the task and data modules, no model; a few seconds.
"""
from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest

from visiontf.data.base import VisionDataModule
from visiontf.tasks.task_inference import adapter_for_task, infer_task
from visiontf.tasks.task_table import (
    TASK_TABLE,
    TASKS,
    data_module_class_paths,
    import_class,
    task_class_paths,
)


@pytest.mark.parametrize("task", TASKS)
def test_each_row_names_its_adapter_modules_and_data(task):
    row = TASK_TABLE[task]
    assert adapter_for_task(task).task == task
    for path in row.modules:
        cls = import_class(path)
        assert issubclass(cls, L.LightningModule) and cls.task == task, path
    for path in row.data_modules:
        assert issubclass(import_class(path), VisionDataModule), path


def test_the_training_cli_imports_every_row_for_short_class_paths():
    """In a fresh process (this one may have imported them already): importing the CLI imports every row."""
    import subprocess
    import sys

    paths = [*task_class_paths(), *data_module_class_paths()]
    code = ("import sys, visiontf.cli.train; "
            f"print([p for p in {paths!r} if p.rpartition('.')[0] not in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_infer_task_names_the_table_in_its_error():
    from torch import nn

    with pytest.raises(ValueError, match=", ".join(TASKS)):
        infer_task(nn.Linear(2, 2))


def test_the_predictor_has_no_task_named_methods():
    """What differs by task is the adapter's (preprocessing modules, ``predict``, ``logits``), not the Predictor's."""
    from visiontf.inference.predictor import Predictor

    named = [n for n in vars(Predictor) if any(t in n for t in (*TASKS, "classif", "detect", "segment", "restor"))]
    assert not named, f"Predictor methods named after a task: {named}"


def test_every_config_names_a_task_and_a_data_module_of_the_table():
    """A config whose class paths the table lacks trains, but its checkpoints are then refused by the class-path
    check (visiontf.tasks.checkpoints.checkpoint_arguments): the panoptic data module once was."""
    import yaml

    from visiontf.tasks.task_table import data_module_class_paths, task_class_paths

    root = Path(__file__).resolve().parents[2] / "configs"
    missing = []
    for path in sorted(root.rglob("*.yaml")):
        cfg = yaml.safe_load(path.read_text()) or {}
        model, data = (cfg.get("model") or {}).get("class_path"), (cfg.get("data") or {}).get("class_path")
        if model and model not in task_class_paths():
            missing.append(f"{path.name}: model {model}")
        if data and data not in data_module_class_paths():
            missing.append(f"{path.name}: data {data}")
    assert not missing, missing
