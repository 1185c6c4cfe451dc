"""Every data module of the task table keeps the contract of visiontf.data.base (VisionDataModule), built on
its task's synthetic set, and the layers above read that contract as declared attributes, never through
getattr defaults (the data side of tests/models/test_model_contract.py).

Cost: a few generated images per task; a few seconds.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from visiontf.data.base import DetectionDataModule, VisionDataModule, trainer_datamodule
from visiontf.tasks.task_inference import adapter_for_task
from visiontf.tasks.task_table import TASK_TABLE, TASKS, import_class

ROOT = Path(__file__).resolve().parents[2]


def _built(task: str, path: str, tmp_path: Path) -> VisionDataModule:
    """The data module ``path`` of ``task`` on a small set of its synthetic generator."""
    out = import_class(TASK_TABLE[task].synthetic_for(path))(tmp_path / task, num_train=2, num_val=2)
    root = out["root"] if isinstance(out, dict) else out
    return import_class(path)(root=str(root), batch_size=2, num_workers=0)


@pytest.mark.parametrize("task, path", [(t, p) for t in TASKS for p in TASK_TABLE[t].data_modules])
def test_each_data_module_keeps_the_contract_on_its_synthetic_set(task, path, tmp_path):
    dm = _built(task, path, tmp_path)
    assert isinstance(dm, VisionDataModule), f"{path} does not subclass visiontf.data.base.VisionDataModule"
    assert dm.num_classes is None or (isinstance(dm.num_classes, int) and dm.num_classes >= 1)
    if dm.class_names is not None:
        assert all(isinstance(n, str) for n in dm.class_names) and len(dm.class_names) == dm.num_classes
    if dm.label_to_cat_id is not None:
        assert all(isinstance(k, int) and isinstance(v, int) for k, v in dm.label_to_cat_id.items())
        assert sorted(dm.label_to_cat_id) == list(range(dm.num_classes))
    assert dm.batch_size == 2
    # every key is one of the task's eval settings (refused by name otherwise)
    adapter_for_task(task).settings_type.check_keys(dm.eval_transform(), f"{path}.eval_transform()")
    if isinstance(dm, DetectionDataModule):
        assert dm.val_ann_file.is_file() and dm.label_space in ("contiguous", "category_id")
        assert dm.ann_file("validate") == dm.val_ann_file


def test_a_trainer_with_another_data_module_is_refused_by_name():
    from types import SimpleNamespace

    import lightning as L

    assert trainer_datamodule(None) is None and trainer_datamodule(SimpleNamespace(datamodule=None)) is None
    with pytest.raises(TypeError, match="Plain is a LightningDataModule but not a visiontf.data.base.VisionDataModule"):
        trainer_datamodule(SimpleNamespace(datamodule=type("Plain", (L.LightningDataModule,), {})()))


#: what the base declares; reading it with a default elsewhere would hide a data module that lacks it
CONTRACT_NAMES = sorted({name for kind in (VisionDataModule, DetectionDataModule) for name in
                         (*vars(kind), *getattr(kind, "__annotations__", {})) if not name.startswith("_")})


def test_upper_layers_read_the_data_contract_without_getattr_defaults():
    root = ROOT / "visiontf"
    files = [p for sub in ("tasks", "inference", "cli", "callbacks") for p in (root / sub).rglob("*.py")]
    names = "|".join(CONTRACT_NAMES)
    pattern = re.compile(r"(getattr|hasattr)\([^,()]*(dm|datamodule|data_module)\b[^,()]*, \"(" + names + r")\"")
    found = [f"{p.relative_to(root)}: {m.group(0)}" for p in files for m in pattern.finditer(p.read_text())]
    assert not found, f"read these as declared attributes (visiontf.data.base): {found}"
    anything = re.compile(r"getattr\((dm|datamodule)\b")
    assert not [p for p in files if anything.search(p.read_text())], "a data module read through getattr is left in the upper layers"
