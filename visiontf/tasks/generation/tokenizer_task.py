"""Training an image tokenizer (VQGAN's first stage) as taming does, under Lightning's manual optimisation.

Each batch: a generator step (L1 + LPIPS, codebook loss, and from ``disc_start`` on the adaptive-weight
GAN term, :mod:`visiontf.tasks.generation.vqgan_loss`) on the autoencoder's Adam, then, from ``disc_start`` on,
a hinge step on the discriminator's Adam. Lightning 2 has no ``optimizer_idx``, so both steps are
written out here (``automatic_optimization = False``); ``toggle_optimizer`` freezes the other
network during each backward, as Lightning's automatic two-optimizer loop did for taming.

Differences from taming, deliberate: before ``disc_start`` the discriminator is neither run nor stepped
(taming runs it with a factor 0, which changes nothing but BatchNorm running statistics that training
never reads, and steps its Adam with zero gradients, which only advances Adam's step counter); the
schedule counts batches (``batches_done``, saved in the checkpoint), not Lightning's ``global_step``,
which under manual optimisation counts every ``optimizer.step()`` (two per batch once the
discriminator is on; ``trainer.max_steps`` counts those).

Learning rate (taming's ``main.py``): ``base_lr x batch_size x devices x accumulate`` with
``scale_lr`` (4.5e-6 for the ImageNet models), else ``base_lr``. Gradient clipping
(``gradient_clip_val``) is done here (Lightning refuses ``trainer.gradient_clip_val`` under manual
optimisation), after the unscaling that mixed precision needs. Under DDP use
``strategy: ddp_find_unused_parameters_true`` (each step leaves the other network without gradients);
gradients are also averaged here before each step, so both networks stay identical across ranks.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Literal

import lightning as L
import torch
from torch import Tensor, nn

from visiontf.core.config_checks import check_config, non_negative, non_negative_int, one_of, optional, positive, positive_int
from visiontf.core.distributed import is_distributed, sum_over_ranks
from visiontf.data.base import trainer_datamodule
from visiontf.models import create_model
from visiontf.models.contract import Tokenizer
from visiontf.models.vqgan.discriminator import NLayerDiscriminator
from visiontf.tasks.base_task import BaseTask
from visiontf.tasks.generation.fid import frechet_inception_distance
from visiontf.tasks.generation.vqgan_loss import adaptive_weight, code_usage, hinge_d_loss, load_lpips, psnr

log = logging.getLogger(__name__)


class TokenizerTask(BaseTask):
    """VQGAN tokenizer training (taming's ``VQModel`` + ``VQLPIPSWithDiscriminator``).

    Args:
        model_name, model_kwargs, pretrained: the registry's VQGAN (``vqgan_tiny``, ...); ``model_kwargs``
            may set ``quantizer_kwargs`` (k-means init, dead-code restarts, l2 codes, EMA codebook).
        num_classes: unused (linked from the data by the CLI; a tokenizer has ``num_codes``).
        base_lr, scale_lr, accumulate: the learning rate as in taming's ``main.py`` (see module docstring).
        warmup_steps: the autoencoder's learning rate rises linearly over this many optimizer steps (0, taming:
            none). Beyond taming, for short runs at a large rate: the first full-rate Adam steps can turn
            every latent to one direction, and the codebook then collapses to a code or two.
        rec_loss: the pixel reconstruction term: ``"l1"`` (taming's ``|x - x_rec|``) or ``"l2"`` (the mean
            squared error, which PSNR measures; beyond taming, for short runs without LPIPS). Validation
            logs both as ``rec_loss`` (L1, as taming) and ``psnr``.
        perceptual_weight: LPIPS weight (1.0 in taming; 0 trains without LPIPS, e.g. without VGG16 weights).
        lpips_vgg16: torchvision's VGG16 file for LPIPS (default: the torch hub cache).
        codebook_weight, disc_weight, disc_factor, disc_start: taming's loss settings (1.0, 0.8, 1.0; the
            discriminator joins after ``disc_start`` batches).
        disc_ndf, disc_layers: the PatchGAN's width and depth (64, 3).
        gradient_clip_val: clip each network's gradient norm to this (None: no clipping).
        rfid: also compute the rFID of the reconstructions against the inputs over the whole validation (or
            test) set, logged as ``val/rfid`` (off by default: it needs torch-fidelity's Inception weights,
            :mod:`visiontf.tasks.generation.fid`; a missing file stops the run at setup with where to put it).
        fid_inception: that Inception weights file (default: the torch hub cache).

    ``fid_feature`` (an attribute, not an argument): a module to use instead of Inception (torchmetrics'
    custom ``feature``), e.g. a small network in tests.
    """

    task = "generation"
    model_kind = Tokenizer
    model_kind_hint = "use a VQGAN first stage such as vqgan_tiny"

    @classmethod
    def check_model_arguments(cls, init_args: Mapping[str, Any]) -> None:
        """As the task builds it: without ``num_classes`` (a tokenizer has no classes)."""
        super().check_model_arguments({**init_args, "num_classes": None})

    def __init__(
        self,
        model_name: str = "vqgan_tiny",
        num_classes: int | None = None,
        model_kwargs: dict[str, Any] | None = None,
        pretrained: str | None = None,
        base_lr: float = 4.5e-6,
        scale_lr: bool = True,
        accumulate: int = 1,
        warmup_steps: int = 0,
        rec_loss: Literal["l1", "l2"] = "l1",
        perceptual_weight: float = 1.0,
        lpips_vgg16: str | None = None,
        codebook_weight: float = 1.0,
        disc_weight: float = 0.8,
        disc_factor: float = 1.0,
        disc_start: int = 250001,
        disc_ndf: int = 64,
        disc_layers: int = 3,
        gradient_clip_val: float | None = None,
        rfid: bool = False,
        fid_inception: str | None = None,
        compile: bool = False,
        on_nonfinite: Literal["raise", "skip"] = "raise",
    ) -> None:
        init_args = {k: v for k, v in locals().items() if k not in ("self", "__class__")}
        check_config(type(self).__name__, "model", base_lr=(base_lr, positive), accumulate=(accumulate, positive_int),
                     warmup_steps=(warmup_steps, non_negative_int),
                     perceptual_weight=(perceptual_weight, non_negative), codebook_weight=(codebook_weight, non_negative),
                     disc_weight=(disc_weight, non_negative), disc_factor=(disc_factor, non_negative),
                     disc_start=(disc_start, non_negative_int), disc_ndf=(disc_ndf, positive_int),
                     disc_layers=(disc_layers, positive_int), gradient_clip_val=(gradient_clip_val, optional(positive)),
                     on_nonfinite=(on_nonfinite, one_of("raise", "skip")), rec_loss=(rec_loss, one_of("l1", "l2")))
        L.LightningModule.__init__(self)  # BaseTask's constructor needs a class count; a tokenizer has none
        self.init_eval_state()
        self.save_hyperparameters()  # under LightningCLI: the hyper-parameters it gives (with _class_path)
        if not self.hparams:  # built directly: frame inspection needs super().__init__, so state them
            self.save_hyperparameters(init_args)
        self._model_name, self._num_classes = model_name, None
        self.model = create_model(model_name, pretrained=pretrained, **(model_kwargs or {}))
        self.check_model_kind(model_name)
        self.compile_model, self.on_nonfinite, self.nonfinite_steps = compile, on_nonfinite, 0
        self.discriminator = NLayerDiscriminator(self.model.in_channels, disc_ndf, disc_layers)
        self.register_buffer("batches_done", torch.zeros((), dtype=torch.long))
        self.automatic_optimization = False
        self._lpips = None  # loaded on first use, never saved in checkpoints (fixed weights)
        self._val_counts: Tensor | None = None
        self.fid_feature: nn.Module | None = None
        self._fid = None  # the FID metric, built at setup; not a submodule (Inception is not saved in checkpoints)

    # ------------------------------------------------------------------ rFID
    def setup(self, stage: str) -> None:
        if self.hparams.get("rfid") and self._fid is None:
            # at setup, so that missing Inception weights stop the run before any training
            object.__setattr__(self, "_fid", frechet_inception_distance(self.hparams.fid_inception, self.fid_feature))

    def _update_fid(self, x: Tensor, x_rec: Tensor) -> None:
        fid = self._fid.to(x.device)
        with torch.autocast(x.device.type, enabled=False):  # Inception in float32, as published FIDs are
            fid.update(((x.float() + 1) / 2).clamp(0, 1), real=True)  # taming's [-1, 1] -> the metric's [0, 1]
            fid.update(((x_rec.float() + 1) / 2).clamp(0, 1), real=False)

    def _log_fid(self, stage: str) -> None:
        fid = self._fid
        if int(fid.real_features_num_samples) + int(fid.fake_features_num_samples) == 0:
            return
        # compute() sums the statistics over the ranks first; FID needs at least 2 images a side
        n = int(sum_over_ranks(fid.real_features_num_samples.clone().float()))
        if n < 2:
            log.warning("rFID needs at least 2 images; the %s set has %d: not computed", stage, n)
        else:
            self.log(f"{stage}/rfid", fid.compute().float(), sync_dist=False)
        fid.reset()

    # ------------------------------------------------------------------ LPIPS
    def lpips(self, x: Tensor, y: Tensor) -> Tensor:
        if self._lpips is None:
            object.__setattr__(self, "_lpips", load_lpips(self.hparams.lpips_vgg16))  # not a submodule
        self._lpips.to(x.device)
        return self._lpips(x, y).mean()

    def _lpips_available(self) -> bool:
        if self._lpips is not None:
            return True
        from visiontf.tasks.generation.vqgan_loss import vgg16_path

        return vgg16_path(self.hparams.lpips_vgg16).is_file()

    # ------------------------------------------------------------------ training
    def disc_active(self) -> bool:
        return int(self.batches_done) >= self.hparams.disc_start and self.hparams.disc_factor > 0

    def training_step(self, batch, batch_idx: int) -> None:
        hp = self.hparams
        x = batch[0] if isinstance(batch, (tuple, list)) else batch
        opt_g, opt_d = self.optimizers()
        last_micro = (int(self.batches_done) + 1) % hp.accumulate == 0
        disc_on = self.disc_active()

        self.toggle_optimizer(opt_g)
        quant, qloss, (_, _, indices) = self.model.encode(x)
        x_rec = self.model.decode(quant)
        rec = (x - x_rec).abs().mean() if hp.rec_loss == "l1" else ((x - x_rec) ** 2).mean()
        p_loss = self.lpips(x, x_rec) if hp.perceptual_weight > 0 else rec.new_zeros(())
        nll = rec + hp.perceptual_weight * p_loss
        loss = nll + hp.codebook_weight * qloss
        terms = {"rec_loss": rec, "p_loss": p_loss, "quant_loss": qloss}
        if disc_on:
            g_loss = -self.discriminator(x_rec).mean()
            d_weight = adaptive_weight(nll, g_loss, self.model.last_layer(), hp.disc_weight)
            loss = loss + d_weight * hp.disc_factor * g_loss
            terms.update(g_loss=g_loss, d_weight=d_weight)
        ok = self.check_finite(loss, terms)
        if ok:
            self.manual_backward(loss / hp.accumulate)
            if last_micro:
                self._step(opt_g, self.model.parameters())
                if hp.get("warmup_steps"):
                    self.lr_schedulers().step()
        self.untoggle_optimizer(opt_g)

        if disc_on and ok:
            self.toggle_optimizer(opt_d)
            logits_real = self.discriminator(x.detach())
            logits_fake = self.discriminator(x_rec.detach())
            d_loss = hp.disc_factor * hinge_d_loss(logits_real, logits_fake)
            if self.check_finite(d_loss, {"disc_loss": d_loss}):
                self.manual_backward(d_loss / hp.accumulate)
                if last_micro:
                    self._step(opt_d, self.discriminator.parameters())
            self.untoggle_optimizer(opt_d)
            terms.update(disc_loss=d_loss, logits_real=logits_real.mean(), logits_fake=logits_fake.mean())
        self.batches_done += 1
        usage = code_usage(indices, self.model.num_codes)
        self.log("train/loss", loss.detach(), prog_bar=True)
        self.log("train/psnr", psnr(x, x_rec.detach()).mean(), prog_bar=True)
        self.log("train/disc_factor", float(disc_on) * hp.disc_factor)
        for k, v in {**terms, **usage}.items():
            self.log(f"train/{k}", v.detach() if torch.is_tensor(v) else v, prog_bar=k == "used")

    def _step(self, opt, params) -> None:
        if is_distributed():  # idempotent where DDP averaged already; needed for the second backward of a batch
            for p in params:
                if p.grad is not None:
                    torch.distributed.all_reduce(p.grad, op=torch.distributed.ReduceOp.AVG)
        if self.hparams.gradient_clip_val:
            self.clip_gradients(opt, gradient_clip_val=self.hparams.gradient_clip_val, gradient_clip_algorithm="norm")
        opt.step()
        opt.zero_grad(set_to_none=True)

    # ------------------------------------------------------------------ evaluation
    def _eval_step(self, batch, stage: str) -> None:
        from torchmetrics.functional.image import structural_similarity_index_measure as ssim

        x = batch[0] if isinstance(batch, (tuple, list)) else batch
        quant, _, (_, _, indices) = self.model.encode(x)
        x_rec = self.model.decode(quant).clamp(-1, 1)
        counts = torch.bincount(indices.reshape(-1), minlength=self.model.num_codes)
        self._val_counts = counts if self._val_counts is None else self._val_counts + counts
        n = x.shape[0]  # every value is a mean over the batch's (same-size) images
        self.log_eval_mean(f"{stage}/rec_loss", (x - x_rec).abs().mean(), n)
        self.log_eval_mean(f"{stage}/psnr", psnr(x, x_rec).mean(), n, prog_bar=True)
        self.log_eval_mean(f"{stage}/ssim", ssim(x_rec.float(), x.float(), data_range=2.0), n)
        if self._lpips_available():
            self.log_eval_mean(f"{stage}/lpips", self.lpips(x.float(), x_rec.float()), n)
        if self._fid is not None:
            self._update_fid(x, x_rec)

    def _eval_end(self, stage: str) -> None:
        if self._fid is not None:
            self._log_fid(stage)
        if self._val_counts is None:
            return
        counts, self._val_counts = sum_over_ranks(self._val_counts.float()), None
        p = counts / counts.sum().clamp_min(1)
        self.log(f"{stage}/perplexity", torch.exp(-(p * torch.log(p + 1e-10)).sum()))
        self.log(f"{stage}/codes_used", (counts > 0).float().mean(), prog_bar=True)

    def predict_step(self, batch, batch_idx):
        x = batch[0] if isinstance(batch, (tuple, list)) else batch
        return self.model(x).clamp(-1, 1)

    # ------------------------------------------------------------------ optimisation
    def learning_rate(self) -> float:
        hp = self.hparams
        if not hp.scale_lr:
            return hp.base_lr
        dm = trainer_datamodule(self._trainer)
        batch = dm.batch_size if dm is not None else 1
        devices = self.trainer.world_size if self._trainer is not None else 1
        return hp.accumulate * devices * batch * hp.base_lr

    def configure_optimizers(self):
        lr = self.learning_rate()
        log.info("learning rate %.3g (base_lr %.3g, scale_lr=%s)", lr, self.hparams.base_lr, self.hparams.scale_lr)
        params = [p for p in self.model.parameters() if p.requires_grad]
        opt_g = torch.optim.Adam(params, lr=lr, betas=(0.5, 0.9))
        opt_d = torch.optim.Adam(self.discriminator.parameters(), lr=lr, betas=(0.5, 0.9))
        warmup = self.hparams.get("warmup_steps") or 0
        if not warmup:
            return [opt_g, opt_d]
        # stepped after each autoencoder step (manual optimisation); saved in checkpoints by Lightning
        ramp = torch.optim.lr_scheduler.LambdaLR(opt_g, lambda k: min(1.0, (k + 1) / warmup))
        return [opt_g, opt_d], [ramp]
