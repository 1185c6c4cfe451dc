"""DETR object detection as a LightningModule: set loss, AdamW with a backbone lr, COCO mAP."""
from __future__ import annotations

from typing import Any, Literal

import torch
from torch import Tensor

from visiontf.detection import build_postprocess
from visiontf.detection.set_loss import build_set_criterion
from visiontf.evaluation.coco import METRIC_NAMES
from visiontf.tasks.base import BaseTask
from visiontf.tasks.optim import build_optimizer, build_scheduler, group_parameters, lr_groups


class DetectionTask(BaseTask):
    """DETR training and COCO evaluation.

    Batches are ``(images (B,3,H,W), mask (B,H,W) True on padding, targets)`` from
    :class:`visiontf.data.coco.CocoDataModule`. Validation mAP is pycocotools' ``COCOeval`` on the
    original annotation file (its ``area`` and ``iscrowd``), over every rank's predictions with
    repeated images de-duplicated by image id. Clip gradients with ``trainer.gradient_clip_val: 0.1``
    as the paper does.

    Learning rates follow the model's own parameter groups (``model.param_group(name)``): ``lr``
    for ``"default"``, ``lr_backbone`` for ``"backbone"`` and ``lr * lr_offsets_mult`` for
    ``"offsets"`` (deformable attention's sampling offsets and reference points, where a model has them).

    The class loss and matching cost follow the model's ``class_head`` (softmax: DETR's; sigmoid: the
    focal loss and cost of Deformable DETR and DINO); ``criterion_kwargs`` / ``matcher_kwargs`` go to
    :class:`~visiontf.detection.SetCriterion` / :class:`~visiontf.detection.HungarianMatcher` on top
    (e.g. ``criterion_kwargs: {class_loss: vfl}``). A model with ``forward_takes_targets = True``
    gets the batch's targets in training steps.
    """

    task = "detection"

    def __init__(
        self,
        model_name: str = "detr_tiny",
        num_classes: int = 91,
        model_kwargs: dict[str, Any] | None = None,
        pretrained: str | None = None,
        lr: float = 1e-4,
        lr_backbone: float = 1e-5,
        lr_offsets_mult: float = 0.1,
        weight_decay: float = 1e-4,
        schedule: Literal["step", "cosine", "constant"] = "step",
        lr_drop_epochs: int | None = 200,
        warmup_steps: int = 0,
        cost_class: float = 1.0,
        cost_bbox: float = 5.0,
        cost_giou: float = 2.0,
        loss_ce: float = 1.0,
        loss_bbox: float = 5.0,
        loss_giou: float = 2.0,
        eos_coef: float = 0.1,
        eval_backend: Literal["auto", "pycocotools", "faster_coco_eval"] = "auto",
        compile: bool = False,
        on_nonfinite: Literal["raise", "skip"] = "raise",
        criterion_kwargs: dict[str, Any] | None = None,
        matcher_kwargs: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(model_name, num_classes, model_kwargs, pretrained, compile, on_nonfinite)
        self.save_hyperparameters()
        weights = {"loss_ce": loss_ce, "loss_bbox": loss_bbox, "loss_giou": loss_giou}
        # the model's class head picks the class loss and matching cost (visiontf.detection.set_loss);
        # the criterion's matcher runs outside any compiled graph: scipy needs the CPU
        self.criterion = build_set_criterion(
            self.model, num_classes, weights,
            matcher_kwargs={"cost_class": cost_class, "cost_bbox": cost_bbox, "cost_giou": cost_giou, **(matcher_kwargs or {})},
            criterion_kwargs={"eos_coef": eos_coef, **(criterion_kwargs or {})},
        )
        self.postprocess = build_postprocess(self.model)
        self.metrics: dict[str, Any] = {}
        self._last_report: dict | None = None

    # -- evaluation plumbing -------------------------------------------------------------------
    def _metric(self, stage: str):
        if stage not in self.metrics:
            from visiontf.evaluation.coco_metric import CocoMetric

            dm = self.trainer.datamodule
            ann = dm.test_ann_file if stage == "test" and getattr(dm, "test_ann_file", None) else dm.val_ann_file
            self.metrics[stage] = CocoMetric(ann, dm.label_to_cat_id, backend=self.hparams.eval_backend).to(self.device)
        return self.metrics[stage]

    def _step(self, batch) -> tuple[dict, dict[str, Tensor], list[dict]]:
        images, mask, targets = batch
        if self.training and getattr(self.model, "forward_takes_targets", False):
            # training-only inputs built from the targets (e.g. DINO's denoising queries)
            outputs = self.model(images, mask, targets=targets)
        else:
            outputs = self.model(images, mask)
        # only training steps synchronise the box count: eval ranks may run unequal batch counts
        losses = self.criterion(outputs, targets, sync_num_boxes=self.training)
        return outputs, losses, targets

    def training_step(self, batch, batch_idx):
        _, losses, targets = self._step(batch)
        loss = losses["loss"]
        if not self.check_finite(loss, losses):
            return None
        bs = len(targets)
        self.log("train/loss", loss, prog_bar=True, batch_size=bs)
        main = {f"train/{k}": v for k, v in losses.items() if k != "loss" and not k[-1].isdigit()}
        aux = {f"train_aux/{k}": v for k, v in losses.items() if k[-1].isdigit()}
        self.log_dict(main, batch_size=bs)
        self.log_dict(aux, batch_size=bs)
        return loss

    def _eval_step(self, batch, stage: str) -> None:
        outputs, losses, targets = self._step(batch)
        bs = len(targets)
        self.log(f"{stage}/loss", losses["loss"], sync_dist=True, batch_size=bs)
        for k in ("loss_ce", "loss_bbox", "loss_giou", "class_error", "cardinality_error"):
            if k in losses:
                self.log(f"{stage}/{k}", losses[k], sync_dist=True, batch_size=bs)
        sizes = torch.stack([t["orig_size"] for t in targets]).to(outputs["pred_boxes"].device)
        preds = self.postprocess(outputs, sizes)
        ids = torch.as_tensor([int(t["image_id"]) for t in targets], device=self.device)
        self._metric(stage).update(preds, ids)

    def _eval_end(self, stage: str) -> None:
        metric = self._metric(stage)
        stats = metric.compute()
        self._last_report = {k: float(v) for k, v in stats.items() if torch.is_tensor(v) and v.numel() == 1}
        table = getattr(metric, "last_table", None)
        if table:
            self._last_report["table"] = table
        self.log_dict({f"{stage}/{k}": stats[k].float() for k in METRIC_NAMES if k in stats}, sync_dist=False)
        self.log(f"{stage}/mAP", stats["map"].float(), prog_bar=True, sync_dist=False)
        metric.reset()

    def predict_step(self, batch, batch_idx):
        images, mask, targets = batch
        outputs = self.model(images, mask)
        sizes = torch.stack([t["orig_size"] for t in targets]).to(images.device)
        preds = self.postprocess(outputs, sizes)
        for p, t in zip(preds, targets):
            p["image_id"] = int(t["image_id"])
        return preds

    def eval_report(self) -> dict | None:
        """The last evaluation's COCO table and stats (used by ``tools/eval.py``)."""
        return self._last_report

    # -- optimisation --------------------------------------------------------------------------
    def configure_optimizers(self):
        hp = self.hparams
        lrs = {"default": hp.lr, "backbone": hp.lr_backbone, "offsets": hp.lr * hp.lr_offsets_mult}
        # default and backbone are always there (possibly empty), so DETR's optimizer state keeps its layout
        groups = lr_groups(group_parameters(self.model), lrs, always=("default", "backbone"))
        opt = build_optimizer("adamw", groups, hp.lr, hp.weight_decay)
        sched = build_scheduler(opt, hp.schedule, self.total_steps(), hp.warmup_steps, step_epochs=hp.lr_drop_epochs)
        return {"optimizer": opt, "lr_scheduler": sched}
