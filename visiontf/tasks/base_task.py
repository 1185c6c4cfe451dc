"""What every visiontf task shares: model construction, torch.compile, the non-finite loss guard, and
evaluation means over the whole set that do not depend on the process count."""
from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.plugins.precision import MixedPrecision, Precision
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import GradClipAlgorithmType
from torch import Tensor, nn

from visiontf.core.config_checks import ConfigError, check_config, one_of, optional, positive_int
from visiontf.core.distributed import get_world_size, is_distributed, sum_over_ranks
from visiontf.core.errors import UserError
from visiontf.data.base import trainer_datamodule
from visiontf.io.training_state import check_restored_state
from visiontf.models import ModelArgumentError, ModelNameError, check_model_arguments, create_model
from visiontf.models.contract import VisionModel
from visiontf.tasks.checkpoints import check_checkpoint_fits, checkpoint_being_loaded, load_task_checkpoint
from visiontf.tasks.task_inference import adapter_for_task

log = logging.getLogger(__name__)


class NonFiniteLossError(FloatingPointError):
    """Training produced a NaN/Inf loss and ``on_nonfinite="raise"``."""


class BaseTask(L.LightningModule):
    """Builds ``self.model`` from the registry and guards training against non-finite losses.

    ``on_nonfinite``: ``"raise"`` stops with a message naming the step and every loss term;
    ``"skip"`` skips that optimizer step (on every rank at once under DDP, so ranks stay in step)
    and counts it in the ``train/nonfinite_steps`` metric.

    ``num_classes`` None: a task without classes (restoration); the model is built without the argument.

    Checkpoints also carry ``preprocess``: the task's complete eval settings (its adapter's
    ``settings_type``) from the model's ``pretrained_cfg``, the data module's ``eval_transform()`` and the
    task's own :meth:`inference_settings`, so that :class:`~visiontf.inference.Predictor` needs neither the
    data nor guesses.
    """

    #: the task's name, for its adapter (:mod:`visiontf.tasks.task_inference`)
    task: str = ""
    #: the kind of model it trains (:mod:`visiontf.models.contract`); a registered model of another kind is refused
    model_kind: type[VisionModel] = VisionModel
    #: how validation and test compute: ``"float32"`` without autocast, so that under mixed precision
    #: (``bf16-mixed``, ``16-mixed``: float32 weights) every stat is what float32 gives, whatever the batch size
    #: or process count (bf16's rounding moves with the padding of a batch); ``"trainer"``: in the trainer's
    #: precision (faster on a GPU, stats then depend on the batch). ``tools/train.py --eval_precision`` sets it.
    eval_precision: Literal["float32", "trainer"] = "float32"
    #: what a refusal of a model of another kind suggests instead
    model_kind_hint: str = ""

    def __init__(
        self,
        model_name: str,
        num_classes: int | None,
        model_kwargs: dict[str, Any] | None = None,
        pretrained: str | None = None,
        compile: bool = False,
        on_nonfinite: Literal["raise", "skip"] = "raise",
    ) -> None:
        super().__init__()
        check_config(type(self).__name__, "model", num_classes=(num_classes, optional(positive_int)),
                     on_nonfinite=(on_nonfinite, one_of("raise", "skip")))
        self._model_name, self._num_classes = model_name, num_classes
        self.model: nn.Module = create_model(model_name, pretrained=pretrained, num_classes=num_classes, **(model_kwargs or {}))
        self.check_model_kind(model_name)
        self.compile_model = compile
        self.on_nonfinite = on_nonfinite
        self.nonfinite_steps = 0
        self.init_eval_state()

    def check_model_kind(self, model_name: str, hint: str = "") -> None:
        """Refuse a model of another kind than :attr:`model_kind` (a detector given to the segmentation task)."""
        if not isinstance(self.model, self.model_kind):
            raise ValueError(self._kind_mismatch(self.model, model_name, hint or self.model_kind_hint))

    @classmethod
    def _kind_mismatch(cls, model: nn.Module, model_name: str, hint: str) -> str:
        return (f"model_name={model_name!r} is a {type(model).__name__}, not a {cls.model_kind.__name__}: "
                f"{cls.__name__} trains {cls.model_kind.__name__} models{'; ' + hint if hint else ''} "
                "(visiontf.list_models() lists every name)")

    @classmethod
    def check_model_arguments(cls, init_args: Mapping[str, Any]) -> None:
        """A config's ``model.init_args`` for this task, checked as the constructor checks its model, without
        building it: the registered name, the model's keywords (:func:`visiontf.models.check_model_arguments`: on
        PyTorch's meta device, no weights read) and the model's kind.

        ``tools/train.py`` calls it when it parses a config, so that ``--print_config`` refuses what the run would
        (a misspelt or mistyped ``model_kwargs`` entry, a detector given to the segmentation task) before anything
        is built or read. Raises the constructor's own errors (:class:`~visiontf.models.ModelArgumentError`, ...).
        """
        name = init_args.get("model_name")
        kwargs = init_args.get("model_kwargs") or {}
        if not isinstance(name, str) or not isinstance(kwargs, Mapping):
            return  # jsonargparse's own check of the declared types reports these
        try:
            model = check_model_arguments(name, num_classes=init_args.get("num_classes"), **kwargs)
        except (ModelArgumentError, ModelNameError):
            raise  # they name the model and where its arguments come from
        except (UserError, TypeError, ValueError) as e:  # a section's own check ("hidden_dim must be an int"): said where
            raise ConfigError(f"{cls.__name__}: model.init_args.model_kwargs of {name}: {e}") from e
        if not isinstance(model, cls.model_kind):
            raise ConfigError(f"{cls.__name__}: model.init_args.{cls._kind_mismatch(model, name, cls.model_kind_hint)}")

    def set_postprocess(self, **overrides: Any) -> None:
        """Replace the model's post-processing options for evaluation and prediction (the task's adapter says
        which it has; :func:`visiontf.set_prediction.set_postprocess` for detectors); ValueError for a task without."""
        adapter_for_task(self.task).set_postprocess(self.model, overrides)

    def init_eval_state(self) -> None:
        """The state of :meth:`log_eval_mean`; tasks that build their LightningModule without this
        constructor (no class count: tokenizer, transformer) call it themselves."""
        self._eval_means: dict[str, list[float]] = {}  # name -> [sum of value x weight, sum of weight]
        self._eval_prog_bar: set[str] = set()

    def configure_model(self) -> None:
        if self.compile_model and not getattr(self, "_compiled", False):
            # nn.Module.compile keeps state-dict keys unchanged (no "_orig_mod." prefix)
            self.model.compile()
            self._compiled = True

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        # what a Predictor needs to name its outputs and preprocess as validation did, without the data
        dm = trainer_datamodule(self._trainer)
        if dm is not None and dm.class_names is not None:
            checkpoint["class_names"] = list(dm.class_names)
        if dm is not None and dm.label_to_cat_id is not None:
            checkpoint["label_to_cat_id"] = dict(dm.label_to_cat_id)
        transform = dm.eval_transform() if dm is not None else {}
        settings = adapter_for_task(self.task).eval_settings(self.model, transform, self.inference_settings(),
                                                              where=f"{type(self).__name__}'s eval settings")
        checkpoint["preprocess"] = settings.to_dict()
        checkpoint["task"] = self.task

    @classmethod
    def load_from_checkpoint(cls, checkpoint_path: Any, map_location: Any = None, hparams_file: Any = None,
                             strict: bool | None = None, weights_only: bool | None = None, **kwargs: Any) -> Any:
        """Lightning's ``load_from_checkpoint``, with the file's hyper-parameters read as data.

        Lightning hands them to the ``_instantiator`` the file names, which runs jsonargparse: it parses strings
        as YAML and imports what a ``class_path`` names. Here they are checked against this class's typed
        signature and the task is built by a plain call
        (:func:`~visiontf.tasks.checkpoints.load_task_checkpoint`). The file is always read with
        ``weights_only=True`` (plain data and tensors), whatever ``weights_only`` says."""
        return load_task_checkpoint(cls, checkpoint_path, map_location=map_location, hparams_file=hparams_file,
                                    strict=strict, **kwargs)

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        # before Lightning copies any weight: another task, model or class count is refused by name
        if self._trainer is not None:
            path, data, through = self._trainer.ckpt_path, "this run's data", "--ckpt_path"
        else:
            path, data, through = checkpoint_being_loaded(), "the arguments given", "load_from_checkpoint"
        dm = trainer_datamodule(self._trainer)
        check_checkpoint_fits(checkpoint, path, task=self.task, model_name=self._model_name, num_classes=self._num_classes,
                              class_names=dm.class_names if dm is not None else None,
                              label_to_cat_id=dm.label_to_cat_id if dm is not None else None, data=data, through=through)
        # its optimizer, scheduler and loop states are checked against the run's own once those exist (on_fit_start),
        # before Lightning restores them; strategies that restore after their setup already have them here
        self._resumed_checkpoint = checkpoint
        if self._trainer is not None and self._trainer.optimizers:
            self._check_resumed_state()

    def on_fit_start(self) -> None:
        self._check_resumed_state()

    def _check_resumed_state(self) -> None:
        """Refuse a resumed file whose training state is not the kind of state this run's optimizers, schedulers,
        loops and precision hold (:func:`visiontf.io.training_state.check_restored_state`)."""
        checkpoint, self._resumed_checkpoint = getattr(self, "_resumed_checkpoint", None), None
        trainer = self._trainer
        if checkpoint is None or trainer is None or trainer.state.fn != TrainerFn.FITTING:
            return
        plugin = trainer.precision_plugin
        check_restored_state(checkpoint, trainer.ckpt_path or "the checkpoint resumed from", trainer.optimizers,
                             [config.scheduler for config in trainer.lr_scheduler_configs],
                             {"fit_loop": trainer.fit_loop.state_dict()}, (type(plugin).__qualname__, plugin.state_dict()),
                             # FSDP and the like restore after their setup, from their own layout of the states
                             own_layout=not trainer.strategy.restore_checkpoint_after_setup)

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None) -> None:
        """Lightning's clipping, also for the fused AdamW under mixed precision.

        Lightning's ``MixedPrecision`` refuses to clip for any optimizer that unscales in its own step
        (torch's fused AdamW), yet bf16 has no gradient scaler, so nothing is scaled, and fp16's
        ``GradScaler.unscale_`` takes fused optimizers (their step then skips its own unscaling).
        """
        plugin = self.trainer.precision_plugin
        if not (gradient_clip_val and isinstance(plugin, MixedPrecision)
                and getattr(optimizer, "_step_supports_amp_scaling", False)):
            self.clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm)
            return
        if plugin.scaler is not None:
            plugin.scaler.unscale_(optimizer)
        algorithm = GradClipAlgorithmType(gradient_clip_algorithm or self.trainer.gradient_clip_algorithm or "norm")
        Precision.clip_gradients(plugin, optimizer, gradient_clip_val, algorithm)

    def inference_settings(self) -> dict[str, Any]:
        """How this task runs the model at evaluation, as keys of its eval settings (segmentation's sliding
        windows, restoration's tasks), saved with checkpoints over the data module's eval transform."""
        return {}

    def forward(self, *args, **kwargs):
        """The network's forward (see the model's docstring for its inputs and outputs)."""
        return self.model(*args, **kwargs)

    def check_finite(self, loss: Tensor, terms: dict[str, Tensor]) -> bool:
        """True when the step may proceed; handles the configured policy otherwise."""
        finite = torch.isfinite(loss.detach()).to(torch.float32)
        if is_distributed():
            torch.distributed.all_reduce(finite, op=torch.distributed.ReduceOp.MIN)
        if finite.item() == 1.0:
            return True
        detail = ", ".join(f"{k}={float(v):.4g}" for k, v in terms.items() if torch.is_tensor(v) and v.numel() == 1)
        msg = f"non-finite loss at global step {self.global_step} (epoch {self.current_epoch}): loss={float(loss):.4g}; {detail}"
        if self.on_nonfinite == "raise":
            raise NonFiniteLossError(msg + ". Lower the learning rate, check the inputs, or set on_nonfinite: skip.")
        self.nonfinite_steps += 1
        log.warning("%s; skipping this step (%d skipped so far)", msg, self.nonfinite_steps)
        self.log("train/nonfinite_steps", float(self.nonfinite_steps), sync_dist=False)
        return False

    # validation and test share one path per task: ``_eval_step(batch, stage)`` and ``_eval_end(stage)``
    def _eval_step(self, batch, stage: str) -> None:
        raise NotImplementedError

    def _eval_end(self, stage: str) -> None:
        raise NotImplementedError

    def _eval_compute(self) -> contextlib.AbstractContextManager:
        """The context validation and test run in (:attr:`eval_precision`)."""
        device = self.device.type
        if self.eval_precision == "float32" and torch.is_autocast_enabled(device):
            return torch.autocast(device, enabled=False)
        return contextlib.nullcontext()

    def validation_step(self, batch, batch_idx):
        with self._eval_compute():
            self._eval_step(batch, "val")

    def on_validation_epoch_end(self):
        self._eval_end("val")
        self._log_eval_means("val")

    def test_step(self, batch, batch_idx):
        with self._eval_compute():
            self._eval_step(batch, "test")

    def on_test_epoch_end(self):
        self._eval_end("test")
        self._log_eval_means("test")

    def log_eval_mean(self, name: str, value: Tensor | float, weight: float | int, prog_bar: bool = False) -> None:
        """Add ``value``, a mean over ``weight`` items (images, pixels, tokens), to the mean of ``name``
        over the whole evaluation set, logged as ``name`` when the epoch ends.

        Why not ``self.log(name, value, sync_dist=True, batch_size=n)``: under DDP the unrepeated eval
        sampler gives ranks unequal image and batch counts (7 images: 4 and 3), and Lightning's epoch
        mean of a ``sync_dist`` value weights them wrongly (inflated x7/6 there; Lightning issue #21859,
        PR #21839). Each rank sums value x weight and weight, the sums are added over the ranks at the
        end, so the logged mean equals the 1-process one. NaN is kept, not dropped. (Plain float sums,
        not a torchmetrics ``MeanMetric``: its states, made or reset under the evaluation loop's
        inference mode, refuse updates outside it.)
        """
        if prog_bar:
            self._eval_prog_bar.add(name)
        value = float(value.detach().float()) if torch.is_tensor(value) else float(value)
        sums = self._eval_means.setdefault(name, [0.0, 0.0])
        sums[0] += value * float(weight)
        sums[1] += float(weight)

    def _log_eval_means(self, stage: str) -> None:
        means, prog_bar = self._eval_means, self._eval_prog_bar
        names = {n for n in means if n.startswith(f"{stage}/")}
        if get_world_size() > 1:  # every rank reduces every name, or the first sum waits forever
            gathered: list = [None] * get_world_size()
            torch.distributed.all_gather_object(gathered, sorted(names))
            names = set().union(*gathered)
        names = sorted(names)
        if not names:
            return
        sums = torch.tensor([means.get(n, [0.0, 0.0]) for n in names], dtype=torch.float64, device=self.device)
        sums = sum_over_ranks(sums).cpu()
        for name, (total, weight) in zip(names, sums.tolist()):
            if not weight:  # nothing to average (class_error of a set without boxes): no value, not a NaN in stats.json
                means.pop(name, None)
                continue
            mean = total / weight
            self.log(name, torch.tensor(mean, dtype=torch.float32), prog_bar=name in prog_bar, sync_dist=False)
            means.pop(name, None)

    def total_steps(self) -> int:
        return int(self.trainer.estimated_stepping_batches) if self._trainer is not None else 1

    def steps_per_epoch(self) -> int:
        epochs = max(1, self.trainer.max_epochs or 1) if self._trainer is not None else 1
        return max(1, self.total_steps() // epochs)
