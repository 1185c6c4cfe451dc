"""What the rest of visiontf reads of a data module, declared once (the data side of
:mod:`visiontf.models.contract`).

The tasks (class names in reports, the annotation files COCO evaluation scores against, a learning
rate scaled by the batch size), the checkpoints they write (class names, category ids, the eval
transform's settings), the training CLI (``data.num_classes`` linked into the task) and the predict
CLI (the classes of a ``--config``) read these attributes by name. Every data module subclasses
:class:`VisionDataModule`, or :class:`DetectionDataModule` for data scored by COCO's protocol, and
overrides what differs; ``tools/train.py`` and ``tools/predict.py`` take no other data module, and
``tests/data/test_data_contract.py`` checks every data module of the task table on its synthetic set.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import lightning as L


class VisionDataModule(L.LightningDataModule):
    """A LightningDataModule with the attributes visiontf reads, and their defaults."""

    #: object classes; None for a task without classes (restoration, a tokenizer): the training CLI links it
    #: into ``model.init_args.num_classes``
    num_classes: int | None = None
    #: class names by class index; None when the data names no classes
    class_names: list[str] | None = None
    #: class index -> the dataset's category id (COCO results files); None: the index is the id
    label_to_cat_id: dict[int, int] | None = None
    #: training images per batch and process (tasks that scale their learning rate by it read it)
    batch_size: int = 1

    @classmethod
    def load_from_checkpoint(cls, checkpoint_path: Any, map_location: Any = None, hparams_file: Any = None,
                             **kwargs: Any) -> Any:
        """Lightning's ``load_from_checkpoint``, with the file's ``datamodule_hyper_parameters`` read as data: the
        ``_class_path`` it may name is this class or one of visiontf's subclasses of it (already imported), every
        value is checked against the class's typed signature, and the module is built by a plain call, never by
        the ``_instantiator`` the file names (:func:`visiontf.io.lightning_checkpoint.load_lightning_checkpoint`)."""
        from visiontf.io.lightning_checkpoint import load_lightning_checkpoint, spelled

        family, stack = [cls], list(cls.__subclasses__())
        while stack:
            sub = stack.pop()
            if sub.__module__.startswith("visiontf."):
                family.append(sub)
            stack.extend(sub.__subclasses__())
        return load_lightning_checkpoint(cls, checkpoint_path, spelled(family), map_location=map_location,
                                         hparams_file=hparams_file, **kwargs)

    def eval_transform(self) -> dict[str, Any]:
        """How validation preprocesses images, as keys of the task's eval settings (the adapter's
        ``settings_type``; an unknown key is refused): checkpoints save the settings they complete, so that a
        Predictor preprocesses as validation did. None by default (the model's own settings hold)."""
        return {}


class DetectionDataModule(VisionDataModule):
    """Detection data scored by COCO's protocol: the annotation files the evaluation reads."""

    #: the annotation file validation is scored against
    val_ann_file: Path
    #: the test split's, when it has its own (None: the val file)
    test_ann_file: Path | None = None
    #: ``"contiguous"`` (class index 0..K-1, mapped back by ``label_to_cat_id``) or ``"category_id"`` (the class
    #: index is the category id, as the original DETRs train: the head then has outputs for the ids' gaps)
    label_space: Literal["contiguous", "category_id"] = "contiguous"
    #: the targets carry instance masks (a mask model is then scored on them: mask AP)
    masks: bool = False
    #: panoptic data: the class indices that are things (the rest are stuff); None: not panoptic
    thing_classes: tuple[int, ...] | None = None
    #: panoptic data: the COCO panoptic JSON and PNG folder PQ is scored against (test: None -> val's)
    val_panoptic_file: Path | None = None
    test_panoptic_file: Path | None = None
    val_segments_dir: Path | None = None
    test_segments_dir: Path | None = None

    def ann_file(self, stage: str) -> Path:
        """The annotation file ``stage`` ("validate", "test", ...) is scored against."""
        return self.test_ann_file if stage == "test" and self.test_ann_file is not None else self.val_ann_file

    def panoptic_files(self, stage: str) -> tuple[Path, Path] | None:
        """The panoptic JSON and PNG folder ``stage`` is scored against; None for data without them."""
        test = stage == "test" and self.test_panoptic_file is not None
        json_file = self.test_panoptic_file if test else self.val_panoptic_file
        folder = self.test_segments_dir if test else self.val_segments_dir
        return None if json_file is None or folder is None else (json_file, folder)


def trainer_datamodule(trainer: Any) -> VisionDataModule | None:
    """The data module of ``trainer`` (None without a trainer, or when it runs on bare dataloaders).

    A LightningDataModule that is not a :class:`VisionDataModule` is refused by name: what visiontf reads
    of it (classes, category ids, eval settings) would otherwise silently take defaults.
    """
    dm = trainer.datamodule if trainer is not None else None
    if dm is None or isinstance(dm, VisionDataModule):
        return dm
    raise TypeError(f"{type(dm).__name__} is a LightningDataModule but not a visiontf.data.base.VisionDataModule: "
                    "subclass that (it declares num_classes, class_names, label_to_cat_id, batch_size and eval_transform(), "
                    "which visiontf reads)")


__all__ = ["DetectionDataModule", "VisionDataModule", "trainer_datamodule"]
