"""Semantic segmentation (SETR) as a LightningModule, with mmseg-style mIoU evaluation."""
from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any, Literal

import torch.nn.functional as F
from torch import Tensor
from torchmetrics.classification import MulticlassConfusionMatrix

from visiontf.core.config_checks import (
    check_config,
    non_negative,
    non_negative_int,
    one_of,
    optional,
    positive,
    positive_int,
    unit_interval_open_right,
)
from visiontf.data.base import trainer_datamodule
from visiontf.models.contract import Segmenter
from visiontf.tasks.base_task import BaseTask
from visiontf.tasks.optim import OptimArgsMixin, build_optimizer, build_scheduler, group_parameters, lr_groups
from visiontf.tasks.segmentation.segmentation_loss import labelled_cross_entropy
from visiontf.tasks.segmentation.segmentation_metric import format_table, segmentation_scores

log = logging.getLogger(__name__)


class SegmentationTask(OptimArgsMixin, BaseTask):
    """Cross-entropy (ignore 255) on the main logits plus ``aux_weight`` x CE per auxiliary head.

    SGD (or AdamW) with the encoder at ``lr`` and decoder / auxiliary heads at ``lr * head_lr_mult``,
    per-step poly decay to ``min_lr`` (mmseg's ``eta_min``, absolute for every group), optional
    linear warm-up. Validation / test: ``inference_mode`` "whole" or "slide" (``crop_size``,
    ``stride``), multi-scale (``test_scales``) and flip testing by averaging softmax probabilities;
    metrics from a dataset-level confusion matrix (synchronised across DDP ranks on compute):
    ``mIoU`` over classes present (union > 0), ``mAcc``, ``aAcc``, per-class IoU.

    ``score_resolution`` says where pixels are counted when the batches carry the original annotations
    (``(images, masks, sizes)`` from a data module with ``eval_protocol="mmseg"``). It is not called
    ``eval_protocol`` like the data module's option so that the two never collide in Lightning's merged
    hyper-parameters:

    * ``"original"`` (default): mmseg's ``postprocess_result``: each image's logits without the batch
      padding are resized bilinearly (``align_corners=False``) to its original annotation, and IoU is
      counted there; with several scales or flips every view is resized to the annotation before its
      softmax, as mmseg's test-time augmentation.
    * ``"resized"``: the annotations are resized (nearest) to the image the model saw and scored
      there, as visiontf did before (not mmseg's number).

    Batches ``(images, masks)`` hold masks at the image's size already and are scored as they are.
    """

    task = "segmentation"
    model_kind = Segmenter

    def __init__(
        self,
        model_name: str = "setr_naive_vit_tiny_patch16",
        num_classes: int = 150,
        model_kwargs: dict[str, Any] | None = None,
        pretrained: str | None = None,
        optimizer: Literal["sgd", "adamw"] = "sgd",
        lr: float = 0.01,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        head_lr_mult: float = 10.0,
        schedule: Literal["poly", "cosine", "constant"] = "poly",
        power: float = 0.9,
        min_lr: float = 0.0,
        warmup_steps: int = 0,
        ignore_index: int = 255,
        aux_weight: float | None = 0.4,
        inference_mode: Literal["whole", "slide"] = "whole",
        crop_size: int | None = None,
        stride: int | None = None,
        test_scales: list[float] | None = None,
        test_flip: bool = False,
        score_resolution: Literal["original", "resized"] = "original",
        log_per_class: bool = True,
        compile: bool = False,
        on_nonfinite: Literal["raise", "skip"] = "raise",
    ) -> None:
        check_config(type(self).__name__, "model", lr=(lr, positive), momentum=(momentum, unit_interval_open_right),
                     weight_decay=(weight_decay, non_negative), head_lr_mult=(head_lr_mult, non_negative),
                     power=(power, non_negative), min_lr=(min_lr, non_negative), warmup_steps=(warmup_steps, non_negative_int),
                     aux_weight=(aux_weight, optional(non_negative)), crop_size=(crop_size, optional(positive_int)),
                     stride=(stride, optional(positive_int)), optimizer=(optimizer, one_of("sgd", "adamw")))
        super().__init__(model_name, num_classes, model_kwargs, pretrained, compile, on_nonfinite)
        self.save_hyperparameters()
        if inference_mode not in ("whole", "slide"):
            raise ValueError(f"inference_mode={inference_mode!r}; use 'whole' or 'slide'")
        if score_resolution not in ("original", "resized"):
            raise ValueError(f"score_resolution={score_resolution!r}; use 'original' (logits resized to the original "
                             "annotation, mmseg's protocol) or 'resized' (annotation resized to the logits)")
        self.test_scales = list(test_scales or [1.0])
        self.aux_weight = aux_weight if aux_weight is not None else self.model.aux_weight
        self.confmat = MulticlassConfusionMatrix(num_classes, ignore_index=ignore_index)
        self.last_eval: dict[str, Any] | None = None

    def inference_settings(self) -> dict[str, Any]:
        """Whole or sliding-window inference, as validation runs it (the model's own where not set)."""
        hp = self.hparams
        return {k: v for k, v in {"test_mode": hp.inference_mode, "crop_size": hp.crop_size, "stride": hp.stride}.items()
                if v is not None}

    # ------------------------------------------------------------------ training
    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int):
        images, masks = batch
        out = self.model(images)
        logits, aux = (out["out"], out.get("aux", [])) if isinstance(out, dict) else (out, [])
        # 0, not NaN, when every pixel of the batch is ignored; such batches are counted in the log
        ce = lambda x: labelled_cross_entropy(x, masks, self.hparams.ignore_index)[0]  # noqa: E731
        unlabelled = (masks != self.hparams.ignore_index).sum() == 0
        self.log("train/unlabelled_batches", unlabelled.float(), reduce_fx="sum", on_step=False, on_epoch=True)
        terms = {"loss_main": ce(logits)}
        for i, a in enumerate(aux):
            terms[f"loss_aux{i}"] = ce(a)
        loss_aux = sum((terms[f"loss_aux{i}"] for i in range(len(aux))), logits.new_zeros(()))
        loss = terms["loss_main"] + self.aux_weight * loss_aux
        if not self.check_finite(loss, {**terms, "loss_aux": loss_aux}):
            return None
        self.log("train/loss", loss, prog_bar=True)
        self.log("train/loss_main", terms["loss_main"])
        self.log("train/loss_aux", loss_aux)
        return loss

    # ------------------------------------------------------------------ inference
    def _infer(self, images: Tensor) -> Tensor:
        hp = self.hparams
        return self.model.inference(images, hp.inference_mode, crop=hp.crop_size, stride=hp.stride)

    def _single_view(self) -> bool:
        return self.test_scales == [1.0] and not self.hparams.test_flip

    def _views(self, images: Tensor) -> Iterator[Tensor]:
        """Logits (B, K, h, w) of every test view (scale x flip), flipped back, each at its own size."""
        H, W = images.shape[-2:]
        for s in self.test_scales:
            size = (max(1, round(H * s)), max(1, round(W * s)))
            x = images if size == (H, W) else F.interpolate(images, size=size, mode="bilinear", align_corners=False)
            yield self._infer(x)
            if self.hparams.test_flip:
                yield self._infer(x.flip(-1)).flip(-1)

    def predict_logits(self, images: Tensor) -> Tensor:
        """Class scores at the input size: logits for a single scale without flip, else mean softmax probabilities."""
        H, W = images.shape[-2:]
        if self._single_view():
            return self._infer(images)
        probs, n = None, 0
        for logits in self._views(images):
            if logits.shape[-2:] != (H, W):
                logits = F.interpolate(logits, size=(H, W), mode="bilinear", align_corners=False)
            p = logits.softmax(dim=1)
            probs, n = (p if probs is None else probs + p), n + 1
        return probs / n

    def predict_original_size(self, images: Tensor, sizes: Tensor) -> list[Tensor]:
        """Scores (K, H0, W0) of each image at its original annotation's size (mmseg's ``postprocess_result``).

        ``sizes`` (B, 4): each image's (h, w) inside the padded batch and its annotation's (H0, W0).
        Each view's logits lose the padding, are resized bilinearly to (H0, W0) and, with several views,
        go through a softmax there before they are averaged (mmseg's test-time augmentation). One view:
        logits; several: mean probabilities.
        """
        H, W = images.shape[-2:]
        single = self._single_view()
        out: list[Tensor | None] = [None] * len(sizes)
        n = 0
        for logits in self._views(images):
            vh, vw = logits.shape[-2:]
            n += 1
            for i, (h, w, H0, W0) in enumerate(sizes.tolist()):
                valid = logits[i:i + 1, :, :max(1, round(h * vh / H)), :max(1, round(w * vw / W))]
                x = F.interpolate(valid, size=(H0, W0), mode="bilinear", align_corners=False)[0]
                x = x if single else x.softmax(dim=0)
                out[i] = x if out[i] is None else out[i] + x
        return [o if single else o / n for o in out]  # type: ignore[operator]

    # ------------------------------------------------------------------ evaluation
    def _eval_step(self, batch, prefix: str) -> None:
        images, masks = batch[0], batch[1]
        sizes = batch[2] if len(batch) > 2 else None
        if sizes is not None and self.hparams.score_resolution == "original":
            self._eval_original_size(images, masks, sizes, prefix)
            return
        if sizes is not None:  # "resized": the original annotations resized (nearest) to the images
            masks = resized_masks(masks, sizes, images.shape[-2:], self.hparams.ignore_index)
        scores = self.predict_logits(images)
        if self._single_view():  # the mean over the labelled pixels of the whole set
            loss, pixels = labelled_cross_entropy(scores, masks, self.hparams.ignore_index)
            self.log_eval_mean(f"{prefix}/loss", loss, int(pixels))
        self.confmat.update(scores.argmax(dim=1), masks)

    def _eval_original_size(self, images: Tensor, masks: Tensor, sizes: Tensor, prefix: str) -> None:
        ignore = self.hparams.ignore_index
        loss_sum, pixels = images.new_zeros(()), 0
        for scores, mask, (_, _, H0, W0) in zip(self.predict_original_size(images, sizes), masks, sizes.tolist()):
            target = mask[:H0, :W0]
            if self._single_view():
                loss_sum = loss_sum + F.cross_entropy(scores[None], target[None], ignore_index=ignore, reduction="sum")
                pixels += int((target != ignore).sum())
            self.confmat.update(scores.argmax(dim=0)[None], target[None])
        if self._single_view():  # the mean over the labelled pixels of the whole set (NaN when there are none)
            self.log_eval_mean(f"{prefix}/loss", loss_sum / max(pixels, 1), pixels)

    def _class_names(self) -> list[str]:
        dm = trainer_datamodule(self._trainer)
        names = list((dm.class_names if dm is not None else None) or [])
        if len(names) != self.hparams.num_classes:
            names = [f"class_{i}" for i in range(self.hparams.num_classes)]
        return names

    def _eval_end(self, prefix: str) -> None:
        scores = segmentation_scores(self.confmat.compute())
        self.confmat.reset()
        names = self._class_names()
        self.last_eval = {"names": names, **{k: v.detach().cpu() for k, v in scores.items()}}
        self.log(f"{prefix}/mIoU", scores["mIoU"].float(), prog_bar=True)
        self.log(f"{prefix}/mAcc", scores["mAcc"].float())
        self.log(f"{prefix}/aAcc", scores["aAcc"].float())
        if self.hparams.log_per_class:
            for name, v in zip(names, scores["IoU"].tolist()):
                if v == v:  # classes absent from the whole set (NaN) are not logged
                    self.log(f"{prefix}/IoU_{name}", float(v))

    def eval_report(self) -> dict[str, Any] | None:
        """The last validation / test: a printed per-class table plus mIoU, mAcc, aAcc and ``IoU_<class>``."""
        if self.last_eval is None:
            return None
        e = self.last_eval
        table = format_table(e["names"], e["IoU"], e["Acc"])
        table += f"\nmIoU {float(e['mIoU']) * 100:.2f}  mAcc {float(e['mAcc']) * 100:.2f}  aAcc {float(e['aAcc']) * 100:.2f}"
        report: dict[str, Any] = {"table": table, "mIoU": float(e["mIoU"]), "mAcc": float(e["mAcc"]), "aAcc": float(e["aAcc"])}
        report.update({f"IoU_{n}": float(v) for n, v in zip(e["names"], e["IoU"].tolist())})
        return report

    def predict_step(self, batch, batch_idx):
        images = batch[0] if isinstance(batch, (tuple, list)) else batch
        return self.predict_logits(images).argmax(dim=1)

    # ------------------------------------------------------------------ optimisation
    def configure_optimizers(self):
        hp = self.hparams
        groups = lr_groups(group_parameters(self.model),
                           {"encoder": hp.lr, "head": hp.lr * hp.head_lr_mult})
        args = self.optim_args
        opt = build_optimizer(args.optimizer, groups, args.lr, args.weight_decay, args.momentum)
        sched = build_scheduler(opt, args.schedule, self.total_steps(), args.warmup_steps, hp.power, min_lr=hp.min_lr)
        return {"optimizer": opt, "lr_scheduler": sched}


def resized_masks(masks: Tensor, sizes: Tensor, size: tuple[int, int], ignore_index: int) -> Tensor:
    """Original annotations (B, H0max, W0max) resized (nearest, as cv2's ``INTER_NEAREST``) to each image's
    (h, w) from ``sizes`` (B, 4) and padded to ``size`` with ``ignore_index``: the ``"resized"`` protocol."""
    out = masks.new_full((masks.shape[0], *size), ignore_index)
    for i, (h, w, H0, W0) in enumerate(sizes.tolist()):
        m = masks[i, :H0, :W0][None, None].float()
        out[i, :h, :w] = F.interpolate(m, size=(h, w), mode="nearest")[0, 0].to(masks.dtype)
    return out
