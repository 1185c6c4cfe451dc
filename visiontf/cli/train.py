"""One LightningCLI for every task: ``tools/train.py fit|validate|test|predict --config X.yaml``.

Subclass mode: the YAML's ``model.class_path`` and ``data.class_path`` choose the task and data
module. ``data.num_classes`` is linked into ``model.init_args.num_classes`` at instantiation.
"""
from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

# every task and data module, so that configs may name them by short class_path (e.g. "ClassificationTask")
import visiontf.data.classification  # noqa: F401
import visiontf.data.coco  # noqa: F401
import visiontf.data.segmentation  # noqa: F401
import visiontf.tasks.classification  # noqa: F401
import visiontf.tasks.detection  # noqa: F401
import visiontf.tasks.segmentation  # noqa: F401
from visiontf.callbacks import LastAndBestCheckpoint, RNGStateCheckpoint
from visiontf.checkpoint_io import install_atomic_checkpoint_io
from visiontf.checkpoints import check_checkpoint_task, resolve_checkpoint, run_checkpoint_dir
from visiontf.errors import UserError


class VisionCLI(LightningCLI):
    """LightningCLI with visiontf's defaults: ``data.num_classes`` linked into the task, a
    ``last.ckpt`` in ``<root>/checkpoints`` that is always the latest state
    (:class:`~visiontf.callbacks.LastAndBestCheckpoint`) and written atomically
    (:class:`~visiontf.checkpoint_io.AtomicCheckpointIO`), ``--ckpt_path`` checked by
    :func:`~visiontf.checkpoints.resolve_checkpoint`, CSV + TensorBoard logs, the RNG-state callback."""

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.link_arguments("data.num_classes", "model.init_args.num_classes", apply_on="instantiate")
        parser.add_lightning_class_args(LastAndBestCheckpoint, "checkpoint")
        parser.set_defaults(
            {
                "checkpoint.save_last": True,
                "checkpoint.filename": "epoch{epoch:03d}-step{step:06d}",
                "checkpoint.auto_insert_metric_name": False,
                "checkpoint.save_top_k": 1,
            }
        )


    def _instantiate_trainer(self, config: dict, callbacks: list) -> L.Trainer:
        root = Path(config.get("default_root_dir") or "outputs")
        if config.get("logger") in (None, True):
            # both a CSV log (for tools/plot_logs.py) and TensorBoard, under the run's own folder
            config["logger"] = [CSVLogger(root, name="csv"), TensorBoardLogger(root, name="tb")]
        elif config.get("logger") is False:
            # LearningRateMonitor refuses to run without a logger
            self.trainer_defaults["callbacks"] = [
                cb for cb in self.trainer_defaults.get("callbacks", []) if not isinstance(cb, LearningRateMonitor)
            ]
        for cb in callbacks + list(config.get("callbacks") or []):
            if isinstance(cb, ModelCheckpoint) and cb.dirpath is None:
                # a fixed folder, so a new process finds last.ckpt with --ckpt_path last
                cb.dirpath = str(run_checkpoint_dir(root))
        trainer = super()._instantiate_trainer(config, callbacks)
        install_atomic_checkpoint_io(trainer)
        return trainer

    def instantiate_classes(self) -> None:
        # jsonargparse wraps an error raised in a data module's or task's __init__ (ConfigError, a
        # missing dataset folder) in "Does not validate against any of the Union subtypes"; the user's
        # mistake is the cause, so it is what gets raised (named, one line for the CLI)
        try:
            super().instantiate_classes()
        except ValueError as e:
            cause = _user_error_in_chain(e)
            if cause is None:
                raise
            raise cause from e

    def _parse_ckpt_path(self) -> None:
        # Lightning reads --ckpt_path here, before anything is built, and merges the checkpoint's
        # hyper-parameters into the model's config. First: which file "last" means, whether it is
        # complete, and whether it is a checkpoint of this config's task at all (merging another task's
        # hyper-parameters fails far from the cause). "last" with nothing there: fit starts fresh (one
        # INFO line, the requeue case); validate/test/predict refuse, never evaluating random weights.
        subcommand = self.config.get("subcommand")
        if subcommand and self.config[subcommand].get("ckpt_path") is not None:
            cfg = self.config[subcommand]
            folder = run_checkpoint_dir(cfg.get("trainer.default_root_dir"), cfg.get("checkpoint.dirpath"))
            resolved = resolve_checkpoint(cfg["ckpt_path"], folder, for_fit=subcommand == "fit")
            cfg["ckpt_path"] = resolved
            if resolved is not None and Path(resolved).is_file():
                check_checkpoint_task(resolved, cfg.get("model.class_path"))
        super()._parse_ckpt_path()


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
    # RNG states in every checkpoint: a killed run resumed with --ckpt_path last continues exactly
    return {"callbacks": [LearningRateMonitor(logging_interval="step"), RNGStateCheckpoint()]}


def make_cli(args: list[str] | None = None, run: bool = True) -> VisionCLI:
    """The CLI (subclass mode: the YAML's ``class_path``s choose task and data), run on ``args``."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    return VisionCLI(
        L.LightningModule,
        L.LightningDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        trainer_defaults=_trainer_defaults(),
        save_config_kwargs={"overwrite": True},
        args=args,
        run=run,
        auto_configure_optimizers=False,
    )


def train_main(args: list[str] | None = None) -> None:
    """``tools/train.py fit|validate|test|predict --config C.yaml ...``."""
    make_cli(args)


def eval_main(argv: list[str] | None = None) -> int:
    """``tools/eval.py --config C --ckpt_path K [--trainer.* / --data.* / --model.*] [--output stats.json]``.

    Runs ``validate`` (any task; DDP flags work) and writes the logged metrics as JSON on rank 0.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    output = None
    if "--output" in argv:
        i = argv.index("--output")
        output = argv[i + 1]
        del argv[i : i + 2]
    cli = make_cli(["validate", *argv])
    trainer = cli.trainer
    stats = {k: float(v) for k, v in trainer.callback_metrics.items() if getattr(v, "numel", lambda: 1)() == 1}
    extra = getattr(cli.model, "eval_report", None)
    if trainer.is_global_zero:
        if callable(extra):
            report = extra()
            if report:
                print(report.get("table", ""))
                stats.update({k: v for k, v in report.items() if k != "table"})
        print(json.dumps(stats, indent=2, sort_keys=True))
        if output:
            Path(output).parent.mkdir(parents=True, exist_ok=True)
            Path(output).write_text(json.dumps(stats, indent=2, sort_keys=True) + "\n")
    return 0
