"""Tables, pictures and files to every logger a trainer has, each in the form that logger keeps.

Scalars go through ``LightningModule.log`` (every logger takes them). What is not a scalar has no
common Lightning API, so each logger gets it its own way:

| what | TensorBoard | Weights & Biases | MLflow | CSV |
|---|---|---|---|---|
| a table | ``add_text`` (markdown) | ``wandb.Table`` | ``<key>.json`` artifact (``log_table``) | - |
| a picture | ``add_image`` | ``wandb.Image`` | ``<key>.png`` artifact (``log_image``) | - |
| a file | - | saved with the run (``run.save``) | artifact | - |

The logger classes are Lightning's; wandb and mlflow are imported by those loggers only when a
config asks for them (``--trainer.logger WandbLogger`` / ``MLFlowLogger``), never by this module.
"""
from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from lightning.pytorch import Trainer
from lightning.pytorch.loggers import Logger, MLFlowLogger, TensorBoardLogger, WandbLogger

log = logging.getLogger(__name__)

__all__ = ["log_files", "log_image", "log_table", "markdown_table"]


def _safe_key(key: str) -> str:
    """A key as a relative artifact path (MLflow artifacts are files)."""
    return "/".join(part.replace(" ", "_") for part in key.split("/") if part)


def markdown_table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    def cell(v: Any) -> str:
        return f"{v:.4f}" if isinstance(v, float) and v == v else ("nan" if isinstance(v, float) else str(v))

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def _loggers(trainer: Trainer) -> list[Logger]:
    return list(trainer.loggers) if trainer is not None else []


def log_table(trainer: Trainer, key: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], step: int | None = None) -> None:
    """A table (``rows`` of values in ``columns`` order) to every logger that keeps one."""
    step = trainer.global_step if step is None else step
    for logger in _loggers(trainer):
        if isinstance(logger, TensorBoardLogger):
            logger.experiment.add_text(key, markdown_table(columns, rows), global_step=step)
        elif isinstance(logger, WandbLogger):
            logger.log_table(key, columns=list(columns), data=[list(r) for r in rows], step=step)
        elif isinstance(logger, MLFlowLogger):
            data = {c: [r[i] for r in rows] for i, c in enumerate(columns)}
            logger.experiment.log_table(logger.run_id, data, f"{_safe_key(key)}_step{step}.json")


def log_image(trainer: Trainer, key: str, image: Any, step: int | None = None, caption: str | None = None) -> None:
    """A picture (uint8, (3, H, W) tensor or (H, W, 3) array, or a PIL image) to every logger that keeps one."""
    step = trainer.global_step if step is None else step
    hwc = _hwc(image)
    for logger in _loggers(trainer):
        if isinstance(logger, TensorBoardLogger):
            logger.experiment.add_image(key, hwc, global_step=step, dataformats="HWC")
        elif isinstance(logger, WandbLogger):
            logger.log_image(key, [hwc], step=step, **({"caption": [caption]} if caption else {}))
        elif isinstance(logger, MLFlowLogger):
            logger.experiment.log_image(logger.run_id, hwc, artifact_file=f"{_safe_key(key)}_step{step}.png")


def log_files(trainer: Trainer, paths: Sequence[Path], folder: str) -> None:
    """Files (a readouts folder's JSON and PNG) kept with the run, under ``folder``, where a logger keeps files."""
    for logger in _loggers(trainer):
        if isinstance(logger, WandbLogger):
            for path in paths:
                # base_path: the file keeps its folder's name inside the run's files
                logger.experiment.save(str(path), base_path=str(Path(path).parent.parent), policy="now")
        elif isinstance(logger, MLFlowLogger):
            for path in paths:
                logger.experiment.log_artifact(logger.run_id, str(path), artifact_path=_safe_key(folder))


def _hwc(image: Any) -> np.ndarray:
    if hasattr(image, "convert"):  # PIL
        return np.asarray(image.convert("RGB"))
    array = image.detach().cpu().numpy() if hasattr(image, "detach") else np.asarray(image)
    if array.ndim == 3 and array.shape[0] in (1, 3) and array.shape[-1] not in (1, 3):
        array = array.transpose(1, 2, 0)
    if array.ndim == 3 and array.shape[-1] == 1:
        array = np.repeat(array, 3, axis=-1)
    return np.ascontiguousarray(array.astype(np.uint8))


def log_wandb_checkpoints(trainer: Trainer, checkpoints: dict[str, Path]) -> list[str]:
    """Checkpoints as one W&B artifact of type ``model`` per file, aliased by the keys of ``checkpoints``
    (``{"best": ..., "last": ...}``; one file under two names is one artifact with both aliases), for
    every W&B logger of the trainer; offline runs keep them for ``wandb sync``. Returns the artifact names."""
    loggers = [lg for lg in _loggers(trainer) if isinstance(lg, WandbLogger)]
    if not loggers:
        return []
    import wandb  # the W&B logger has imported it already

    by_file: dict[Path, list[str]] = {}
    for alias, path in checkpoints.items():
        by_file.setdefault(Path(path).resolve(), []).append(alias)
    names = []
    for logger in loggers:
        run = logger.experiment
        for path, aliases in by_file.items():
            artifact = wandb.Artifact(name=f"model-{run.id}", type="model",
                                      metadata={"file": path.name, "aliases": aliases, "step": trainer.global_step})
            artifact.add_file(str(path), name=path.name)
            run.log_artifact(artifact, aliases=aliases)
            names.append(artifact.name)
    return names
