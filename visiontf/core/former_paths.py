"""The modules where configs and checkpoints written before the task packages name visiontf's
classes, and where those classes are now.

A config's ``class_path: visiontf.data.coco.CocoDataModule`` and a checkpoint's ``_class_path:
visiontf.tasks.transformer.TransformerTask`` name a task or a data module at its former module. Two things
keep them working, both from :data:`FORMER_MODULES` alone:

* :func:`install` (run by ``import visiontf``) adds an import hook that answers a former module's name with
  the module that holds its classes now, so jsonargparse, LightningCLI and ``import`` resolve an old
  ``class_path``; it logs one line naming the new path. It only answers names that no longer exist as files
  (it is asked last), and only the names of the table.
* :func:`former_spellings` gives, for a class, the spellings a checkpoint written before may use, so that
  :func:`visiontf.io.lightning_checkpoint.class_spellings` allows them for exactly the classes already
  allowed: the allow-list of a checkpoint's class paths stays as strict as before.

A task package (``visiontf.tasks.detection``) exports its classes, so ``visiontf.tasks.detection.DetectionTask``
is the package's attribute; the table lists it too, so that a checkpoint's spelling of it is allowed.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import logging
import sys
from types import ModuleType

log = logging.getLogger(__name__)

#: a former module (as configs and checkpoints name it) -> the module that holds its classes now
FORMER_MODULES: dict[str, str] = {
    "visiontf.tasks.classification": "visiontf.tasks.classification.classification_task",
    "visiontf.data.classification": "visiontf.tasks.classification.classification_data",
    "visiontf.tasks.detection": "visiontf.tasks.detection.detection_task",
    "visiontf.data.coco": "visiontf.tasks.detection.coco_data",
    "visiontf.data.coco_panoptic": "visiontf.tasks.detection.coco_panoptic_data",
    "visiontf.tasks.segmentation": "visiontf.tasks.segmentation.segmentation_task",
    "visiontf.data.segmentation": "visiontf.tasks.segmentation.segmentation_data",
    "visiontf.tasks.restoration": "visiontf.tasks.restoration.restoration_task",
    "visiontf.data.restoration": "visiontf.tasks.restoration.restoration_data",
    "visiontf.tasks.tokenizer": "visiontf.tasks.generation.tokenizer_task",
    "visiontf.tasks.transformer": "visiontf.tasks.generation.gpt_task",
    "visiontf.data.image_folder": "visiontf.tasks.generation.image_folder_data",
    "visiontf.tasks.depth": "visiontf.tasks.depth.depth_task",
    "visiontf.data.depth": "visiontf.tasks.depth.depth_data",
}


def former_spellings(cls: type) -> tuple[str, ...]:
    """The ``module.Class`` and ``module:Class`` spellings of ``cls`` at its former modules (none for a class
    that did not move)."""
    return tuple(spelling for old, new in FORMER_MODULES.items() if new == cls.__module__
                 for spelling in (f"{old}.{cls.__qualname__}", f"{old}:{cls.__qualname__}"))


class _FormerModule(importlib.abc.Loader):
    """Loads a former module's name as the module that holds its classes now."""

    def __init__(self, new: str):
        self.new = new

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        log.warning("%s moved to %s; write the new path in configs (the old one still loads)", spec.name, self.new)
        return importlib.import_module(self.new)

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the new module is loaded already."""


class _FormerModuleFinder(importlib.abc.MetaPathFinder):
    """Finds only the names of :data:`FORMER_MODULES`, after every other finder has not."""

    def find_spec(self, fullname, path=None, target=None):  # noqa: ANN001 - importlib's signature
        new = FORMER_MODULES.get(fullname)
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _FormerModule(new))


def install() -> None:
    """Add the finder of former modules (once), last on ``sys.meta_path``."""
    if not any(isinstance(f, _FormerModuleFinder) for f in sys.meta_path):
        sys.meta_path.append(_FormerModuleFinder())


__all__ = ["FORMER_MODULES", "former_spellings", "install"]
