"""One LightningCLI for every task: ``tools/train.py fit|validate|test|predict --config X.yaml``.

Subclass mode: the YAML's ``model.class_path`` and ``data.class_path`` choose the task and data
module. ``data.num_classes`` is linked into ``model.init_args.num_classes`` at instantiation.

Mistakes end as one line (:func:`visiontf.cli.tool_errors.run_tool`): the parsers raise instead of
printing the usage (``exit_on_error=False``) and refuse abbreviated options (``allow_abbrev=False``:
``--trainer.max_epoch 3`` is an error, not ``max_epochs``); a ``--ckpt_path`` is checked against the
config's model before Lightning loads it (:func:`check_ckpt_path`). ``last.ckpt`` is always the latest
state (:class:`~visiontf.callbacks.LastAndBestCheckpoint`), written atomically
(:class:`~visiontf.callbacks.checkpoint_io.AtomicCheckpointIO`), and ``--ckpt_path`` is resolved by
:func:`~visiontf.tasks.checkpoints.resolve_checkpoint` (``last`` with nothing there: fit starts fresh, the
other subcommands refuse).
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import importlib
import inspect
import json
import logging
import sys
import warnings
from pathlib import Path
from typing import Literal

import lightning as L
import torch
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, _get_module_type, _InstantiatorFn
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

from visiontf.callbacks import LastAndBestCheckpoint, RNGStateCheckpoint
from visiontf.callbacks.checkpoint_io import install_atomic_checkpoint_io
from visiontf.callbacks.detection_readouts import DetectionReadouts
from visiontf.callbacks.epoch_lines import EpochLines
from visiontf.callbacks.validation_schedule import ValidationSchedule
from visiontf.cli.checks import checkpoint_file
from visiontf.cli.config_imports import denied_import_message, refuse_code_in_config, restrict_config_imports
from visiontf.cli.cpu_precision import resolve_cpu_precision
from visiontf.cli.tool_errors import run_tool
from visiontf.core.arguments import unknown_option_error, unknown_options
from visiontf.core.config_files import config_chain
from visiontf.core.errors import UsageError, UserError
from visiontf.core.progress import set_progress
from visiontf.data.base import VisionDataModule
from visiontf.io.weights import allow_listed_globals, weights_from_checkpoint
from visiontf.tasks.checkpoints import (
    CheckpointError,
    check_checkpoint_fits,
    check_checkpoint_task,
    resolve_checkpoint,
    run_checkpoint_dir,
)
from visiontf.tasks.task_table import data_module_class_paths, import_class, task_class_paths

log = logging.getLogger(__name__)

# every task and data module of the task table, imported so that configs may name them by short
# class_path (e.g. "ClassificationTask"): jsonargparse resolves a short name among the imported subclasses
for _class_path in (*task_class_paths(), *data_module_class_paths()):
    import_class(_class_path)

#: the parsers' settings: raise on errors (one line, see visiontf.cli.tool_errors), no abbreviated options
_PARSER_KWARGS = {"exit_on_error": False, "allow_abbrev": False}
_SUBCOMMANDS = ("fit", "validate", "test", "predict")


class CheckpointMismatchError(UserError, ValueError):
    """A ``--ckpt_path`` that does not fit the model the config builds."""


def check_ckpt_file(ckpt_path: str | Path | None) -> Path | None:
    """The file a ``--ckpt_path`` names, or None for Lightning's keywords (see :func:`visiontf.cli.checks.checkpoint_file`)."""
    return checkpoint_file(ckpt_path, lightning_keywords=True)


def check_ckpt_path(ckpt_path: str | Path | None, model: L.LightningModule, ckpt: dict | None = None) -> None:
    """Refuse, in one line, a ``--ckpt_path`` that is missing, not a Lightning checkpoint, or of another model.

    Lightning's own errors for these are a traceback ending in ``load_state_dict``'s list of keys.
    ``last``/``best``/``hpc`` and ``registry:`` paths are left to Lightning. ``ckpt``: the file's
    content when already loaded.
    """
    path = check_ckpt_file(ckpt_path)
    if path is None:
        return
    from visiontf.io.weights import safe_torch_load

    ckpt = safe_torch_load(path) if ckpt is None else ckpt
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt:
        raise UsageError(f"--ckpt_path {path}: not a Lightning checkpoint (no 'state_dict'); to start from these "
                         f"weights use --model.init_args.pretrained={path}")
    ours_hp = dict(getattr(model, "hparams", {}) or {})
    if getattr(model, "task", None) and "model_name" in ours_hp:
        # another task, model or number of classes: one message, shared with the tasks' own load check
        check_checkpoint_fits(ckpt, path, task=model.task, model_name=ours_hp["model_name"],
                              num_classes=ours_hp.get("num_classes"))
    own, state = model.state_dict(), ckpt["state_dict"]
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    shapes = [f"{k} {tuple(state[k].shape)} vs {tuple(own[k].shape)}" for k in own
              if k in state and hasattr(state[k], "shape") and tuple(state[k].shape) != tuple(own[k].shape)]
    if missing or unexpected or shapes:
        parts = [f"{len(v)} {what} (e.g. {v[0]})" for what, v in (("missing", missing), ("unexpected", unexpected),
                                                                   ("of another shape", shapes)) if v]
        raise CheckpointMismatchError(
            f"--ckpt_path {path}: its weights do not fit the config's {ours_hp.get('model_name', type(model).__name__)}: "
            f"{', '.join(parts)}; use the config it was trained with (config.yaml beside its logs)"
        )
    from visiontf.io.weights import check_tensor_values

    # NaN/infinite or integer weights: a resumed run failed at its first steps with a NonFiniteLossError traceback
    check_tensor_values(state, model, f"--ckpt_path {path}")


class VisionArgumentParser(LightningArgumentParser):
    """LightningCLI's parser, which also checks the model a config names whenever it validates a config.

    ``model_kwargs`` is a plain mapping to jsonargparse (each family takes its own keywords); the task class the
    config names checks it against the named model (``BaseTask.check_model_arguments``: built on the meta device,
    no weights read). A run and ``--print_config`` then refuse the same misspelt or mistyped model keyword, before
    any data is read. Only visiontf's own tasks are asked; another LightningModule is left to its constructor.
    """

    #: the (task, init_args) already checked in this process: a parse validates a config more than once
    _checked_models: set[str] = set()

    def validate(self, namespace, skip_unset: bool = True, skip_required: bool = False, branch: str | None = None,
                 **kwargs) -> None:
        super().validate(namespace, skip_unset, skip_required, branch, **kwargs)
        if branch is None:  # the whole config, not one branch of it
            self._check_model(namespace)

    def _check_model(self, cfg) -> None:
        if not hasattr(cfg, "get"):
            return
        if "trainer" in cfg:  # a run's whole config (jsonargparse validates each class's own arguments first)
            refuse_code_in_config(cfg)
        if cfg.get("ckpt_path") is not None:
            # a checkpoint's own hyper-parameters build the model in place of the config's (VisionCLI._parse_ckpt_path
            # checks them against the task's signature): the config's model_kwargs may be another model's
            return
        model = cfg.get("model")
        class_path = model.get("class_path") if hasattr(model, "get") else None
        if class_path not in task_class_paths():
            return
        init_args = model.get("init_args")
        init_args = init_args.as_dict() if hasattr(init_args, "as_dict") else dict(init_args or {})
        key = json.dumps([class_path, init_args], sort_keys=True, default=repr)
        if key not in VisionArgumentParser._checked_models:
            import_class(class_path).check_model_arguments(init_args)
            VisionArgumentParser._checked_models.add(key)


class VisionCLI(LightningCLI):
    """LightningCLI with visiontf's defaults: ``data.num_classes`` linked into the task, a
    ``last.ckpt`` in ``<root>/checkpoints``, CSV + TensorBoard logs, the RNG-state callback.

    It overrides LightningCLI's public hooks only (``__init__``, ``add_arguments_to_parser``,
    ``parse_arguments``, ``instantiate_classes``, ``instantiate_trainer``, ``before_<subcommand>``);
    what it still assumes of Lightning's internals is asserted by ``tests/cli/test_lightning_internals.py``.
    """

    def __init__(self, *args, extra_options: tuple[str, ...] = (), **kwargs) -> None:
        #: the parsers that take the run's options (each subcommand's), for the closest names to a typo
        self._option_parsers: list[LightningArgumentParser] = []
        #: options a wrapping tool takes itself (tools/eval.py's --output), named among the close ones of a typo
        self._extra_options = tuple(extra_options)
        # every torch.load of the run takes visiontf's allow-list: LightningCLI's own read of --ckpt_path's
        # hyper-parameters (right after parse_arguments) and the Trainer's restore of it
        with allow_listed_globals():
            super().__init__(*args, **kwargs)

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        self._option_parsers.append(parser)
        parser.link_arguments("data.num_classes", "model.init_args.num_classes", apply_on="instantiate")
        parser.add_lightning_class_args(LastAndBestCheckpoint, "checkpoint")
        # per-class table, PR curves, confusion matrix, TIDE of detection evaluations (a no-op for other tasks)
        parser.add_lightning_class_args(DetectionReadouts, "readouts")
        parser.set_defaults(
            {
                "checkpoint.save_last": True,
                "checkpoint.filename": "epoch{epoch:03d}-step{step:06d}",
                "checkpoint.auto_insert_metric_name": False,
                "checkpoint.save_top_k": 1,
            }
        )
        parser.add_argument(
            "--precision_without_native_bf16", type=str | None, default=None,
            help="the trainer.precision used instead of a bf16 one on a CPU without native bf16 (e.g. 32-true; "
                 "bf16 is emulated there, many times slower); null: trainer.precision as given (visiontf.cli.cpu_precision)")
        parser.add_argument(
            "--torch_num_threads", type=int | None, default=None,
            help="torch's intra-op CPU threads for this run (torch.set_num_threads); null: torch's default (all cores). "
                 "Small models on a shared CPU: 1 (threads waiting for a descheduled peer make steps many times slower)")
        parser.add_argument(
            "--eval_precision", type=Literal["float32", "trainer"], default="float32",
            help="validation and test: float32 (no autocast: under bf16-mixed / 16-mixed every stat is float32's, the same "
                 "at any batch size and process count) or trainer (the trainer's precision: faster on a GPU, the stats "
                 "then move with the batch's padding)")
        # the files a config builds on: read by the tools before the parser (with_base_configs), inert here
        parser.add_argument("--base_config", type=str | list[str] | None, default=None, help=argparse.SUPPRESS)
        parser.add_argument("--allow_random_weights", type=bool, default=False,
                            help="validate/test without --ckpt_path or model.init_args.pretrained: score untrained weights on purpose")
        # post-processing at evaluation: the checkpoint's settings unless given (its hyper-parameters win over --model.*)
        parser.add_argument("--postprocess.nms_iou_threshold", type=float | None, default=None,
                            help="detection: NMS IoU for validate/test/predict (0 or -1: no NMS; default: the checkpoint's)")
        parser.add_argument("--postprocess.nms_class_agnostic", type=bool | None, default=None,
                            help="detection: NMS over all labels (true) or within each label (false); default: the checkpoint's")
        parser.add_argument("--postprocess.num_top", type=int | None, default=None,
                            help="detection: detections kept per image before NMS; default: the checkpoint's")


    def parse_arguments(self, parser: LightningArgumentParser, args) -> None:
        known = [*self._known_options(), *self._extra_options]
        argv = sys.argv[1:] if args is None else [a for a in args if isinstance(a, str)]
        # a misspelt top-level option is named before anything else goes wrong (jsonargparse reports a missing
        # or invalid value first); nested (dotted) options are resolved by jsonargparse, below
        unknown = unknown_options(argv, known, dotted=False)
        if unknown:
            raise unknown_option_error(unknown[0], known)
        if any(a == "--base_config" or a.startswith("--base_config=") for a in argv):
            raise UsageError("--base_config: a key of config files (the files a config builds on); on the command "
                             "line give the base first: --config BASE.yaml --config VARIANT.yaml")
        for config in _config_files(argv):
            check_config_file(config)
        expanded = with_base_configs(argv)
        if expanded != argv:  # a variant's base files before it (visiontf.core.config_files)
            args = expanded if args is None or isinstance(args, list) else args
        try:
            super().parse_arguments(parser, args)
        except argparse.ArgumentError as e:
            # an unknown nested option (a typo, or an abbreviation: they are refused), with the closest known ones
            message = str(e)
            denied = denied_import_message(e)
            if denied is not None:
                raise UsageError(denied) from None
            if message.startswith("unrecognized arguments:"):
                unknown = [a for a in message.split(":", 1)[1].split() if a.startswith("--")]
                if unknown:
                    raise unknown_option_error(unknown[0], known) from e
            raise

    def _known_options(self) -> list[str]:
        """Every option string of the run's parsers (the subcommands' and their nested groups')."""
        return [o for p in self._option_parsers for o in p._option_string_actions]

    def _run_config(self, config) -> dict:
        """The subcommand's section of ``config`` (the whole of it when run without subcommands)."""
        sub = config.get("subcommand")
        return config[sub] if sub else config

    def instantiate_trainer(self, **kwargs) -> L.Trainer:
        config = self._run_config(self.config_init)
        trainer_config = {**config.get("trainer", {}), **kwargs}
        root = Path(trainer_config.get("default_root_dir") or "outputs")
        configured = trainer_config.get("callbacks") or []
        configured = list(configured) if isinstance(configured, list) else [configured]
        if trainer_config.get("enable_progress_bar") is False and not any(isinstance(cb, EpochLines) for cb in configured):
            # without a progress bar, a line per epoch shows that training is alive and how long it has left
            kwargs["callbacks"] = [*configured, EpochLines()]
        if trainer_config.get("logger") in (None, True):
            # both a CSV log (for tools/plot_logs.py) and TensorBoard, under the run's own folder
            kwargs["logger"] = [CSVLogger(root, name="csv"), TensorBoardLogger(root, name="tb")]
        elif trainer_config.get("logger") is False:
            # LearningRateMonitor refuses to run without a logger
            self.trainer_defaults["callbacks"] = [
                cb for cb in self.trainer_defaults.get("callbacks", []) if not isinstance(cb, LearningRateMonitor)
            ]
        threads = config.get("torch_num_threads")
        if threads is not None:
            if threads < 1:
                raise UsageError(f"torch_num_threads={threads}: give a thread count >= 1, or null for torch's default")
            torch.set_num_threads(threads)
            log.info("torch intra-op threads: %d (the config's torch_num_threads)", threads)
        kwargs["precision"] = resolve_cpu_precision(
            trainer_config.get("precision"), trainer_config.get("accelerator", "auto"),
            config.get("precision_without_native_bf16"))
        if trainer_config.get("strategy") == "fsdp":
            # Lightning's "fsdp" refuses the CPU and shards frozen sub-networks (a first stage) with the rest:
            # visiontf's subclass does neither, and is Lightning's otherwise (visiontf/tasks/fsdp.py)
            from visiontf.tasks.fsdp import FSDPStrategy

            kwargs["strategy"] = FSDPStrategy()
        trainer = super().instantiate_trainer(**kwargs)
        for cb in trainer.checkpoint_callbacks:
            if isinstance(cb, ModelCheckpoint) and cb.dirpath is None:
                # a fixed folder, so a new process finds last.ckpt with --ckpt_path last
                cb.dirpath = str(run_checkpoint_dir(root))
        install_atomic_checkpoint_io(trainer)
        return trainer

    def instantiate_classes(self) -> None:
        # jsonargparse wraps an error raised in a data module's or task's __init__ (ConfigError, a
        # missing dataset folder) in "Does not validate against any of the Union subtypes"; the user's
        # mistake is the cause, so it is what gets raised (named, one line for the CLI)
        sub = self.config.get("subcommand")
        config = self.config[sub] if sub else self.config
        asked = config.get("model.init_args.num_classes") if getattr(self, "_loaded_ckpt", None) is None else None
        if asked is not None and asked == _init_default(config.get("model.class_path"), "num_classes"):
            asked = None  # the task's default, not a choice
        try:
            super().instantiate_classes()
        except ValueError as e:
            cause = _user_error_in_chain(e)
            if cause is None:
                raise
            raise cause from e
        found = self.datamodule.num_classes
        if asked is not None and found is not None and int(asked) != int(found):
            # the link sets the task's class count from the data: a different one asked for would be replaced silently
            raise UsageError(
                f"--model.init_args.num_classes {asked}: the data has {found} classes ({type(self.datamodule).__name__} "
                f"reads them from its annotations) and the model takes its class count from there; drop the option, "
                f"or change the data's categories")

    def _parse_ckpt_path(self) -> None:
        """``--ckpt_path``'s hyper-parameters, read as data, in place of LightningCLI's merge.

        LightningCLI hands them to jsonargparse here (``parser.parse_object``), which parses strings of
        ``Any``-typed fields as YAML or JSON and imports what a ``class_path`` names: a checkpoint could run
        code. visiontf resolves ``last``/``best``/``hpc`` to their file first, refuses what cannot be this
        config's checkpoint, and checks the hyper-parameters against the config's task class's typed signature
        (:func:`~visiontf.tasks.checkpoints.checkpoint_arguments`). They then reach the task's constructor by a
        plain call (:class:`_ModelInstantiator`), over the config's own arguments, as LightningCLI's merge did;
        the parser never sees them.
        """
        from visiontf.io.weights import safe_torch_load
        from visiontf.tasks.checkpoints import check_checkpoint_builds_what_it_holds, check_config_model, checkpoint_arguments

        self._loaded_ckpt = None
        self._checkpoint_model_arguments: dict | None = None
        sub = self.config.get("subcommand")
        if sub and self.config[sub].get("weights_only") is False:
            raise UsageError("--weights_only false: Lightning would unpickle the checkpoint, running any code the file "
                             "holds; visiontf reads every checkpoint as data (weights only), which restores all of a "
                             "visiontf checkpoint: drop the option (or the config's weights_only key)")
        if not sub or self.config[sub].get("ckpt_path") is None:
            return
        cfg = self.config[sub]
        root = cfg.get("trainer.default_root_dir")
        # "last" with nothing there: fit starts fresh (one INFO line, the requeue case); validate/test/predict
        # refuse, never evaluating random weights
        cfg["ckpt_path"] = resolve_checkpoint(cfg["ckpt_path"], run_checkpoint_dir(root, cfg.get("checkpoint.dirpath")),
                                              for_fit=sub == "fit", root_dir=root)
        path = check_ckpt_file(cfg["ckpt_path"])
        if path is None:  # none (a fresh fit), or a registry model: Lightning restores its weights alone
            return
        ckpt = safe_torch_load(path)
        if not isinstance(ckpt, dict) or "state_dict" not in ckpt:
            raise UsageError(f"--ckpt_path {path}: not a Lightning checkpoint (no 'state_dict'); to start from these "
                             f"weights use --model.init_args.pretrained={path}")
        task_class = import_class(cfg["model.class_path"]) if cfg.get("model.class_path") else None
        data_class = import_class(cfg["data.class_path"]) if cfg.get("data.class_path") else None
        check_checkpoint_task(ckpt, path, task_class)  # another task: said as such, before its arguments are read
        saved = checkpoint_arguments(ckpt, path, task=task_class, data=data_class)
        if saved.task is not None and task_class is not None and saved.task is not task_class:
            raise CheckpointError(f"{path}: a checkpoint of {saved.task.__name__}, but the config builds "
                                  f"{task_class.__name__}; use the config the checkpoint was trained with")
        # the checkpoint's model settings win over the config's: another model would run with this config's
        # data and trainer settings, so it is refused unless asked for by name
        check_config_model(ckpt, path, cfg.get("model.init_args.model_name"), cfg.get("config"))
        check_checkpoint_builds_what_it_holds(ckpt, path, saved.task_arguments)  # before the task builds its model
        self._loaded_ckpt = (path, ckpt)
        self._checkpoint_model_arguments = saved.task_arguments

    def _add_instantiators(self) -> None:
        super()._add_instantiators()
        # the same key as LightningCLI's model instantiator, which it replaces
        self.parser.add_instantiator(_ModelInstantiator(cli=self, key="model"), _get_module_type(self._model_class),
                                     subclasses=self.subclass_mode_model)

    def _dump_config(self) -> None:
        # what the task saves as its hyper-parameters (LightningCLI's instantiator reads this dump): the checkpoint's
        # arguments over the config's, as plain data, as the task is built with them
        if hasattr(self, "config_dump"):
            return
        super()._dump_config()
        saved = getattr(self, "_checkpoint_model_arguments", None)
        if saved:
            model = self.config_dump.setdefault("model", {})
            model.setdefault("init_args", {}).update(_as_dumped(saved))

    def _before_subcommand(self) -> None:
        if hasattr(self.model, "eval_precision"):
            self.model.eval_precision = self.config_init[self.subcommand].get("eval_precision") or "float32"
        path, ckpt = getattr(self, "_loaded_ckpt", None) or (self.config_init[self.subcommand].get("ckpt_path"), None)
        check_ckpt_path(path, self.model, ckpt)
        self._refuse_random_weights(path)
        self._apply_postprocess()

    def _refuse_random_weights(self, path: object) -> None:
        """validate/test (tools/eval.py) of weights nobody trained would write full stats of noise"""
        config = self.config_init[self.subcommand]
        if self.subcommand not in ("validate", "test") or path is not None or config.get("allow_random_weights"):
            return
        if getattr(getattr(self.model, "hparams", None), "get", lambda k: None)("pretrained"):
            return  # published weights given to the model (e.g. an mmseg SETR file)
        raise UsageError(f"{self.subcommand} without --ckpt_path would score the model's random initial weights; give "
                         "--ckpt_path K.ckpt (or last), --model.init_args.pretrained FILE, or --allow_random_weights true")

    def _apply_postprocess(self) -> None:
        """``--postprocess.*`` over the post-processing the checkpoint's model was built with."""
        given = {k: v for k, v in vars(self.config_init[self.subcommand].get("postprocess") or {}).items() if v is not None}
        if not given:
            return
        options = ", ".join(f"--postprocess.{k}" for k in given)
        if self.subcommand == "fit":
            raise UsageError(f"{options}: for evaluation and prediction; to train with them set the model's own "
                             "arguments (--model.init_args.model_kwargs)")
        try:
            self.model.set_postprocess(**given)
        except ValueError as e:  # a task without post-processing, or a value out of range
            raise UsageError(f"{options}: {e}") from e

    before_fit = before_validate = before_test = before_predict = _before_subcommand


def _as_dumped(value):
    """``value`` as LightningCLI's YAML dump holds it: tuples as lists, option groups (dataclasses) as mappings."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    if isinstance(value, dict):
        return {k: _as_dumped(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_as_dumped(v) for v in value]
    return value


class _ModelInstantiator(_InstantiatorFn):
    """LightningCLI's model instantiator, with ``--ckpt_path``'s hyper-parameters (checked as data by
    :meth:`VisionCLI._parse_ckpt_path`) over the arguments jsonargparse made of the config: they reach the
    constructor as they are. The links (``data.num_classes``) still win, as under LightningCLI's merge."""

    def __call__(self, class_type, *args, applied_instantiation_links: dict, **kwargs):
        saved = getattr(self.cli, "_checkpoint_model_arguments", None)
        if not saved:
            return super().__call__(class_type, *args, applied_instantiation_links=applied_instantiation_links, **kwargs)
        links = {k.removeprefix("model.").removeprefix("init_args."): v
                 for k, v in applied_instantiation_links.items() if k.startswith("model.")}
        kwargs = {**kwargs, **copy.deepcopy(saved), **links}
        # Lightning restores every weight from --ckpt_path: the files the run started from are not read (nor needed)
        with weights_from_checkpoint():
            return super().__call__(class_type, *args, applied_instantiation_links=applied_instantiation_links, **kwargs)


def _config_files(argv: list[str]) -> list[str]:
    """The files ``--config`` / ``-c`` name in ``argv``."""
    found = []
    for i, arg in enumerate(argv):
        if arg in ("--config", "-c") and i + 1 < len(argv):
            found.append(argv[i + 1])
        elif arg.startswith("--config="):
            found.append(arg.split("=", 1)[1])
    return found


def with_base_configs(argv: list[str]) -> list[str]:
    """``argv`` with each ``--config V`` that names base files (its ``base_config:`` key) preceded by
    ``--config B`` for each of them (:func:`visiontf.core.config_files.config_chain`), so that jsonargparse
    composes base and variant in order, the variant's keys over the base's."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("--config", "-c") and i + 1 < len(argv):
            given, step = argv[i + 1], 2
        elif arg.startswith("--config="):
            given, step = arg.split("=", 1)[1], 1
        else:
            out.append(arg)
            i += 1
            continue
        if Path(given).is_file():
            for base in config_chain(given)[:-1]:
                out += ["--config", str(base)]
        out += argv[i:i + step]
        i += step
    return out


def check_config_file(path: str) -> None:
    """Refuse a ``--config`` that is not a YAML mapping, in one line (jsonargparse's reader raised a
    ``UnicodeDecodeError`` on a JPEG). A missing file is left to jsonargparse's own message."""
    import yaml

    file = Path(path)
    if not file.is_file():
        return
    try:
        loaded = yaml.safe_load(file.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise UsageError(f"--config {path}: not a text file (binary data); give the training YAML, e.g. "
                         "configs/detr/detr_tiny_shapes.yaml") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
        raise UsageError(f"--config {path}: not valid YAML{where} ({getattr(e, 'problem', None) or e}); fix the "
                         "file or give the training YAML") from None
    if loaded is not None and not isinstance(loaded, dict):
        raise UsageError(f"--config {path}: a YAML {type(loaded).__name__}, not a mapping of sections (trainer, "
                         "model, data); give the training YAML")


def _init_default(class_path: str | None, name: str) -> object:
    """The default of ``name`` in ``class_path``'s constructor (None when unknown)."""
    if not class_path:
        return None
    module, _, cls = class_path.rpartition(".")
    try:
        parameter = inspect.signature(getattr(importlib.import_module(module), cls).__init__).parameters.get(name)
    except (ImportError, AttributeError, ValueError, TypeError):
        return None
    return None if parameter is None or parameter.default is inspect.Parameter.empty else parameter.default


def _user_error_in_chain(error: BaseException) -> UserError | None:
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if isinstance(current, UserError):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def _trainer_defaults() -> dict:
    # RNG states in every checkpoint: a killed run resumed with --ckpt_path last continues exactly;
    # a run whose checkpoint monitors a val metric validates at least once
    return {"callbacks": [LearningRateMonitor(logging_interval="step"), RNGStateCheckpoint(), ValidationSchedule()]}


def make_cli(args: list[str] | None = None, run: bool = True, extra_options: tuple[str, ...] = (),
             quiet: bool = False) -> VisionCLI:
    """The CLI (subclass mode: the YAML's ``class_path``s choose task and data), run on ``args``."""
    logging.basicConfig(level=logging.WARNING if quiet else logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    restrict_config_imports()  # a config names visiontf's and Lightning's classes only (visiontf.cli.config_imports)
    # eval.py and the tests pass args on purpose (eval.py adds "validate"); Lightning warns about that
    warnings.filterwarnings("ignore", message="LightningCLI's args parameter is intended", category=UserWarning)
    # under DDP every evaluation value is a torchmetrics state synced over ranks (COCO stats from every
    # rank's detections, losses as sample-weighted means: BaseTask.log_eval_mean), so each rank logs the
    # same value; the elapsed minutes are rank 0's. A mean over ranks would add nothing
    warnings.filterwarnings("ignore", message=r"It is recommended to use `self.log\('((val|test)/|time/)",
                            category=UserWarning)
    return VisionCLI(
        L.LightningModule,
        VisionDataModule,  # the attributes visiontf reads of a data module are declared there
        subclass_mode_model=True,
        subclass_mode_data=True,
        trainer_defaults=_trainer_defaults(),
        save_config_kwargs={"overwrite": True},
        parser_kwargs={**_PARSER_KWARGS, **{sub: dict(_PARSER_KWARGS) for sub in _SUBCOMMANDS}},
        args=args,
        run=run,
        auto_configure_optimizers=False,
        extra_options=extra_options,
        parser_class=VisionArgumentParser,
    )


def train_main(args: list[str] | None = None) -> int:
    """``tools/train.py fit|validate|test|predict --config C.yaml ...``; a user mistake exits with code 2."""
    # LightningCLI reads sys.argv itself when given None (it warns when given both)
    return run_tool(lambda argv: make_cli(None if argv == sys.argv[1:] else argv) and 0, args, prog="train.py")


def _take_option(argv: list[str], name: str) -> str | None:
    """Remove ``name VALUE`` or ``name=VALUE`` from ``argv`` and return the value."""
    for i, arg in enumerate(argv):
        if arg == name:
            if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
                raise UsageError(f"{name} needs a value")
            value = argv[i + 1]
            del argv[i : i + 2]
            return value
        if arg.startswith(name + "="):
            del argv[i]
            return arg.split("=", 1)[1]
    return None


def eval_main(argv: list[str] | None = None) -> int:
    """``tools/eval.py --config C --ckpt_path K [--trainer.* / --data.* / --model.*] [--output stats.json] [--onnx M.onnx]
    [--per_class] [--readouts.out_dir D] [--quiet]``.

    Runs ``validate`` (any task; DDP flags work) and writes the logged metrics as JSON on rank 0; Lightning's
    bar shows how far it is (``--quiet``: no bar, no INFO lines, the stats only).
    ``--per_class`` (detection): prints the per-class table and adds its rows to the JSON as ``per_class``;
    the flat ``<stage>/per_class/...`` scalars the task logs are left out of the JSON either way. The
    readouts callback writes its files (PR curves, confusion matrix, TIDE) into ``<root>/readouts/val``
    or ``--readouts.out_dir``. ``--onnx M.onnx``: the exported graph, run by onnxruntime, stands in for the model
    (:class:`visiontf.callbacks.OnnxRuntimeEvaluation`): the same data, post-processing and evaluator.
    """
    return run_tool(_eval, argv, prog="eval.py")


def _take_flag(argv: list[str], name: str) -> bool:
    """Remove the flag ``name`` (or ``name=true|false``) from ``argv``; whether it was set."""
    value = False
    for arg in list(argv):
        if arg == name or arg.startswith(name + "="):
            text = arg.split("=", 1)[1].lower() if "=" in arg else "true"
            if text not in ("true", "false"):
                raise UsageError(f"{arg}: {name} is a flag (or {name}=true|false)")
            value = text == "true"
            argv.remove(arg)
    return value


def _eval(argv: list[str]) -> int:
    argv = list(argv)
    output = _take_option(argv, "--output")
    onnx = _take_option(argv, "--onnx")
    if onnx:  # the exported graph in place of the model, through the same steps and evaluator
        argv += ["--trainer.callbacks+=visiontf.callbacks.OnnxRuntimeEvaluation", f"--trainer.callbacks.onnx={onnx}"]
    per_class = _take_flag(argv, "--per_class")
    quiet = _take_flag(argv, "--quiet")
    if quiet:  # the evaluation's own bar off, and only warnings and errors besides the stats
        argv.append("--trainer.enable_progress_bar=false")
        logging.getLogger().setLevel(logging.WARNING)
    set_progress(not quiet)
    cli = make_cli(["validate", *argv], extra_options=("--output", "--onnx", "--per_class", "--quiet"), quiet=quiet)
    trainer = cli.trainer
    stats = {k: float(v) for k, v in trainer.callback_metrics.items()
             if getattr(v, "numel", lambda: 1)() == 1 and "/per_class/" not in k}
    extra = getattr(cli.model, "eval_report", None)
    if trainer.is_global_zero:
        if callable(extra):
            report = extra()
            if report:
                print(report.get("table", ""))
                rows = report.get("per_class")
                if per_class and rows is not None:
                    from visiontf.evaluation.readouts.per_class import format_per_class_table, per_class_json

                    print(format_per_class_table(rows))
                    stats["per_class"] = per_class_json(rows)
                elif per_class:
                    raise UsageError("--per_class: per-class numbers are of detection evaluations (COCO); this task "
                                     "has none (segmentation logs IoU_<class> itself)")
                stats.update({k: v for k, v in report.items() if k not in ("table", "per_class")})
        print(json.dumps(stats, indent=2, sort_keys=True))
        if output:
            Path(output).parent.mkdir(parents=True, exist_ok=True)
            Path(output).write_text(json.dumps(stats, indent=2, sort_keys=True) + "\n")
    return 0
