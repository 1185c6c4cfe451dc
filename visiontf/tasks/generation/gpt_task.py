"""VQGAN's second stage as a LightningModule: a GPT over a trained tokenizer's codes (taming's
``Net2NetTransformer`` training step).

The first stage comes from a :class:`~visiontf.tasks.generation.tokenizer_task.TokenizerTask` checkpoint
(``first_stage_ckpt``), or a taming/visiontf file through ``model_kwargs.first_stage`` and
``pretrained``; a transformer without a trained first stage is refused (its codes would be noise).
Optimiser: minGPT's groups (weight decay only on Linear weights), AdamW betas (0.9, 0.95), lr
``base_lr x batch x devices`` with ``scale_lr`` (taming: 4.5e-6 base). Logged: cross-entropy,
``bits_per_token`` (nats / ln 2) and, on validation, ``unigram_bits``: the entropy of the held-out
codes' own histogram, the best any model ignoring context can do on them (a lower bound for a
unigram model fitted elsewhere). ``--trainer.strategy fsdp`` trains it sharded, on GPUs or CPU processes
(:mod:`visiontf.tasks.fsdp`: the frozen first stage is kept whole on each rank, outside the shards, and
gradient clipping uses FSDP's global norm).

Class-conditional (taming's ``cond_stage_key: class_label``): labelled data
(``TokenizerDataModule(labels=True)``: class = the image's folder) gives ``num_classes``, which makes the
transformer's ``n_classes`` unless ``model_kwargs`` sets it; batches are then ``(images, labels)`` and the
label is the first token instead of the SOS token.
"""
from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor

from visiontf.core.config_checks import check_config, non_negative, positive
from visiontf.core.distributed import sum_over_ranks
from visiontf.core.errors import UserError
from visiontf.data.base import trainer_datamodule
from visiontf.io.weights import restoring_weights
from visiontf.models import create_model, get_entry
from visiontf.models.contract import Generator, Tokenizer
from visiontf.tasks.base_task import BaseTask
from visiontf.tasks.fsdp import clip_sharded_grad_norm

log = logging.getLogger(__name__)


class MissingFirstStageError(UserError, ValueError):
    """A second stage asked to train without a trained first stage."""


def _first_stage(path: str) -> Tokenizer:
    """The tokenizer of a TokenizerTask checkpoint, refusing (naming the file and the fix) a missing file and a
    checkpoint of anything else: its weights would build no first stage, or a wrong one."""
    from visiontf.tasks.checkpoints import load_checkpoint_model

    if not Path(path).expanduser().is_file():
        raise _missing_first_stage(path)
    model, info = load_checkpoint_model(path)
    if not isinstance(model, Tokenizer):
        kind = "a second stage (transformer)" if isinstance(model, Generator) else type(model).__name__
        name = info["hyper_parameters"].get("model_name")
        raise MissingFirstStageError(f"model.init_args.first_stage_ckpt={path}: a checkpoint of {name}, {kind}, not a "
                                     f"tokenizer (first stage); {_TRAIN_FIRST}")
    return model


def _check_first_stage_fits(first: Tokenizer, built: Tokenizer, path: str, model_kwargs: dict) -> None:
    """Refuse a config whose ``model_kwargs.first_stage_kwargs`` build another first stage than the tokenizer of
    ``first_stage_ckpt`` (another codebook): its weights would not load, and its codes would mean nothing."""
    own, theirs = built.state_dict(), first.state_dict()
    differ = [f"{k} {tuple(theirs[k].shape)} (built: {tuple(own[k].shape)})" for k in theirs
              if k in own and own[k].shape != theirs[k].shape]
    if not differ and own.keys() == theirs.keys():
        return
    given = {k: v for k, v in (model_kwargs.get("first_stage_kwargs") or {}).items() if first.model_kwargs.get(k) != v}
    settings = ", ".join(f"{k}: {v} (the tokenizer's: {first.model_kwargs.get(k)})" for k, v in given.items())
    raise MissingFirstStageError(
        f"model.init_args.first_stage_ckpt={path}: its tokenizer ({first.num_codes} codes) does not fit the first stage "
        f"that model_kwargs.first_stage_kwargs build ({settings or 'other settings'}; e.g. {(differ or ['other tensors'])[0]}); "
        "drop those first_stage_kwargs (the tokenizer's own settings are used), or give the tokenizer trained with them")


_TRAIN_FIRST = ("train the first stage first (tools/train.py fit --config configs/vqgan/vqgan_tiny.yaml) and give its "
                "checkpoint (<run>/checkpoints/last.ckpt)")


def _missing_first_stage(path: str) -> MissingFirstStageError:
    found = "the folder does not exist" if not Path(path).expanduser().parent.is_dir() else "no such file"
    return MissingFirstStageError(f"model.init_args.first_stage_ckpt={path}: no tokenizer checkpoint there ({found}); "
                                  f"{_TRAIN_FIRST}")


def _conditioned(model_name: str, num_classes: int | None, model_kwargs: Mapping[str, Any] | None) -> dict | None:
    """``model_kwargs`` with the data's class count as the transformer's ``n_classes``; UserError where they differ."""
    if num_classes is None:
        return None if model_kwargs is None else dict(model_kwargs)
    kwargs = dict(model_kwargs or {})
    asked = kwargs.setdefault("n_classes", num_classes)
    if asked != num_classes:
        raise UserError(f"{model_name}: model_kwargs.n_classes {asked} but the data has {num_classes} classes; "
                        "drop model_kwargs.n_classes (the data's count is used) or fix the data's class folders")
    return kwargs


class TransformerTask(BaseTask):
    """Next-code prediction over a frozen tokenizer: unconditional (taming's SOS token first) or, with
    ``num_classes`` (linked from labelled data) or ``model_kwargs.n_classes``, class-conditional."""

    task = "generation"
    model_kind = Generator
    model_kind_hint = "use a second stage such as vqgan_transformer_tiny"

    def __init__(self, model_name: str = "vqgan_transformer_tiny", num_classes: int | None = None,
                 model_kwargs: dict[str, Any] | None = None, pretrained: str | None = None,
                 first_stage_ckpt: str | None = None, base_lr: float = 4.5e-6, scale_lr: bool = True,
                 weight_decay: float = 0.01, compile: bool = False,
                 on_nonfinite: Literal["raise", "skip"] = "raise") -> None:
        init_args = {k: v for k, v in locals().items() if k not in ("self", "__class__")}
        check_config(type(self).__name__, "model", base_lr=(base_lr, positive), weight_decay=(weight_decay, non_negative))
        L.LightningModule.__init__(self)
        self.init_eval_state()
        self.save_hyperparameters()  # under LightningCLI: the hyper-parameters it gives (with _class_path)
        if not self.hparams:  # built directly: frame inspection needs super().__init__, so state them
            self.save_hyperparameters(init_args)
        self._model_name, self._num_classes = model_name, None
        model_kwargs = self._conditioning(model_name, num_classes, model_kwargs)
        first, self._first_stage_missing = None, None
        saved_first_stage = bool(first_stage_ckpt) and "first_stage_kwargs" in (model_kwargs or {})
        # this task's own checkpoint being restored (its hyper-parameters hold the tokenizer's architecture, its weights
        # the first stage's): the file its arguments name is not read (a checkpoint is data, it does not open files of
        # its choosing)
        from_checkpoint = saved_first_stage and restoring_weights()
        if from_checkpoint:
            pass
        elif saved_first_stage and not Path(first_stage_ckpt).expanduser().is_file():
            # the same checkpoint's arguments resumed or evaluated after the tokenizer's file moved: the first stage's
            # weights are in that checkpoint. A run that restores none is refused when it starts (_require_first_stage)
            self._first_stage_missing = first_stage_ckpt
        elif first_stage_ckpt:
            first = _first_stage(first_stage_ckpt)
            # the tokenizer's own architecture options (its quantizer's l2_norm, code restarts) build the
            # first stage, and are saved with this task so that its checkpoints rebuild the same model
            kwargs = dict(model_kwargs or {})
            kwargs["first_stage_kwargs"] = {**first.model_kwargs, **kwargs.get("first_stage_kwargs", {})}
            model_kwargs = self.hparams["model_kwargs"] = kwargs
        self.model = create_model(model_name, pretrained=pretrained, **(model_kwargs or {}))
        self.check_model_kind(model_name)
        if first is not None:
            _check_first_stage_fits(first, self.model.first_stage_model, first_stage_ckpt, model_kwargs)
            self.model.first_stage_model.load_state_dict(first.state_dict())
        elif not pretrained and self._first_stage_missing is None and not from_checkpoint:
            raise MissingFirstStageError(
                f"{model_name}: no trained first stage; give the tokenizer's checkpoint with "
                "model.init_args.first_stage_ckpt=outputs/vqgan_tiny/checkpoints/last.ckpt (or pretrained= a "
                "Net2NetTransformer checkpoint holding first_stage_model.*)")
        self.compile_model, self.on_nonfinite, self.nonfinite_steps = compile, on_nonfinite, 0
        self._val_counts: Tensor | None = None

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        super().on_load_checkpoint(checkpoint)
        self._first_stage_missing = None  # the checkpoint's first_stage_model.* are the trained first stage

    def _require_first_stage(self) -> None:
        if self._first_stage_missing is not None:
            raise _missing_first_stage(self._first_stage_missing)

    def on_fit_start(self) -> None:
        self._require_first_stage()
        super().on_fit_start()

    def on_validation_start(self) -> None:
        self._require_first_stage()

    on_test_start = on_predict_start = on_validation_start

    @classmethod
    def check_model_arguments(cls, init_args: Mapping[str, Any]) -> None:
        """As the task builds it: the data's class count as the model's ``n_classes`` (:func:`_conditioned`, as :meth:`_conditioning`), no
        ``num_classes``. With a ``first_stage_ckpt`` the model takes the tokenizer's architecture from that file,
        so only its name is checked here (the file is read when the task is built)."""
        if init_args.get("first_stage_ckpt"):
            if isinstance(init_args.get("model_name"), str):
                get_entry(init_args["model_name"])
            return
        kwargs = init_args.get("model_kwargs")
        if isinstance(init_args.get("model_name"), str) and isinstance(kwargs, Mapping | None):
            kwargs = _conditioned(init_args["model_name"], init_args.get("num_classes"), kwargs)
        super().check_model_arguments({**init_args, "num_classes": None, "model_kwargs": kwargs})

    def _conditioning(self, model_name: str, num_classes: int | None, model_kwargs: dict | None) -> dict | None:
        """The data's class count becomes the transformer's ``n_classes`` (saved with the task's hyper-parameters)."""
        if num_classes is None:
            return model_kwargs
        kwargs = _conditioned(model_name, num_classes, model_kwargs)
        self.hparams["model_kwargs"] = kwargs
        # the count lives in the model's own argument (taming's n_classes): a checkpoint rebuilds the model
        # from model_kwargs, and GPT-style second stages take no num_classes
        self.hparams["num_classes"] = None
        return kwargs

    def _inputs(self, batch) -> tuple[Tensor, Tensor | None]:
        """(images, labels or None), checked against the model's conditioning."""
        x, *rest = batch if isinstance(batch, (tuple, list)) else (batch,)
        labels = rest[0] if rest else None
        conditional = self.model.n_classes is not None
        if conditional and labels is None:
            raise UserError(f"{self._model_name} is class-conditional (n_classes={self.model.n_classes}) but the batches "
                            "hold no labels: set data.init_args.labels true (class = the image's folder)")
        if not conditional and labels is not None:
            raise UserError(f"the batches hold class labels but {self._model_name} is unconditional: drop "
                            "data.init_args.labels, or train class-conditional (the data's class count is linked "
                            "into model.init_args.num_classes by tools/train.py)")
        return x, labels

    def training_step(self, batch, batch_idx: int):
        x, labels = self._inputs(batch)
        logits, target = self.model(x, labels=labels)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), target.reshape(-1))
        if not self.check_finite(loss, {"ce": loss}):
            return None
        self.log("train/loss", loss, prog_bar=True)
        self.log("train/bits_per_token", loss.detach() / math.log(2))
        return loss

    def _eval_step(self, batch, stage: str) -> None:
        x, labels = self._inputs(batch)
        logits, target = self.model(x, labels=labels)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), target.reshape(-1))
        self.log_eval_mean(f"{stage}/bits_per_token", loss / math.log(2), target.numel(), prog_bar=True)
        counts = torch.bincount(target.reshape(-1), minlength=self.model.transformer.vocab_size)
        self._val_counts = counts if self._val_counts is None else self._val_counts + counts

    def _eval_end(self, stage: str) -> None:
        if self._val_counts is None:
            return
        counts, self._val_counts = sum_over_ranks(self._val_counts.float()), None
        p = counts / counts.sum().clamp_min(1)
        self.log(f"{stage}/unigram_bits", -(p * torch.log2(p + 1e-12)).sum())

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None) -> None:
        # under FSDP the gradients are sharded: Lightning's precision plugin refuses norm clipping there
        if not clip_sharded_grad_norm(self, gradient_clip_val, gradient_clip_algorithm):
            super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)

    def configure_optimizers(self):
        hp = self.hparams
        lr = hp.base_lr
        if hp.scale_lr and self._trainer is not None:
            dm = trainer_datamodule(self.trainer)
            lr = hp.base_lr * (dm.batch_size if dm is not None else 1) * self.trainer.world_size
        no_decay = self.model.no_weight_decay()
        params = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
        groups = [{"params": [p for n, p in params if n not in no_decay], "weight_decay": hp.weight_decay},
                  {"params": [p for n, p in params if n in no_decay], "weight_decay": 0.0}]
        log.info("learning rate %.3g; %d decayed / %d undecayed tensors", lr, len(groups[0]["params"]),
                 len(groups[1]["params"]))
        return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95))
