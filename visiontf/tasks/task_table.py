"""The one table of tasks: a task's name -> its adapter, its LightningModules and its data modules.

Adding a task adds one row here (and the modules it names). Everything that needs the list of
tasks reads it from :data:`TASK_TABLE`: the adapter lookup and ``infer_task``
(:mod:`visiontf.tasks.task_inference`), the checkpoints' task check, the training CLI (which imports every
task and data module so that configs may name them by short ``class_path``), the predict CLI
(short data-module names in a ``--config``) and the tests.

The rows hold class paths as strings, so this module imports nothing: it is one of the modules every
task shares (the lowest of ``visiontf.tasks``), where every reader (the adapter lookup, checkpoints,
inference, cli) may import it, while naming the task packages' classes, imported only when asked for.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import import_module
from typing import Any


@dataclass(frozen=True)
class TaskRow:
    """One task. ``adapter``: ``"module:Class"`` of its :class:`~visiontf.tasks.task_inference.TaskAdapter`;
    ``modules``: class paths of its LightningModules (``visiontf.tasks...``); ``data_modules``: class
    paths of its :class:`~visiontf.data.base.VisionDataModule` subclasses (``visiontf.data...``);
    ``model_kinds``: the bases of :mod:`visiontf.models.contract` its registered models subclass (what
    the layers above read of them); ``synthetic``: ``"module:function"`` writing a small set, with no
    download, in the layout its data modules read from ``root`` (``tools/make_synthetic.py --task``);
    ``data_synthetic``: the writers of the data modules that read another layout than that one, by class path."""

    adapter: str
    modules: tuple[str, ...]
    data_modules: tuple[str, ...]
    model_kinds: tuple[str, ...]
    synthetic: str
    data_synthetic: Mapping[str, str] = field(default_factory=dict)

    def synthetic_for(self, data_module: str) -> str:
        """The ``"module:function"`` writing a small set that ``data_module`` (a class path of the row) reads."""
        return self.data_synthetic.get(data_module, self.synthetic)


TASK_TABLE: dict[str, TaskRow] = {
    "classification": TaskRow(
        adapter="visiontf.tasks.classification.classification_inference:ClassificationAdapter",
        modules=("visiontf.tasks.classification.classification_task.ClassificationTask",),
        data_modules=("visiontf.tasks.classification.classification_data.ClassificationDataModule",),
        model_kinds=("visiontf.models.contract.Classifier",),
        synthetic="visiontf.tasks.classification.classification_synthetic:make_classification_dataset"),
    "detection": TaskRow(
        adapter="visiontf.tasks.detection.detection_inference:DetectionAdapter",
        modules=("visiontf.tasks.detection.detection_task.DetectionTask",),
        data_modules=("visiontf.tasks.detection.coco_data.CocoDataModule", "visiontf.tasks.detection.coco_panoptic_data.CocoPanopticDataModule"),
        model_kinds=("visiontf.models.contract.Detector",),
        synthetic="visiontf.tasks.detection.detection_synthetic:make_detection_dataset",
        data_synthetic={"visiontf.tasks.detection.coco_panoptic_data.CocoPanopticDataModule": "visiontf.tasks.detection.panoptic_synthetic:make_panoptic_dataset"}),
    "segmentation": TaskRow(
        adapter="visiontf.tasks.segmentation.segmentation_inference:SegmentationAdapter",
        modules=("visiontf.tasks.segmentation.segmentation_task.SegmentationTask",),
        data_modules=("visiontf.tasks.segmentation.segmentation_data.SegmentationDataModule",),
        model_kinds=("visiontf.models.contract.Segmenter",),
        synthetic="visiontf.tasks.segmentation.segmentation_synthetic:make_segmentation_dataset"),
    "restoration": TaskRow(
        adapter="visiontf.tasks.restoration.restoration_inference:RestorationAdapter",
        modules=("visiontf.tasks.restoration.restoration_task.RestorationTask",),
        data_modules=("visiontf.tasks.restoration.restoration_data.RestorationDataModule",),
        model_kinds=("visiontf.models.contract.Restorer",),
        synthetic="visiontf.data.synthetic.photos:make_photos_dataset"),
    "generation": TaskRow(
        adapter="visiontf.tasks.generation.generation_inference:GenerationAdapter",
        modules=("visiontf.tasks.generation.tokenizer_task.TokenizerTask", "visiontf.tasks.generation.gpt_task.TransformerTask"),
        data_modules=("visiontf.tasks.generation.image_folder_data.TokenizerDataModule",),
        model_kinds=("visiontf.models.contract.Tokenizer", "visiontf.models.contract.Generator"),
        synthetic="visiontf.data.synthetic.photos:make_photos_dataset"),
    "depth": TaskRow(
        adapter="visiontf.tasks.depth.depth_inference:DepthAdapter",
        modules=("visiontf.tasks.depth.depth_task.DepthTask",),
        data_modules=("visiontf.tasks.depth.depth_data.DepthDataModule",),
        model_kinds=("visiontf.models.contract.DepthEstimator",),
        synthetic="visiontf.tasks.depth.depth_synthetic:make_depth_dataset"),
}

#: every task name, in the table's order
TASKS: tuple[str, ...] = tuple(TASK_TABLE)


def task_class_paths() -> tuple[str, ...]:
    """Every LightningModule of every task (``module.Class``)."""
    return tuple(path for row in TASK_TABLE.values() for path in row.modules)


def data_module_class_paths() -> tuple[str, ...]:
    """Every LightningDataModule of every task (``module.Class``), each once."""
    return tuple(dict.fromkeys(path for row in TASK_TABLE.values() for path in row.data_modules))


def synthetic_writers() -> dict[str, str]:
    """Every synthetic set of the table by its name: each task's (``detection``...) and each writer's own
    (``make_panoptic_dataset`` -> ``panoptic``, ``make_photos_dataset`` -> ``photos``)."""
    named = {task: row.synthetic for task, row in TASK_TABLE.items()}
    for row in TASK_TABLE.values():
        for writer in (row.synthetic, *row.data_synthetic.values()):
            function = writer.rpartition(":")[2]
            named.setdefault(function.removeprefix("make_").removesuffix("_dataset"), writer)
    return named


def import_class(class_path: str) -> Any:
    """The class a ``module.Class`` or ``module:Class`` path names (its module imported now)."""
    module, _, name = class_path.replace(":", ".").rpartition(".")
    return getattr(import_module(module), name)


__all__ = ["TASKS", "TASK_TABLE", "TaskRow", "data_module_class_paths", "import_class", "synthetic_writers", "task_class_paths"]
