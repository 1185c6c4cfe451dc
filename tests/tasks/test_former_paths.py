"""Configs and checkpoints written before the task packages name task and data module classes at
their former modules (``visiontf.data.coco.CocoDataModule``, ``visiontf.tasks.transformer.TransformerTask``):
they still load, and the checkpoint allow-list stays as strict as it was.

Cost: one hand-made COCO set of 6 tiny images, an ipt_tiny of four channels; a few seconds.
"""
from __future__ import annotations

import lightning as L
import pytest
import torch
from handmade_data import make_dataset

from visiontf.core.former_paths import FORMER_MODULES
from visiontf.tasks.checkpoints import CheckpointError, checkpoint_arguments, load_task_checkpoint
from visiontf.tasks.task_table import data_module_class_paths, import_class, task_class_paths

SMALL = {"scale": 2, "n_feats": 4, "num_layers": 1, "num_heads": 2}


def _former(class_path: str) -> str:
    """``class_path`` spelled at its module's former name."""
    module, _, name = class_path.rpartition(".")
    return next(f"{old}.{name}" for old, new in FORMER_MODULES.items() if new == module)


@pytest.mark.parametrize("class_path", [*task_class_paths(), *data_module_class_paths()])
def test_every_task_and_data_module_resolves_at_its_former_path(class_path):
    """What jsonargparse and LightningCLI do with a config's class_path: import the module, take the class."""
    assert import_class(_former(class_path)) is import_class(class_path)


def test_only_the_table_is_answered_and_real_modules_come_first():
    import importlib.machinery
    import sys

    from visiontf.core import former_paths

    finder = next(f for f in sys.meta_path if isinstance(f, former_paths._FormerModuleFinder))
    # asked after the finder of files: a module that exists is never shadowed
    assert sys.meta_path.index(finder) > sys.meta_path.index(importlib.machinery.PathFinder)
    assert finder.find_spec("visiontf.adapters.detection") is None  # moved, not named by configs: gone
    assert finder.find_spec("visiontf.data.coco").name == "visiontf.data.coco"
    import visiontf.tasks.detection as package

    assert package.__file__.endswith("tasks/detection/__init__.py")  # a package now: the file wins


def test_a_config_with_the_former_data_class_path_builds_its_data_module(tmp_path):
    from visiontf.cli.predict import datamodule_from_config

    root = make_dataset(tmp_path / "coco", "coco")
    config = tmp_path / "old.yaml"
    config.write_text("data:\n  class_path: visiontf.data.coco.CocoDataModule\n  init_args:\n"
                      f"    root: {root}\n    train_images: images/train\n    val_images: images/val\n"
                      "    train_ann: annotations/train.json\n    val_ann: annotations/val.json\n    batch_size: 2\n")
    dm, _ = datamodule_from_config(str(config), {}, required=True)
    assert type(dm) is import_class("visiontf.tasks.detection.coco_data.CocoDataModule") and dm.batch_size == 2


def _restoration_checkpoint(task_path: str, data_path: str) -> dict:
    """What ``tools/train.py fit`` wrote for an ``ipt_tiny`` run, with the class paths given."""
    from visiontf.tasks.restoration.restoration_task import RestorationTask

    torch.manual_seed(0)
    task = RestorationTask("ipt_tiny", model_kwargs=dict(SMALL), lr=1e-3, schedule="constant")
    instantiator = "lightning.pytorch.cli.instantiate_module"
    return {"epoch": 0, "global_step": 0, "pytorch-lightning_version": L.__version__, "state_dict": task.state_dict(),
            "callbacks": {}, "optimizer_states": [], "lr_schedulers": [], "hparams_name": "kwargs",
            "hyper_parameters": {"_class_path": task_path, "_instantiator": instantiator, **dict(task.hparams)},
            "datamodule_hparams_name": "kwargs",
            "datamodule_hyper_parameters": {"_class_path": data_path, "_instantiator": instantiator, "root": "data",
                                            "tasks": ["sr_x2"]},
            "preprocess": {"tasks": ("sr_x2",), "restore_task": "sr_x2", "self_ensemble": False}, "task": "restoration"}


def test_a_checkpoint_with_the_former_class_paths_loads(tmp_path):
    from visiontf.tasks.restoration.restoration_data import RestorationDataModule
    from visiontf.tasks.restoration.restoration_task import RestorationTask

    ckpt = _restoration_checkpoint("visiontf.tasks.restoration.RestorationTask",
                                   "visiontf.data.restoration:RestorationDataModule")
    saved = checkpoint_arguments(ckpt, "old.ckpt")
    assert saved.task is RestorationTask and saved.data is RestorationDataModule
    torch.save(ckpt, tmp_path / "old.ckpt")
    task = load_task_checkpoint(RestorationTask, tmp_path / "old.ckpt", map_location="cpu")
    assert type(task) is RestorationTask
    assert all(torch.equal(v, ckpt["state_dict"][k]) for k, v in task.state_dict().items())


@pytest.mark.parametrize("task_path", [
    "visiontf.tasks.transformer.importlib.import_module",  # an attribute of a former module is no class of the table
    "visiontf.data.coco.CocoDataModule",  # a class of the table, but not a task
    "visiontf.adapters.restoration.RestorationAdapter",  # a module that moved without a former path
])
def test_a_former_path_opens_nothing_else(task_path):
    from visiontf.tasks.restoration.restoration_task import RestorationTask

    ckpt = _restoration_checkpoint(task_path, "visiontf.data.restoration.RestorationDataModule")
    with pytest.raises(CheckpointError, match="hyper_parameters._class_path"):
        checkpoint_arguments(ckpt, "old.ckpt", task=RestorationTask)


def test_a_training_config_with_the_former_class_paths_builds_its_task_and_data(tmp_path):
    """tools/train.py's LightningCLI on a config that names ``visiontf.tasks.classification.ClassificationTask``
    and ``visiontf.data.classification.ClassificationDataModule``, as configs did before the task packages."""
    from visiontf.cli.train import make_cli
    from visiontf.tasks.classification.classification_data import ClassificationDataModule
    from visiontf.tasks.classification.classification_synthetic import make_classification_dataset
    from visiontf.tasks.classification.classification_task import ClassificationTask

    make_classification_dataset(tmp_path / "cls", num_train=4, num_val=2, num_classes=2, image_size=32)
    config = tmp_path / "old.yaml"
    config.write_text(f"""\
trainer: {{accelerator: cpu, devices: 1, logger: false, default_root_dir: {tmp_path / "out"}}}
model:
  class_path: visiontf.tasks.classification.ClassificationTask
  init_args: {{model_name: vit_tiny_patch16_224, model_kwargs: {{img_size: 32, patch_size: 8, depth: 1}}}}
data:
  class_path: visiontf.data.classification.ClassificationDataModule
  init_args: {{root: {tmp_path / "cls"}, image_size: 32, batch_size: 2, num_workers: 0}}
""")
    cli = make_cli(["--config", str(config)], run=False, quiet=True)
    assert type(cli.model) is ClassificationTask and type(cli.datamodule) is ClassificationDataModule
    assert cli.model.hparams.num_classes == 2  # the data module's, linked as before
