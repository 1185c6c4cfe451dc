"""Monocular depth training (``class_path: visiontf.tasks.depth.depth_task.DepthTask``): the scale-invariant log loss
and the standard depth metrics, over the measured pixels only (depth 0: no measurement).

Loss: Eigen et al.'s scale-invariant log error (NeurIPS 2014) as BTS and AdaBins train with it,
``sqrt(mean(g^2) - lambda mean(g)^2)`` with ``g = log(predicted) - log(true)`` per image (lambda 0.85).
Metrics (Eigen's, per image, averaged over the images of the set): ``abs_rel`` mean |p - t| / t,
``rmse`` sqrt(mean (p - t)^2) in metres, ``delta1`` the share of pixels with max(p/t, t/p) < 1.25.
"""
from __future__ import annotations

from typing import Any, Literal

import torch
from torch import Tensor

from visiontf.core.config_checks import check_config, fraction, non_negative, positive
from visiontf.models.contract import DepthEstimator
from visiontf.tasks.base_task import BaseTask
from visiontf.tasks.optim import OptimArgsMixin, build_optimizer, build_scheduler, decay_groups


def depth_terms(predicted: Tensor, true: Tensor, variance_focus: float = 0.85) -> dict[str, Tensor]:
    """Per-image loss and metrics of (B, 1, H, W) depth maps in metres, over the pixels where ``true`` > 0:
    ``silog``, ``abs_rel``, ``rmse``, ``delta1``, each (B,); NaN for an image without measured pixels."""
    valid = (true > 0).flatten(1).float()
    count = valid.sum(1)
    p = predicted.flatten(1).float().clamp_min(1e-3)
    t = true.flatten(1).float().clamp_min(1e-3)
    mean = lambda x: (x * valid).sum(1) / count  # noqa: E731  (NaN where count is 0)
    g = torch.log(p) - torch.log(t)
    return {
        "silog": (mean(g**2) - variance_focus * mean(g) ** 2).clamp_min(0).sqrt(),
        "abs_rel": mean((p - t).abs() / t),
        "rmse": mean((p - t) ** 2).sqrt(),
        "delta1": mean((torch.maximum(p / t, t / p) < 1.25).float()),
    }


class DepthTask(OptimArgsMixin, BaseTask):
    """A :class:`~visiontf.models.contract.DepthEstimator` trained with the scale-invariant log loss (AdamW,
    warm-up then cosine)."""

    task = "depth"
    model_kind = DepthEstimator

    def __init__(self, model_name: str, num_classes: int | None = None, model_kwargs: dict[str, Any] | None = None,
                 pretrained: str | None = None, lr: float = 1e-3, weight_decay: float = 0.05, warmup_steps: int = 0,
                 schedule: Literal["cosine", "constant"] = "cosine", variance_focus: float = 0.85, compile: bool = False,
                 on_nonfinite: Literal["raise", "skip"] = "raise") -> None:
        check_config(type(self).__name__, "model", lr=(lr, positive), weight_decay=(weight_decay, non_negative),
                     warmup_steps=(warmup_steps, non_negative), variance_focus=(variance_focus, fraction))
        super().__init__(model_name, None, model_kwargs, pretrained, compile, on_nonfinite)
        self.save_hyperparameters()

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int):
        images, depth = batch
        silog = depth_terms(self.model(images), depth, self.hparams.variance_focus)["silog"]
        loss = silog.nanmean()  # an image without measured pixels adds nothing
        if not self.check_finite(loss, {"silog": loss}):
            return None
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def _eval_step(self, batch: tuple[Tensor, Tensor], stage: str) -> None:
        images, depth = batch
        terms = depth_terms(self.model(images), depth, self.hparams.variance_focus)
        measured = ~terms["silog"].isnan()
        for name, values in terms.items():
            self.log_eval_mean(f"{stage}/{name}", values[measured].mean() if measured.any() else 0.0, int(measured.sum()),
                               prog_bar=name == "abs_rel")

    def _eval_end(self, stage: str) -> None:
        """Every metric is a mean over images (:meth:`log_eval_mean`), logged by the base class."""

    def configure_optimizers(self):
        args = self.optim_args
        optimizer = build_optimizer("adamw", decay_groups(self.model, args.weight_decay), args.lr, args.weight_decay)
        return {"optimizer": optimizer,
                "lr_scheduler": build_scheduler(optimizer, args.schedule, self.total_steps(), args.warmup_steps)}


__all__ = ["DepthTask", "depth_terms"]
