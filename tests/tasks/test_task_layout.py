"""The layout of the task packages: one package per task, every module file name used once, and adding a task touches
at most five places (docs/architecture.md, "How to add a task"), counted here from the task table.

Cost: imports the registry and the task table, reads file names; about a second.
"""
from __future__ import annotations

import inspect
from collections import defaultdict
from pathlib import Path

import pytest

from visiontf.models import get_entry, list_models
from visiontf.tasks.task_table import TASK_TABLE, TASKS, import_class

ROOT = Path(__file__).resolve().parents[2]
#: writers of sets that several tasks read (restoration's and generation's photos): shared data machinery
SHARED_WRITERS = "visiontf/data/synthetic/"
#: the file names every model family may have (the per-family conventions)
FAMILY_CONVENTIONS = {"__init__.py", "convert.py", "build.py"}


def _source(path: str) -> str:
    """The file of a ``module.Class`` or ``module:function`` path, relative to the repository."""
    return str(Path(inspect.getfile(import_class(path))).relative_to(ROOT))


def places(task: str) -> dict[str, set[str]]:
    """Where ``task`` lives, read from its row: its package, its models, its registration, configs and docs."""
    row = TASK_TABLE[task]
    code = [row.adapter, *row.modules, *row.data_modules, row.synthetic, *row.data_synthetic.values()]
    files = {_source(p) for p in code}
    packages = {str(Path(f).parent) for f in files if not f.startswith(SHARED_WRITERS)}
    models = {str(Path(inspect.getfile(get_entry(name).fn)).relative_to(ROOT))
              for name in list_models() if get_entry(name).tags[:1] == (task,)}
    kinds = {_source(kind) for kind in row.model_kinds}
    return {"package": packages, "model": models | kinds, "registration": {"visiontf/tasks/task_table.py"},
            "config": {f"configs/{task}"}, "docs": {f"docs/{task}.md"}}


@pytest.mark.parametrize("task", TASKS)
def test_everything_of_a_task_is_in_its_package(task):
    assert places(task)["package"] == {f"visiontf/tasks/{task}"}


def test_the_depth_example_touches_five_places():
    found = places("depth")
    assert len(found) == 5 and all(found.values())
    assert all(f.startswith("visiontf/models/") for f in found["model"]), found["model"]
    for paths in found.values():
        for path in paths:
            assert (ROOT / path).exists(), path
    doc = (ROOT / "docs/architecture.md").read_text()
    assert "touches five places" in doc and "`visiontf/tasks/depth/`" in doc


def test_no_two_modules_share_a_file_name():
    names = defaultdict(list)
    for path in (ROOT / "visiontf").rglob("*.py"):
        if path.name not in FAMILY_CONVENTIONS:
            names[path.name].append(str(path.relative_to(ROOT)))
    assert not {k: v for k, v in names.items() if len(v) > 1}


def test_adapters_and_detection_are_no_package_names():
    """``adapters`` read as LoRA adapters; set prediction (matcher, criterion) is ``visiontf/set_prediction``."""
    for gone in ("visiontf/adapters", "visiontf/detection"):
        assert not list((ROOT / gone).rglob("*.py")), gone
