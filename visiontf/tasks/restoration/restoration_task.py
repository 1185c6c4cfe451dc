"""Image restoration (IPT) as a LightningModule: L1 + optional contrastive loss, PSNR-Y / SSIM-Y per task."""
from __future__ import annotations

import logging
import math
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from visiontf.core.config_checks import check_config, non_negative, non_negative_int, one_of, optional, positive, positive_int
from visiontf.core.errors import UserError
from visiontf.data.transforms.imresize import imresize
from visiontf.models.contract import Restorer
from visiontf.tasks.base_task import BaseTask
from visiontf.tasks.optim import OptimArgsMixin
from visiontf.tasks.restoration.restoration_data import RestorationDataModule
from visiontf.tasks.restoration.restoration_metric import RestorationScores

log = logging.getLogger(__name__)


def bicubic_upscale(lq: Tensor, scale: int) -> Tensor:
    """MATLAB ``imresize(lq, scale, 'bicubic')`` of (B, 3, h, w) images in [0, 1] (the SR baseline)."""
    arr = lq.detach().double().cpu().permute(0, 2, 3, 1).numpy()
    up = np.stack([imresize(a, scale=float(scale)) for a in arr])
    return torch.from_numpy(up).permute(0, 3, 1, 2).to(lq.device, lq.dtype)


def patch_contrastive_loss(features: Tensor, patch: int, temperature: float = 0.07, samples: int = 8) -> Tensor:
    """IPT's contrastive loss on the body's patch features: patches of one image are positives, those of
    the other images in the batch negatives (a supervised contrastive loss, labels = image).

    ``features`` (N, C, H, W): ``samples`` random patches of ``patch`` x ``patch`` per image, each a
    normalised vector; the loss is the mean over anchors of ``-log softmax`` of its positives.
    """
    n = features.shape[0]
    if n < 2:
        return features.new_zeros(())
    tokens = F.unfold(features, patch, stride=patch)  # (N, D, L)
    idx = torch.randperm(tokens.shape[-1], device=features.device)[: samples]
    z = F.normalize(tokens[:, :, idx].permute(0, 2, 1).reshape(n * idx.numel(), -1).float(), dim=1)
    labels = torch.arange(n, device=z.device).repeat_interleave(idx.numel())
    sim = z @ z.T / temperature
    self_mask = torch.eye(sim.shape[0], dtype=torch.bool, device=z.device)
    sim = sim.masked_fill(self_mask, float("-inf"))
    log_prob = sim - torch.logsumexp(sim, dim=1, keepdim=True)
    positive_mask = (labels[:, None] == labels[None, :]) & ~self_mask
    return -(log_prob.masked_fill(~positive_mask, 0).sum(1) / positive_mask.sum(1).clamp(min=1)).mean()


class RestorationTask(OptimArgsMixin, BaseTask):
    """Trains an IPT (or any model ``model(x, task=i) -> restored``) on ``(lq, clean, task)`` batches.

    * loss: L1 between the output and the clean image, plus ``contrastive_weight`` x IPT's contrastive
      loss on the body's patch features (temperature ``temperature``; the paper's lambda is 0.1);
    * multi-task: each batch carries one task (drawn by the data module per batch, IPT's pre-training),
      which picks the model's head, tail and query;
    * Adam (``betas``), ``lr`` 1e-4, ``schedule``: ``"step"`` halves the learning rate (``gamma``)
      every ``lr_step`` optimizer steps (EDSR's 2e5; the IPT paper anneals by cosine:
      ``"cosine"``), or ``"constant"``; optional linear ``warmup_steps``;
    * fine-tuning a single task from the multi-task weights: ``model_name: ipt_sr_x2`` with
      ``pretrained: IPT_pretrain.pt`` (the registry extracts that task's head, tail and query);
    * validation: PSNR-Y and SSIM-Y per task (:mod:`visiontf.tasks.restoration.restoration_measures`, IPT's
      protocol), their mean over tasks (``val/psnr_y``, ``val/ssim_y``), and for SR tasks the
      PSNR-Y of MATLAB-bicubic upscaling (``val/psnr_y_bicubic_<task>``) as the baseline.

    There is no class count (``num_classes`` stays None).
    """

    task = "restoration"
    model_kind = Restorer

    def __init__(
        self,
        model_name: str = "ipt_tiny",
        num_classes: int | None = None,
        model_kwargs: dict[str, Any] | None = None,
        pretrained: str | None = None,
        lr: float = 1e-4,
        betas: tuple[float, float] = (0.9, 0.999),
        weight_decay: float = 0.0,
        schedule: Literal["step", "cosine", "constant"] = "step",
        lr_step: int = 200_000,
        gamma: float = 0.5,
        warmup_steps: int = 0,
        contrastive_weight: float = 0.0,
        temperature: float = 0.07,
        contrastive_samples: int = 8,
        bicubic_baseline: bool = True,
        compile: bool = False,
        on_nonfinite: Literal["raise", "skip"] = "raise",
    ) -> None:
        check_config(type(self).__name__, "model", lr=(lr, positive), weight_decay=(weight_decay, non_negative),
                     schedule=(schedule, one_of("step", "cosine", "constant")), lr_step=(lr_step, positive_int),
                     gamma=(gamma, positive), warmup_steps=(warmup_steps, non_negative_int),
                     contrastive_weight=(contrastive_weight, non_negative), temperature=(temperature, positive),
                     contrastive_samples=(contrastive_samples, positive_int), num_classes=(num_classes, optional(positive_int)))
        if num_classes is not None:
            log.warning("RestorationTask: num_classes=%s is ignored (restoration has no classes)", num_classes)
        super().__init__(model_name, None, model_kwargs, pretrained, compile, on_nonfinite)
        self.save_hyperparameters()
        self.tasks, self.scales = tuple(self.model.tasks), tuple(self.model.scales)
        self.scores = RestorationScores(len(self.tasks))
        self.last_eval: dict[str, Any] | None = None
        self._features: Tensor | None = None
        if contrastive_weight > 0:
            if not hasattr(self.model, "body"):
                raise ValueError(f"contrastive_weight needs a model with a .body (IPT); {model_name} has none")
            self.model.body.register_forward_hook(self._keep_features)

    def _keep_features(self, module, inputs, output) -> None:
        self._features = output if self.training else None

    def inference_settings(self) -> dict[str, Any]:
        return {"tasks": self.tasks}

    def setup(self, stage: str) -> None:
        # a batch's task index picks the model's head of that index: data of other tasks (an x2 checkpoint
        # scored on x3 data) failed mid-validation on tensor sizes
        dm = self.trainer.datamodule if self._trainer is not None else None
        if isinstance(dm, RestorationDataModule) and tuple(dm.tasks) != self.tasks:
            raise UserError(
                f"data.init_args.tasks {list(dm.tasks)}, but {self.hparams.model_name} restores {list(self.tasks)} "
                f"(its heads, from the model's tasks/scale or the checkpoint); give the data the model's tasks "
                f"(--data.init_args.tasks=[{', '.join(self.tasks)}]), or train a model for {list(dm.tasks)} "
                "(model_kwargs.tasks / scale)")

    # ------------------------------------------------------------------ training
    def training_step(self, batch: tuple[Tensor, Tensor, Tensor], batch_idx: int):
        lq, hr, task = batch
        t = int(task[0])
        out = self.model(lq, task=t)
        terms = {"loss_l1": F.l1_loss(out, hr)}
        loss = terms["loss_l1"]
        if self.hparams.contrastive_weight > 0 and self._features is not None:
            patch = int(self.model.body.patch_dim)
            terms["loss_contrastive"] = patch_contrastive_loss(self._features, patch, self.hparams.temperature,
                                                               self.hparams.contrastive_samples)
            loss = loss + self.hparams.contrastive_weight * terms["loss_contrastive"]
        self._features = None
        if not self.check_finite(loss, terms):
            return None
        self.log("train/loss", loss, prog_bar=True)
        for k, v in terms.items():
            self.log(f"train/{k}", v)
        self.log(f"train/loss_{self.tasks[t]}", terms["loss_l1"])
        return loss

    # ------------------------------------------------------------------ evaluation
    def restore(self, lq: Tensor, task: int) -> Tensor:
        """The model's output for ``lq`` (B, 3, h, w) in [0, 1] (any size: the model tiles it)."""
        return self.model(lq, task=task)

    def _eval_step(self, batch, prefix: str) -> None:
        lq, hr, task = batch
        t = int(task[0])
        sr = self.restore(lq, t)
        self.log_eval_mean(f"{prefix}/loss", F.l1_loss(sr, hr), lq.shape[0])  # one size per batch: a mean of images
        scale = self.scales[t]
        self.scores.update(sr.float(), hr.float(), t, scale)
        if self.hparams.bicubic_baseline and scale > 1:
            self.scores.update_baseline(bicubic_upscale(lq.float(), scale), hr.float(), t, scale)

    def _eval_end(self, prefix: str) -> None:
        # reshape: torchmetrics squeezes one-element results (one task)
        s = {k: v.detach().cpu().reshape(-1) for k, v in self.scores.compute().items()}
        self.scores.reset()
        seen = s["count"] > 0
        self.last_eval = {"tasks": self.tasks, **s}
        if not bool(seen.any()):
            return
        self.log(f"{prefix}/psnr_y", float(s["psnr"][seen].mean()), prog_bar=True)
        self.log(f"{prefix}/ssim_y", float(s["ssim"][seen].mean()))
        for i, name in enumerate(self.tasks):
            if seen[i]:
                self.log(f"{prefix}/psnr_y_{name}", float(s["psnr"][i]))
                self.log(f"{prefix}/ssim_y_{name}", float(s["ssim"][i]))
            if not math.isnan(float(s["bicubic_psnr"][i])):
                self.log(f"{prefix}/psnr_y_bicubic_{name}", float(s["bicubic_psnr"][i]))

    def eval_report(self) -> dict[str, Any] | None:
        """The last validation / test as a table (task, images, PSNR-Y, SSIM-Y, bicubic PSNR-Y) and its numbers."""
        if self.last_eval is None:
            return None
        e = self.last_eval
        lines = [f"{'task':<18}{'images':>7}{'PSNR-Y':>9}{'SSIM-Y':>9}{'bicubic':>9}"]
        report: dict[str, Any] = {}
        for i, name in enumerate(e["tasks"]):
            n = int(e["count"][i])
            if not n:
                continue
            base = float(e["bicubic_psnr"][i])
            lines.append(f"{name:<18}{n:>7}{float(e['psnr'][i]):>9.3f}{float(e['ssim'][i]):>9.4f}"
                         f"{'' if math.isnan(base) else f'{base:>9.3f}'}")
            report[f"psnr_y_{name}"], report[f"ssim_y_{name}"] = float(e["psnr"][i]), float(e["ssim"][i])
            if not math.isnan(base):
                report[f"psnr_y_bicubic_{name}"] = base
        report["table"] = "\n".join(lines)
        return report

    def predict_step(self, batch, batch_idx):
        lq, _, task = batch
        return self.restore(lq, int(task[0])).clamp(0, 1)

    # ------------------------------------------------------------------ optimisation
    def configure_optimizers(self):
        hp, args = self.hparams, self.optim_args
        params = [p for p in self.model.parameters() if p.requires_grad]
        opt = torch.optim.Adam(params, lr=args.lr, betas=tuple(hp.betas), weight_decay=args.weight_decay)
        total = max(1, self.total_steps())

        def factor(step: int) -> float:
            warm = min(1.0, (step + 1) / args.warmup_steps) if args.warmup_steps else 1.0
            if args.schedule == "step":
                return warm * hp.gamma ** (step // hp.lr_step)
            if args.schedule == "cosine":
                return warm * 0.5 * (1 + math.cos(math.pi * min(1.0, step / total)))
            return warm

        sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
