"""The optimiser and schedule arguments the tasks share (visiontf/tasks/optim.py): one typed object, one
spelling of the warm-up (``warmup_steps``) in every task, and a checkpoint saved with the classification task's
former ``warmup_epochs`` still loads, saying so.

Cost: a 1-block ViT at 32 px, no training; about a second.
"""
from __future__ import annotations

import inspect
import logging

import lightning as L
import pytest
import torch

from visiontf.tasks.classification.classification_task import ClassificationTask
from visiontf.tasks.depth.depth_task import DepthTask
from visiontf.tasks.detection.detection_task import DetectionTask
from visiontf.tasks.generation.tokenizer_task import TokenizerTask
from visiontf.tasks.optim import OptimArgs, OptimArgsMixin
from visiontf.tasks.restoration.restoration_task import RestorationTask
from visiontf.tasks.segmentation.segmentation_task import SegmentationTask

TASKS = (ClassificationTask, DetectionTask, SegmentationTask, RestorationTask, DepthTask)
TINY_VIT = {"img_size": 32, "patch_size": 8, "depth": 1, "embed_dim": 48, "num_heads": 3}


@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.__name__)
def test_every_task_reads_its_optimiser_arguments_through_one_object_with_one_spelling(task):
    params = inspect.signature(task.__init__).parameters
    assert issubclass(task, OptimArgsMixin)
    assert "warmup_steps" in params and "warmup_epochs" not in params
    shared = {"lr", "weight_decay", "schedule", "warmup_steps"}
    assert shared <= set(params), shared - set(params)


def test_the_tokenizer_spells_the_warm_up_the_same():
    assert "warmup_steps" in inspect.signature(TokenizerTask.__init__).parameters


def test_optim_args_from_a_tasks_hyper_parameters_and_its_checks():
    task = ClassificationTask("vit_tiny_patch16_224", num_classes=3, model_kwargs=TINY_VIT, lr=1e-3, weight_decay=0.01,
                              warmup_steps=4, schedule="constant")
    assert task.optim_args == OptimArgs(lr=1e-3, weight_decay=0.01, schedule="constant", warmup_steps=4, optimizer="adamw")
    with pytest.raises(ValueError, match="warmup_steps must be a whole number of optimizer steps >= 0, got 2.5"):
        OptimArgs(lr=1e-3, warmup_steps=2.5)
    with pytest.raises(ValueError, match="lr must be > 0, got 0"):
        OptimArgs(lr=0)
    with pytest.raises(ValueError, match="optimizer must be 'adamw' or 'sgd', got 'adam'"):
        OptimArgs(lr=1e-3, optimizer="adam")


def test_classification_warms_up_over_deits_five_epochs_unless_given_steps():
    task = ClassificationTask("vit_tiny_patch16_224", num_classes=3, model_kwargs=TINY_VIT)
    assert task.hparams.warmup_steps is None
    task.steps_per_epoch, task.total_steps = (lambda: 10), (lambda: 100)
    sched = task.configure_optimizers()["lr_scheduler"]["scheduler"]
    assert sched.lr_lambdas[0](0) == pytest.approx(1 / 50)  # 5 epochs x 10 steps
    task = ClassificationTask("vit_tiny_patch16_224", num_classes=3, model_kwargs=TINY_VIT, warmup_steps=4)
    task.steps_per_epoch, task.total_steps = (lambda: 10), (lambda: 100)
    assert task.configure_optimizers()["lr_scheduler"]["scheduler"].lr_lambdas[0](0) == pytest.approx(1 / 4)


def test_a_checkpoint_saved_with_warmup_epochs_loads_and_says_so(tmp_path, caplog):
    task = ClassificationTask("vit_tiny_patch16_224", num_classes=3, model_kwargs=TINY_VIT)
    hparams = {k: v for k, v in task.hparams.items() if k != "warmup_steps"}
    hparams["warmup_epochs"] = 5.0  # as visiontf saved it before the tasks shared one spelling
    path = tmp_path / "old.ckpt"
    torch.save({"state_dict": task.state_dict(), "hyper_parameters": hparams, "pytorch-lightning_version": L.__version__}, path)
    with caplog.at_level(logging.WARNING, logger="visiontf.tasks.optim"):
        loaded = ClassificationTask.load_from_checkpoint(path)
    assert "warmup_epochs=5.0, which visiontf now spells warmup_steps" in caplog.text
    assert loaded.hparams.warmup_steps is None  # the default: DeiT's 5 epochs, what warmup_epochs=5.0 meant
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), task.state_dict().values()))
