"""Lightning callback that logs validation images with drawn predictions to every logger that keeps pictures
(TensorBoard, Weights & Biases, MLflow: :mod:`visiontf.callbacks.logger_sinks`).

In a YAML config::

    trainer:
      callbacks:
        - class_path: visiontf.callbacks.LogPredictionImages
          init_args: {every_n_epochs: 1, num_images: 4}
"""
from __future__ import annotations

import logging
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.loggers import MLFlowLogger, TensorBoardLogger, WandbLogger
from torch import Tensor

from visiontf.callbacks.logger_sinks import log_image
from visiontf.data.base import trainer_datamodule
from visiontf.tasks.task_inference import get_adapter

log = logging.getLogger(__name__)


#: the loggers that keep pictures
PICTURE_LOGGERS = (TensorBoardLogger, WandbLogger, MLFlowLogger)


class LogPredictionImages(Callback):
    """Every ``every_n_epochs``, draw the model's predictions on the first ``num_images`` images of
    the first validation batch and log them to every logger that keeps pictures (TensorBoard's
    ``add_image``, a W&B image, an MLflow image artifact); a no-op without one.

    Detection: boxes with ``score > score_threshold``; segmentation: predicted mask overlay beside the
    ground truth; classification: a caption with the top prediction and the true class.
    """

    def __init__(self, every_n_epochs: int = 1, num_images: int = 4, score_threshold: float = 0.5, tag: str = "val_predictions") -> None:
        super().__init__()
        if every_n_epochs < 1 or num_images < 1:
            raise ValueError(f"every_n_epochs ({every_n_epochs}) and num_images ({num_images}) must be >= 1")
        self.every_n_epochs = every_n_epochs
        self.num_images = num_images
        self.score_threshold = score_threshold
        self.tag = tag
        self._warned = False

    def on_validation_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any,
                                batch_idx: int, dataloader_idx: int = 0) -> None:
        if batch_idx != 0 or dataloader_idx != 0 or trainer.sanity_checking or not trainer.is_global_zero:
            return
        if trainer.current_epoch % self.every_n_epochs:
            return
        if not any(isinstance(lg, PICTURE_LOGGERS) for lg in trainer.loggers):
            if not self._warned:
                log.info("LogPredictionImages: no logger that keeps pictures (TensorBoard, W&B, MLflow); nothing logged")
                self._warned = True
            return
        images = self.render(trainer, pl_module, batch)
        for i, img in enumerate(images):
            log_image(trainer, f"{self.tag}/{i}", img, step=trainer.global_step)

    # ------------------------------------------------------------------ drawing
    @torch.no_grad()
    def render(self, trainer: Trainer | None, pl_module: LightningModule, batch: Any) -> list[Tensor]:
        """The uint8 (3, H, W) pictures this callback logs for ``batch`` (drawn by the task's adapter)."""
        model = pl_module.model
        adapter = get_adapter(model, getattr(pl_module, "task", None) or None)
        dm = trainer_datamodule(trainer)
        # the batches are normalised as the data module's eval transform says (the model's settings where it is silent)
        settings = adapter.eval_settings(model, dm.eval_transform() if dm is not None else {})
        return adapter.render_batch(pl_module, batch, settings, _class_names(trainer), self.num_images, self.score_threshold)


def _class_names(trainer: Trainer | None) -> list[str] | None:
    dm = trainer_datamodule(trainer)
    names = dm.class_names if dm is not None else None
    return list(names) if names else None
