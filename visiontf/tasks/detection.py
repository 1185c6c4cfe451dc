"""DETR-family object detection as a LightningModule: set loss, AdamW with per-group lrs, COCO mAP."""
from __future__ import annotations

from typing import Any, Literal

import torch
from torch import Tensor, nn

from visiontf.config_checks import (
    check_config,
    non_negative,
    non_negative_int,
    one_of,
    optional,
    positive,
    positive_int,
    unit_interval_open_left,
)
from visiontf.detection import build_criterion, build_postprocess
from visiontf.evaluation.coco import METRIC_NAMES
from visiontf.models.contract import Detector
from visiontf.tasks.base import BaseTask
from visiontf.tasks.optim import build_optimizer, build_scheduler, group_parameters, layer_decay_groups, lr_groups


def split_loss_terms(losses: dict[str, Tensor]) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """``(main, aux)`` loss terms for logging, by name alone: auxiliary decoder layers' terms end in
    ``_<layer>`` (``loss_ce_0``, ``loss_bbox_dn_2``); every other term (``loss_ce``, ``loss_ce_enc``,
    ``loss_giou_dn``, ``class_error``, ...) is a main one. The weighted total ``loss`` is in neither."""
    main = {k: v for k, v in losses.items() if k != "loss" and not k[-1].isdigit()}
    aux = {k: v for k, v in losses.items() if k[-1].isdigit()}
    return main, aux


def one_image(outputs: Any, i: int, batch_size: int) -> Any:
    """Image ``i`` of a detector's outputs: every tensor whose first dimension is the batch, sliced to
    ``[i:i+1]`` through nested dicts and lists (auxiliary layers, encoder proposals); the rest as it is."""
    if torch.is_tensor(outputs):
        return outputs[i:i + 1] if outputs.dim() and outputs.shape[0] == batch_size else outputs
    if isinstance(outputs, dict):
        return {k: one_image(v, i, batch_size) for k, v in outputs.items()}
    if isinstance(outputs, (list, tuple)):
        return type(outputs)(one_image(v, i, batch_size) for v in outputs)
    return outputs


class DetectionTask(BaseTask):
    """Training and COCO evaluation of any detector of the DETR family (DETR, Deformable DETR, ...).

    Batches are ``(images (B,3,H,W), mask (B,H,W) True on padding, targets)`` from
    :class:`visiontf.data.coco.CocoDataModule`. Validation mAP is pycocotools' ``COCOeval`` on the
    original annotation file (its ``area`` and ``iscrowd``), over every rank's predictions with
    repeated images de-duplicated by image id. Clip gradients with ``trainer.gradient_clip_val: 0.1``
    as both papers do.

    The model decides how it is trained and decoded: its ``class_head`` picks the matcher and
    criterion with the family's published defaults (:func:`visiontf.detection.build_criterion`: DETR
    ce 1 / L1 5 / GIoU 2, "no object" weight 0.1; Deformable DETR focal, cost and loss class 2, L1 5,
    GIoU 2) and the post-processing (:func:`visiontf.detection.build_postprocess`). The named
    arguments below override single defaults (None keeps the family's); ``matcher_kwargs`` and
    ``criterion_kwargs`` go to :class:`~visiontf.detection.HungarianMatcher` and
    :class:`~visiontf.detection.SetCriterion` unchanged and win over both, so a new criterion option
    needs no change here (a ``weight_dict`` in ``criterion_kwargs`` is merged term by term).

    A model whose forward needs the ground truth while training (denoising queries) declares
    ``forward_takes_targets = True``; training steps then call ``model(images, mask, targets=targets)``.
    Evaluation and prediction never pass targets.

    Every loss term the criterion returns is logged under its own name: ``train/<term>`` for the
    final layer, two-stage proposals (``_enc``) and other suffixed terms, ``train_aux/<term>_<i>``
    for auxiliary decoder layers; evaluation logs the main terms under ``val/`` or ``test/``, each the
    mean over the images of that image's own loss (independent of batch size and process count).

    Learning rates follow the model's own parameter groups (``model.param_group(name)``): ``lr``
    for ``"default"``, ``lr_backbone`` for ``"backbone"`` and ``lr * lr_offsets_mult`` for
    ``"offsets"`` (deformable attention's sampling offsets and reference points, where a model has them).
    ``layer_decay`` (ViTDet: 0.7) scales each parameter's learning rate by ``layer_decay ** (L + 1 - i)``
    at the depth ``(i, L)`` its model's ``layer_depth`` gives (a ViT backbone's blocks;
    :func:`~visiontf.tasks.optim.layer_decay_groups`); None: no decay.
    """

    task = "detection"
    model_kind = Detector

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
        layer_decay: float | None = None,
        cost_class: float | None = None,
        cost_bbox: float | None = None,
        cost_giou: float | None = None,
        loss_ce: float | None = None,
        loss_bbox: float | None = None,
        loss_giou: float | None = None,
        eos_coef: float | None = None,
        matcher_kwargs: dict[str, Any] | None = None,
        criterion_kwargs: dict[str, Any] | None = None,
        eval_backend: Literal["auto", "pycocotools", "faster_coco_eval"] = "auto",
        compile: bool = False,
        on_nonfinite: Literal["raise", "skip"] = "raise",
    ) -> None:
        check_config(type(self).__name__, "model", lr=(lr, positive), lr_backbone=(lr_backbone, non_negative),
                     lr_offsets_mult=(lr_offsets_mult, non_negative), weight_decay=(weight_decay, non_negative),
                     schedule=(schedule, one_of("step", "cosine", "constant")),
                     lr_drop_epochs=(lr_drop_epochs, optional(positive_int)), warmup_steps=(warmup_steps, non_negative_int),
                     layer_decay=(layer_decay, optional(unit_interval_open_left)),
                     cost_class=(cost_class, optional(non_negative)), cost_bbox=(cost_bbox, optional(non_negative)),
                     cost_giou=(cost_giou, optional(non_negative)), loss_ce=(loss_ce, optional(non_negative)),
                     loss_bbox=(loss_bbox, optional(non_negative)), loss_giou=(loss_giou, optional(non_negative)),
                     eos_coef=(eos_coef, optional(unit_interval_open_left)))
        super().__init__(model_name, num_classes, model_kwargs, pretrained, compile, on_nonfinite)
        self.save_hyperparameters()
        given = lambda **kw: {k: v for k, v in kw.items() if v is not None}  # noqa: E731
        matcher = {**given(cost_class=cost_class, cost_bbox=cost_bbox, cost_giou=cost_giou), **(matcher_kwargs or {})}
        criterion = {**given(eos_coef=eos_coef), **(criterion_kwargs or {})}
        criterion["weight_dict"] = {**given(loss_ce=loss_ce, loss_bbox=loss_bbox, loss_giou=loss_giou),
                                    **(criterion.get("weight_dict") or {})}
        # the criterion's matcher runs outside any compiled graph: scipy needs the CPU
        self.criterion = build_criterion(self.model, num_classes, matcher, criterion)
        self.metrics: dict[str, Any] = {}
        self._last_report: dict | None = None

    @property
    def postprocess(self) -> nn.Module:
        """The model's post-processing as its options stand now (``tools/eval.py --postprocess.*`` replaces them)."""
        return build_postprocess(self.model)

    # -- evaluation plumbing -------------------------------------------------------------------
    def _metric(self, stage: str):
        if stage not in self.metrics:
            from visiontf.evaluation.coco_metric import CocoMetric

            dm = self.trainer.datamodule
            ann = dm.test_ann_file if stage == "test" and getattr(dm, "test_ann_file", None) else dm.val_ann_file
            # a head indexed by category id predicts its gaps too: counted and not scored, as COCOeval does
            gaps = self.hparams.num_classes if getattr(dm, "label_space", "contiguous") == "category_id" else None
            self.metrics[stage] = CocoMetric(ann, dm.label_to_cat_id, backend=self.hparams.eval_backend,
                                             num_classes=gaps).to(self.device)
        return self.metrics[stage]

    def _forward(self, images: Tensor, mask: Tensor, targets: list[dict]) -> dict:
        """The model's outputs; training steps give the targets to a model that takes them (denoising)."""
        if self.training and self.model.forward_takes_targets:
            return self.model(images, mask, targets=targets)
        return self.model(images, mask)

    def _step(self, batch) -> tuple[dict, dict[str, Tensor], list[dict]]:
        images, mask, targets = batch
        outputs = self._forward(images, mask, targets)
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
        main, aux = split_loss_terms(losses)
        self.log_dict({f"train/{k}": v for k, v in main.items()}, batch_size=bs)
        self.log_dict({f"train_aux/{k}": v for k, v in aux.items()}, batch_size=bs)
        return loss

    def _eval_step(self, batch, stage: str) -> None:
        images, mask, targets = batch
        outputs = self._forward(images, mask, targets)
        # each image's own loss (the normaliser is its own box count), averaged over the set: the same
        # numbers at any batch size and process count; only training steps synchronise the box count
        for i, target in enumerate(targets):
            losses = self.criterion(one_image(outputs, i, len(targets)), [target], sync_num_boxes=False)
            main, _ = split_loss_terms(losses)
            for k, v in {"loss": losses["loss"], **main}.items():
                self.log_eval_mean(f"{stage}/{k}", v, 1)
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
        duplicates = getattr(metric, "last_duplicates", None)
        if duplicates is not None:  # duplicate pairs per confident detection: what NMS would hide
            self._last_report["dup_rate"] = duplicates["dup_rate"]
            self.log(f"{stage}/dup_rate", float(duplicates["dup_rate"]), sync_dist=False)
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
        if hp.layer_decay is None:
            groups = lr_groups(group_parameters(self.model), lrs, always=("default", "backbone"))
        else:  # ViTDet's layer-wise decay over the depths the model's backbone declares (a ViT's blocks)
            groups = layer_decay_groups(self.model, lrs, hp.layer_decay, always=("default", "backbone"))
        opt = build_optimizer("adamw", groups, hp.lr, hp.weight_decay)
        sched = build_scheduler(opt, hp.schedule, self.total_steps(), hp.warmup_steps, step_epochs=hp.lr_drop_epochs)
        return {"optimizer": opt, "lr_scheduler": sched}
