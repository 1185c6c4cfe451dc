"""Image classification (ViT, DeiT) as a LightningModule."""
from __future__ import annotations

from typing import Any, Literal

import torch
import torch.nn.functional as F
from timm.data import Mixup
from timm.loss import SoftTargetCrossEntropy
from torch import Tensor
from torchmetrics.classification import MulticlassAccuracy

from visiontf.core.config_checks import (
    check_config,
    fraction,
    non_negative,
    non_negative_int,
    one_of,
    optional,
    positive,
    unit_interval_open_right,
)
from visiontf.models import create_model
from visiontf.models.contract import Classifier
from visiontf.tasks.base_task import BaseTask
from visiontf.tasks.optim import OptimArgs, OptimArgsMixin, build_optimizer, build_scheduler, decay_groups

#: DeiT's warm-up (its ``--warmup-epochs 5``), the classification task's when ``warmup_steps`` is None
DEIT_WARMUP_EPOCHS = 5


def at_least_two_classes(n: object) -> str | None:
    """Classification needs two classes or more: softmax over one class is always 1 (torchmetrics refuses it)."""
    ok = isinstance(n, int) and not isinstance(n, bool) and n >= 2
    return None if ok else ("an integer >= 2: one class leaves nothing to classify (it is linked from data.num_classes, "
                            "the training split's class folders with images: add a folder for another class)")


class ClassificationTask(OptimArgsMixin, BaseTask):
    """Cross-entropy with label smoothing, optional mixup/cutmix, AdamW + warm-up cosine, top-1/top-5.

    ``warmup_steps``: linear warm-up over this many optimizer steps, as every task spells it; None (the
    default) warms up over DeiT's 5 epochs of steps (:data:`DEIT_WARMUP_EPOCHS`).

    DeiT hard distillation: give ``teacher_name`` (and ``teacher_pretrained``) and a distilled
    student (``deit_*_distilled_*``); the distillation head learns the teacher's argmax and the loss
    is ``(1 - alpha) * CE(class head) + alpha * CE(dist head, teacher argmax)``.
    """

    task = "classification"
    model_kind = Classifier

    def __init__(
        self,
        model_name: str = "vit_tiny_patch16_224",
        num_classes: int = 1000,
        model_kwargs: dict[str, Any] | None = None,
        pretrained: str | None = None,
        optimizer: Literal["adamw", "sgd"] = "adamw",
        lr: float = 5e-4,
        weight_decay: float = 0.05,
        warmup_steps: int | None = None,
        schedule: Literal["cosine", "constant"] = "cosine",
        label_smoothing: float = 0.1,
        mixup_alpha: float = 0.0,
        cutmix_alpha: float = 0.0,
        teacher_name: str | None = None,
        teacher_pretrained: str | None = None,
        distill_alpha: float = 0.5,
        compile: bool = False,
        on_nonfinite: Literal["raise", "skip"] = "raise",
    ) -> None:
        check_config(type(self).__name__, "model", num_classes=(num_classes, at_least_two_classes), lr=(lr, positive),
                     weight_decay=(weight_decay, non_negative), warmup_steps=(warmup_steps, optional(non_negative_int)),
                     label_smoothing=(label_smoothing, unit_interval_open_right),
                     mixup_alpha=(mixup_alpha, non_negative), cutmix_alpha=(cutmix_alpha, non_negative),
                     distill_alpha=(distill_alpha, fraction), optimizer=(optimizer, one_of("adamw", "sgd")),
                     schedule=(schedule, one_of("cosine", "constant")))
        super().__init__(model_name, num_classes, model_kwargs, pretrained, compile, on_nonfinite)
        self.save_hyperparameters()
        self.mixup = None
        if mixup_alpha > 0 or cutmix_alpha > 0:
            self.mixup = Mixup(mixup_alpha=mixup_alpha, cutmix_alpha=cutmix_alpha, label_smoothing=label_smoothing, num_classes=num_classes)
            self.soft_ce = SoftTargetCrossEntropy()
        self.teacher = None
        if teacher_name:
            if not self.model.distilled:
                raise ValueError(f"distillation needs a distilled student (deit_*_distilled_*), got {model_name}")
            self.teacher = create_model(teacher_name, pretrained=teacher_pretrained, num_classes=num_classes).eval()
            self.teacher.requires_grad_(False)
        elif self.model.distilled:
            self.model.distilled_training = False  # without a teacher both heads learn the labels
        metrics = lambda k: MulticlassAccuracy(num_classes, top_k=k, average="micro")  # noqa: E731
        self.val_top1, self.val_top5 = metrics(1), metrics(min(5, num_classes))

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int):
        images, labels = batch
        hard = labels
        if self.mixup is not None:
            images, labels = self.mixup(images, labels)
        out = self.model(images)
        terms = {}
        if isinstance(out, tuple):
            logits, dist_logits = out
            with torch.no_grad():
                teacher_labels = self.teacher(images).argmax(dim=1)
            terms["loss_cls"] = self._ce(logits, labels)
            terms["loss_distill"] = F.cross_entropy(dist_logits, teacher_labels)
            a = self.hparams.distill_alpha
            loss = (1 - a) * terms["loss_cls"] + a * terms["loss_distill"]
        else:
            logits = out
            loss = terms["loss_cls"] = self._ce(logits, labels)
        if not self.check_finite(loss, terms):
            return None
        self.log("train/loss", loss, prog_bar=True)
        if self.mixup is None:
            self.log("train/acc", (logits.argmax(1) == hard).float().mean(), prog_bar=True)
        return loss

    def _ce(self, logits: Tensor, labels: Tensor) -> Tensor:
        if labels.ndim == 2:
            return self.soft_ce(logits, labels)
        return F.cross_entropy(logits, labels, label_smoothing=self.hparams.label_smoothing)

    def _eval_step(self, batch, prefix: str) -> None:
        images, labels = batch
        logits = self.model(images)
        self.log_eval_mean(f"{prefix}/loss", F.cross_entropy(logits, labels), len(labels))
        self.val_top1.update(logits, labels)
        self.val_top5.update(logits, labels)

    def _eval_end(self, prefix: str) -> None:
        self.log(f"{prefix}/acc1", self.val_top1.compute(), prog_bar=True)
        self.log(f"{prefix}/acc5", self.val_top5.compute())
        self.val_top1.reset()
        self.val_top5.reset()

    def predict_step(self, batch, batch_idx):
        images = batch[0] if isinstance(batch, (tuple, list)) else batch
        return self.model(images).softmax(dim=-1)

    def configure_optimizers(self):
        hp = self.hparams
        # timm's rule: no weight decay on biases, norms and what the model names (tokens, position embeddings)
        opt = build_optimizer(hp.optimizer, decay_groups(self.model, hp.weight_decay), hp.lr, hp.weight_decay)
        warmup = hp.warmup_steps if hp.warmup_steps is not None else int(DEIT_WARMUP_EPOCHS * self.steps_per_epoch())
        args = OptimArgs.from_hparams(hp, warmup_steps=warmup)
        return {"optimizer": opt, "lr_scheduler": build_scheduler(opt, args.schedule, self.total_steps(), args.warmup_steps)}
