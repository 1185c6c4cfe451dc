"""Lightning callback that logs validation images with drawn predictions to TensorBoard.

In a YAML config::

    trainer:
      callbacks:
        - class_path: visiontf.callbacks.LogPredictionImages
          init_args: {every_n_epochs: 1, num_images: 4}
"""
from __future__ import annotations

import logging
from typing import Any, Sequence

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.loggers import TensorBoardLogger
from torch import Tensor

from visiontf.inference.predictor import IMAGENET_MEAN, IMAGENET_STD, infer_task
from visiontf.inference.visualize import draw_caption, draw_detections, draw_segmentation

log = logging.getLogger(__name__)


def _tensorboard(trainer: Trainer) -> TensorBoardLogger | None:
    for logger in trainer.loggers:
        if isinstance(logger, TensorBoardLogger):
            return logger
    return None


class LogPredictionImages(Callback):
    """Every ``every_n_epochs``, draw the model's predictions on the first ``num_images`` images of
    the first validation batch and log them to TensorBoard (``add_image``); a no-op without a
    :class:`~lightning.pytorch.loggers.TensorBoardLogger`.

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
        tb = _tensorboard(trainer)
        if tb is None:
            if not self._warned:
                log.info("LogPredictionImages: no TensorBoardLogger among the trainer's loggers; nothing logged")
                self._warned = True
            return
        images = self.render(trainer, pl_module, batch)
        for i, img in enumerate(images):
            tb.experiment.add_image(f"{self.tag}/{i}", img, global_step=trainer.global_step, dataformats="CHW")

    # ------------------------------------------------------------------ drawing
    @torch.no_grad()
    def render(self, trainer: Trainer | None, pl_module: LightningModule, batch: Any) -> list[Tensor]:
        """The uint8 (3, H, W) pictures this callback logs for ``batch``."""
        model = pl_module.model
        task = infer_task(model)
        mean, std = _normalisation(trainer, model)
        names = _class_names(trainer)
        n = self.num_images
        if task == "detection":
            images, mask, targets = batch
            images, mask, targets = images[:n], mask[:n], targets[:n]
            from visiontf.detection.postprocess import PostProcess

            outputs = model(images, mask)
            # boxes on the augmented (unpadded) image that is drawn, not on the original file
            sizes = torch.stack([t["size"] for t in targets]).to(images.device)
            preds = PostProcess()(outputs, sizes, score_threshold=self.score_threshold)
            out = []
            for img, p, t in zip(images, preds, targets):
                h, w = (int(v) for v in t["size"])
                out.append(draw_detections(_denorm(img[:, :h, :w], mean, std), p, names))
            return out
        if task == "segmentation":
            images, masks = batch[0][:n], batch[1][:n]
            logits = pl_module.predict_logits(images) if hasattr(pl_module, "predict_logits") else model(images)
            pred = logits.argmax(dim=1)
            k = getattr(model, "num_classes", None)
            ignore = int((getattr(pl_module, "hparams", None) or {}).get("ignore_index", 255))
            out = []
            for img, p, gt in zip(images, pred, masks):
                base = _denorm(img, mean, std)
                gt_img = draw_segmentation(base, gt.cpu(), k, ignore_index=ignore)
                pred_img = draw_segmentation(base, p.cpu(), k, ignore_index=ignore)
                out.append(torch.cat([gt_img, pred_img], dim=-1))  # ground truth | prediction
            return out
        images, labels = batch[0][:n], batch[1][:n]
        logits = model(images)
        if isinstance(logits, (tuple, list)):
            logits = (logits[0] + logits[1]) / 2
        probs = logits.float().softmax(-1)
        score, top = probs.max(-1)
        name = lambda i: names[i] if names and 0 <= i < len(names) else f"class_{i}"  # noqa: E731
        out = []
        for img, s, t, y in zip(images, score, top, labels):
            truth = int(y) if y.dim() == 0 else int(y.argmax())
            out.append(draw_caption(_denorm(img, mean, std), [f"pred {name(int(t))} {float(s):.2f}", f"true {name(truth)}"]))
        return out


def _normalisation(trainer: Trainer | None, model: Any) -> tuple[Sequence[float], Sequence[float]]:
    dm = getattr(trainer, "datamodule", None) if trainer is not None else None
    hp = getattr(dm, "hparams", None) or {}
    if hp.get("mean") is not None and hp.get("std") is not None:
        return tuple(hp["mean"]), tuple(hp["std"])
    cfg = getattr(model, "pretrained_cfg", {}) or {}
    # visiontf's COCO data normalises with ImageNet statistics, as DETR
    return tuple(cfg.get("mean", IMAGENET_MEAN)), tuple(cfg.get("std", IMAGENET_STD))


def _class_names(trainer: Trainer | None) -> list[str] | None:
    dm = getattr(trainer, "datamodule", None) if trainer is not None else None
    names = getattr(dm, "class_names", None)
    return list(names) if names else None


def _denorm(img: Tensor, mean: Sequence[float], std: Sequence[float]) -> Tensor:
    m = torch.tensor(mean, device=img.device, dtype=torch.float32)[:, None, None]
    s = torch.tensor(std, device=img.device, dtype=torch.float32)[:, None, None]
    return ((img.float() * s + m).clamp(0, 1) * 255).round().to(torch.uint8).cpu()
