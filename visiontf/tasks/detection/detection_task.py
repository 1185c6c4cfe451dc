"""DETR-family object detection as a LightningModule: set loss, AdamW with per-group lrs, COCO mAP."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import Tensor, nn

from visiontf.core.config_checks import (
    ConfigError,
    check_config,
    non_negative,
    non_negative_int,
    one_of,
    optional,
    positive,
    positive_int,
    unit_interval_open_left,
)
from visiontf.data.base import DetectionDataModule, trainer_datamodule
from visiontf.evaluation.coco import METRIC_NAMES
from visiontf.models.contract import Detector
from visiontf.set_prediction import build_criterion, build_postprocess
from visiontf.set_prediction.mask_postprocess import add_instance_masks
from visiontf.set_prediction.set_loss_section import SHORTCUTS, SetLoss, migrate_shortcuts
from visiontf.tasks.base_task import BaseTask
from visiontf.tasks.detection.mask_eval import MaskEvaluation, sync_thing_classes
from visiontf.tasks.optim import (
    FlatCosine,
    OptimArgsMixin,
    ParamGroupRule,
    build_flat_cosine,
    build_optimizer,
    build_scheduler,
    group_parameters,
    layer_decay_groups,
    lr_groups,
    rule_groups,
)

if TYPE_CHECKING:
    from visiontf.evaluation.readouts.readouts import DetectionReport

#: the per-class numbers logged at the end of each evaluation (keys of ``CocoMetric.last_per_class``' rows)
PER_CLASS_METRICS = ("AP", "AP50", "AP75", "AR100")


def split_loss_terms(losses: dict[str, Tensor]) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """``(main, aux)`` loss terms for logging, by name alone: auxiliary decoder layers' terms end in
    ``_<layer>`` (``loss_ce_0``, ``loss_bbox_dn_2``); every other term (``loss_ce``, ``loss_ce_enc``,
    ``loss_giou_dn``, ``class_error``, ...) is a main one. The weighted total ``loss`` is in neither."""
    main = {k: v for k, v in losses.items() if k != "loss" and not k[-1].isdigit()}
    aux = {k: v for k, v in losses.items() if k[-1].isdigit()}
    return main, aux


def eval_stat_weight(name: str, target: dict) -> int:
    """How much one image's value of the loss term ``name`` weighs in the evaluation set's value.

    ``class_error`` (percent of matched queries whose top class is wrong) weighs the image's matched
    queries, its box count: the set's value is then wrong matches / all matches, as DETR's is over a
    batch, and an image without boxes (whose ``class_error`` is 100 by DETR's convention: nothing was
    right) weighs nothing. Every other term is each image's own value, one image one weight.

    ``cardinality_error`` is left out of the evaluation of sigmoid-head models (Deformable DETR, DINO):
    there it counts queries whose highest logit is not the last class, a leftover of DETR's "no object"
    column that the originals log unchanged. It says nothing about the detections, and an argmax among
    a background query's near-equal logits flips with float rounding; it stays in the training logs.
    """
    return len(target["labels"]) if name == "class_error" else 1


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


class DetectionTask(OptimArgsMixin, BaseTask):
    """Training and COCO evaluation of any detector of the DETR family (DETR, Deformable DETR, ...).

    Batches are ``(images (B,3,H,W), mask (B,H,W) True on padding, targets)`` from
    :class:`visiontf.tasks.detection.coco_data.CocoDataModule`. Validation mAP is pycocotools' ``COCOeval`` on the
    original annotation file (its ``area`` and ``iscrowd``), over every rank's predictions with
    repeated images de-duplicated by image id. Clip gradients with ``trainer.gradient_clip_val: 0.1``
    as both papers do.

    The model decides how it is trained and decoded: its ``class_head`` picks the matcher and
    criterion with the family's published defaults (:func:`visiontf.set_prediction.build_criterion`: DETR
    ce 1 / L1 5 / GIoU 2, "no object" weight 0.1; Deformable DETR focal, cost and loss class 2, L1 5,
    GIoU 2) and the post-processing (:func:`visiontf.set_prediction.build_postprocess`). The ``set_loss``
    section (:class:`~visiontf.set_prediction.set_loss_section.SetLoss`: ``matcher``, ``criterion``, ``weights``)
    overrides single defaults (a field left out keeps the family's); ``set_loss.criterion.options`` passes a
    family's own criterion keywords unchanged. The keywords of before the section (``cost_class``, ``cost_bbox``,
    ``cost_giou``, ``loss_ce``, ``loss_bbox``, ``loss_giou``, ``eos_coef``, ``matcher_kwargs``,
    ``criterion_kwargs``) are still read into it, with one ``FutureWarning`` that shows the new spelling.

    A model whose forward needs the ground truth while training (denoising queries) declares
    ``forward_takes_targets = True``; training steps then call ``model(images, mask, targets=targets)``.
    Evaluation and prediction never pass targets.

    Every loss term the criterion returns is logged under its own name: ``train/<term>`` for the
    final layer, two-stage proposals (``_enc``) and other suffixed terms, ``train_aux/<term>_<i>``
    for auxiliary decoder layers; evaluation logs the main terms under ``val/`` or ``test/``, each the
    mean over the images of that image's own loss (independent of batch size and process count).
    With ``log_per_class`` (the default), each category's AP, AP50, AP75 and AR@100 are logged too, as
    ``<stage>/per_class/<AP|AP50|AP75|AR100>/<name>`` (categories without objects are not), slices of
    COCOeval's own arrays (:mod:`visiontf.evaluation.readouts.per_class`); the table, the PR curves, the
    confusion matrix and TIDE's breakdown are the :class:`~visiontf.callbacks.DetectionReadouts` callback's.

    ``compile``: ``True`` runs the whole model through ``torch.compile``; ``"transformer"`` only its
    encoder-decoder (``model.transformer_modules()``: DETR's ``transformer``, RT-DETR's encoder and decoder; the
    backbone's convolutions are cuDNN's already). The matcher and the loss stay eager either way. Off by default: not yet measured on a GPU
    (``benchmarks/gpu.py --sections s``).

    Learning rates follow the model's own parameter groups (``model.param_group(name)``): ``lr``
    for ``"default"``, ``lr_backbone`` for ``"backbone"`` and ``lr * lr_offsets_mult`` for
    ``"offsets"`` (deformable attention's sampling offsets and reference points, where a model has them).
    ``layer_decay`` (ViTDet: 0.7) scales each parameter's learning rate by ``layer_decay ** (L + 1 - i)``
    at the depth ``(i, L)`` its model's ``layer_depth`` gives (a ViT backbone's blocks;
    :func:`~visiontf.tasks.optim.layer_decay_groups`); None: no decay.

    ``param_groups``: declared optimizer groups, a list of :class:`~visiontf.tasks.optim.ParamGroupRule` sections
    (``{pattern, kinds, weight_decay, lr}``): the parameters whose name the regular expression finds and whose kind
    (``norm``, ``bias``, ``weight``, by the module holding them) is listed get the rule's weight decay and learning
    rate; the first rule that takes a parameter wins, the rest keep the groups above. The originals' weight-decay
    exemptions (RT-DETR, D-FINE, DEIM) are written so in their configs.

    ``schedule: flat_cosine`` with a ``flat_cosine`` section (:class:`~visiontf.tasks.optim.FlatCosine`) is DEIM's
    flat-cosine rate by epoch, its warm-up over ``warmup_steps`` (quadratic, as DEIM's).
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
        schedule: Literal["step", "cosine", "constant", "flat_cosine"] = "step",
        lr_drop_epochs: int | None = 200,
        warmup_steps: int = 0,
        layer_decay: float | None = None,
        param_groups: list[ParamGroupRule] | None = None,
        flat_cosine: FlatCosine | None = None,
        set_loss: SetLoss | None = None,
        eval_backend: Literal["auto", "pycocotools", "faster_coco_eval"] = "auto",
        compile: bool | Literal["transformer"] = False,
        on_nonfinite: Literal["raise", "skip"] = "raise",
        log_per_class: bool = True,
        *,
        cost_class: float | None = None,
        cost_bbox: float | None = None,
        cost_giou: float | None = None,
        loss_ce: float | None = None,
        loss_bbox: float | None = None,
        loss_giou: float | None = None,
        eos_coef: float | None = None,
        matcher_kwargs: dict[str, Any] | None = None,
        criterion_kwargs: dict[str, Any] | None = None,
    ) -> None:
        check_config(type(self).__name__, "model", lr=(lr, positive), lr_backbone=(lr_backbone, non_negative),
                     lr_offsets_mult=(lr_offsets_mult, non_negative), weight_decay=(weight_decay, non_negative),
                     schedule=(schedule, one_of("step", "cosine", "constant", "flat_cosine")),
                     lr_drop_epochs=(lr_drop_epochs, optional(positive_int)), warmup_steps=(warmup_steps, non_negative_int),
                     layer_decay=(layer_decay, optional(unit_interval_open_left)),
                     compile=(compile, one_of(False, True, "transformer")))
        # the typed sections, checked here and kept as plain mappings in the hyper-parameters (checkpoints, hparams.yaml)
        try:
            rules = [ParamGroupRule.of(r) for r in param_groups or ()]
            schedule_args = None if flat_cosine is None else FlatCosine.of(flat_cosine)
            # the keywords of before the set_loss section (configs, command lines, checkpoints' hyper-parameters):
            # read into it by name with one FutureWarning, and saved only as the section
            loss_section = migrate_shortcuts(
                {"cost_class": cost_class, "cost_bbox": cost_bbox, "cost_giou": cost_giou, "loss_ce": loss_ce,
                 "loss_bbox": loss_bbox, "loss_giou": loss_giou, "eos_coef": eos_coef,
                 "matcher_kwargs": matcher_kwargs, "criterion_kwargs": criterion_kwargs},
                set_loss, owner=type(self).__name__)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"{type(self).__name__}: model.init_args.{e}") from None
        if (schedule == "flat_cosine") != (schedule_args is not None):
            raise ConfigError(f"{type(self).__name__}: model.init_args.schedule flat_cosine and the flat_cosine section go "
                              "together: set both (flat_cosine: {flat_epochs: ..., no_aug_epochs: ...}) or neither")
        if rules and layer_decay is not None:
            raise ConfigError(f"{type(self).__name__}: model.init_args.param_groups and layer_decay do not combine yet; "
                              "use one of them")
        param_groups = [r.as_dict() for r in rules] or None
        flat_cosine = None if schedule_args is None else schedule_args.as_dict()
        set_loss = None if loss_section.is_empty() else loss_section.as_dict()
        super().__init__(model_name, num_classes, model_kwargs, pretrained, compile is True, on_nonfinite)
        # "transformer": torch.compile of the encoder-decoder alone; the backbone (cuDNN's convolutions
        # already) and the post-processing stay eager, and the graph breaks of the rest do not matter
        self.compile_transformer = compile == "transformer"
        self.save_hyperparameters(ignore=list(SHORTCUTS))
        # the criterion's matcher runs outside any compiled graph: scipy needs the CPU
        self.criterion = build_criterion(self.model, num_classes, loss_section.matcher_kwargs(), loss_section.criterion_kwargs())
        self.metrics: dict[str, Any] = {}
        self._last_report: dict | None = None
        # a model with a mask head is also scored on its masks (mask AP, PQ): visiontf.tasks.detection.mask_eval
        self.mask_eval = MaskEvaluation(eval_backend) if self.model.mask_options is not None else None

    def setup(self, stage: str) -> None:
        dm = self.trainer.datamodule if self._trainer is not None else None
        if self.mask_eval is not None and dm is not None:
            sync_thing_classes(self.model, dm, self.hparams)

    def configure_model(self) -> None:
        super().configure_model()
        if self.compile_transformer:
            for module in self.model.transformer_modules():
                if module._compiled_call_impl is None:
                    module.compile()

    @property
    def postprocess(self) -> nn.Module:
        """The model's post-processing as its options stand now (``tools/eval.py --postprocess.*`` replaces them)."""
        return build_postprocess(self.model)

    # -- evaluation plumbing -------------------------------------------------------------------
    def _metric(self, stage: str):
        if stage not in self.metrics:
            from visiontf.tasks.detection.coco_metric import CocoMetric

            dm = trainer_datamodule(self.trainer)
            if not isinstance(dm, DetectionDataModule):
                raise TypeError(f"{type(self).__name__} scores with COCO's protocol against the data module's annotation "
                                f"files: give it a visiontf.data.base.DetectionDataModule (CocoDataModule), not "
                                f"{type(dm).__name__ if dm is not None else 'bare dataloaders'}")
            # a head indexed by category id predicts its gaps too: counted and not scored, as COCOeval does
            gaps = self.hparams.num_classes if dm.label_space == "category_id" else None
            self.metrics[stage] = CocoMetric(dm.ann_file(stage), dm.label_to_cat_id, backend=self.hparams.eval_backend,
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
                if k.startswith("cardinality_error") and self.model.class_head != "softmax":
                    continue  # a training-log diagnostic only for sigmoid heads (eval_stat_weight's docstring)
                self.log_eval_mean(f"{stage}/{k}", v, eval_stat_weight(k, target))
        sizes = torch.stack([t["orig_size"] for t in targets]).to(outputs["pred_boxes"].device)
        preds = self.postprocess(outputs, sizes)
        ids = torch.as_tensor([int(t["image_id"]) for t in targets], device=self.device)
        self._metric(stage).update(preds, ids)
        if self.mask_eval is not None:
            dm = trainer_datamodule(self.trainer)
            gaps = self.hparams.num_classes if isinstance(dm, DetectionDataModule) and dm.label_space == "category_id" else None
            self.mask_eval.update(stage, self.model, dm, outputs, preds, targets, gaps)

    def _eval_end(self, stage: str) -> None:
        metric = self._metric(stage)
        stats = metric.compute()
        self._last_report = {k: float(v) for k, v in stats.items() if torch.is_tensor(v) and v.numel() == 1}
        table = getattr(metric, "last_table", None)
        if table:
            self._last_report["table"] = table
        self.log_dict({f"{stage}/{k}": stats[k].float() for k in METRIC_NAMES if k in stats}, sync_dist=False)
        self.log(f"{stage}/mAP", stats["map"].float(), prog_bar=True, sync_dist=False)
        per_class = metric.last_per_class
        if per_class is not None:
            self._last_report["per_class"] = per_class
            if self.hparams.log_per_class:
                for row in per_class:
                    for key in PER_CLASS_METRICS:
                        if row[key] == row[key]:  # NaN: a category without objects in these images
                            self.log(f"{stage}/per_class/{key}/{row['name']}", float(row[key]), sync_dist=False)
        duplicates = getattr(metric, "last_duplicates", None)
        if duplicates is not None:  # duplicate pairs per confident detection: what NMS would hide
            self._last_report["dup_rate"] = duplicates["dup_rate"]
            self.log(f"{stage}/dup_rate", float(duplicates["dup_rate"]), sync_dist=False)
        metric.reset()
        if self.mask_eval is not None:
            values, tables = self.mask_eval.compute(stage)
            self.log_dict({f"{stage}/{k}": v for k, v in values.items()}, sync_dist=False)
            self._last_report.update({k: float(v) for k, v in values.items()})
            if tables:
                self._last_report["table"] = "\n\n".join([self._last_report.get("table", ""), *tables.values()]).strip()

    def predict_step(self, batch, batch_idx):
        images, mask, targets = batch
        outputs = self.model(images, mask)
        sizes = torch.stack([t["orig_size"] for t in targets]).to(images.device)
        preds = self.postprocess(outputs, sizes)
        if self.model.mask_options is not None:  # instance masks (n, H, W) bool at the original sizes
            add_instance_masks(preds, outputs, torch.stack([t["size"] for t in targets]), sizes,
                               self.model.mask_options.mask_threshold)
        for p, t in zip(preds, targets):
            p["image_id"] = int(t["image_id"])
        return preds

    def eval_report(self) -> dict | None:
        """The last evaluation's COCO table and stats, and ``per_class`` rows (used by ``tools/eval.py``)."""
        return self._last_report

    def eval_readouts(self, stage: str, full: bool = True, score_threshold: float = 0.5) -> DetectionReport | None:
        """The last ``stage`` evaluation's :class:`~visiontf.evaluation.readouts.readouts.DetectionReport` (per-class
        numbers; with ``full``, the confusion matrix at ``score_threshold`` and TIDE's breakdown), None before one."""
        metric = self.metrics.get(stage)
        return None if metric is None else metric.readouts(full=full, score_threshold=score_threshold)

    # -- optimisation --------------------------------------------------------------------------
    def configure_optimizers(self):
        hp = self.hparams
        lrs = {"default": hp.lr, "backbone": hp.lr_backbone, "offsets": hp.lr * hp.lr_offsets_mult}
        # default and backbone are always there (possibly empty), so DETR's optimizer state keeps its layout
        rules = [ParamGroupRule.of(r) for r in hp.get("param_groups") or ()]
        if rules:  # the declared groups (weight-decay exemptions, their own rates) split off the lr groups
            groups = rule_groups(self.model, lrs, rules, always=("default", "backbone"))
        elif hp.layer_decay is None:
            groups = lr_groups(group_parameters(self.model), lrs, always=("default", "backbone"))
        else:  # ViTDet's layer-wise decay over the depths the model's backbone declares (a ViT's blocks)
            groups = layer_decay_groups(self.model, lrs, hp.layer_decay, always=("default", "backbone"))
        args = self.optim_args
        opt = build_optimizer("adamw", groups, args.lr, args.weight_decay)
        if hp.get("flat_cosine") is not None:  # DEIM's flat-cosine, by epoch
            epochs = max(1, self.trainer.max_epochs or 1) if self._trainer is not None else 1
            sched = build_flat_cosine(opt, FlatCosine.of(hp.flat_cosine), self.steps_per_epoch(), epochs, args.warmup_steps)
            return {"optimizer": opt, "lr_scheduler": sched}
        sched = build_scheduler(opt, args.schedule, self.total_steps(), args.warmup_steps, step_epochs=hp.lr_drop_epochs)
        return {"optimizer": opt, "lr_scheduler": sched}
