"""Reading visiontf's Lightning task checkpoints without Lightning: the network and what it needs to predict.

A task checkpoint holds the network's weights (``state_dict`` under ``model.``), the task's
hyper-parameters (``model_name``, ``num_classes``, ``model_kwargs``), the class names and category
ids of its data, and, since visiontf saves it, ``preprocess``: the complete eval preprocessing
(``pretrained_cfg`` keys) resolved by the task's adapter when the checkpoint was written.

A checkpoint without ``preprocess`` (not written by a visiontf task) predicts with the model's own
``pretrained_cfg``.
"""
from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

from torch import nn

from visiontf.core.errors import UserError
from visiontf.io.weights import (
    WeightsError,
    check_tensor_values,
    corrupt_file_error,
    damaged_record,
    safe_torch_load,
)

log = logging.getLogger(__name__)


class CheckpointError(UserError, ValueError):
    """A checkpoint cannot be used as asked (missing, incomplete, of another task, model or number of
    classes); the message names the file and the fix."""

#: kwargs that point at weight files used only to initialise training; a checkpoint has all weights
INIT_ONLY_KWARGS = ("backbone_pretrained", "encoder_pretrained", "pretrained")


def load_checkpoint_model(ckpt_path: str | Path, strict: bool = True, **overrides: Any) -> tuple[nn.Module, dict[str, Any]]:
    """The plain network of a visiontf Lightning checkpoint, and what it knows about its data.

    Returns ``(model, info)``; ``info`` holds ``preprocess`` (eval settings in ``pretrained_cfg`` keys:
    as saved, empty when none was) and may hold
    ``class_names`` and ``label_to_cat_id``, besides the raw ``hyper_parameters`` and
    ``datamodule_hyper_parameters``.

    Weights that do not fit the rebuilt model as saved go through the family's ``filter_fn``
    (:func:`visiontf.models.convert_state`). ``strict=False`` loads what fits and leaves the rest at init; ``overrides`` are
    constructor arguments on top of the saved ``model_kwargs``.
    """
    from visiontf.models import convert_state, create_model

    path = Path(resolve_checkpoint(ckpt_path))
    ckpt = safe_torch_load(path)
    check_checkpoint_classes(ckpt, path)
    hp = dict(ckpt.get("hyper_parameters") or {})
    if "model_name" not in hp or "state_dict" not in ckpt:
        raise CheckpointError(
            f"{path}: not a visiontf task checkpoint (needs 'hyper_parameters.model_name' and 'state_dict'; "
            f"has keys {sorted(ckpt)[:10]}). For a plain state dict use create_model(name, pretrained=path)."
        )
    kwargs = {k: v for k, v in dict(hp.get("model_kwargs") or {}).items() if k not in INIT_ONLY_KWARGS}
    kwargs.update(overrides)
    model = create_model(hp["model_name"], num_classes=hp.get("num_classes"), **kwargs)
    saved = {k[len("model."):]: v for k, v in ckpt["state_dict"].items() if k.startswith("model.")}
    # nn.Module.compile keeps names, but torch.compile(model) adds "_orig_mod."
    saved = {k.replace("_orig_mod.", ""): v for k, v in saved.items()}
    state = saved
    if not _fits_as_saved(model, saved):
        state = convert_state(model, dict(saved), strict=strict)
    check_tensor_values(state, model, str(path))
    missing, unexpected = model.load_state_dict(state, strict=False)
    if strict and (missing or unexpected):
        raise CheckpointError(
            f"{path}: weights do not fit {hp['model_name']} built from the checkpoint's own hyper-parameters: "
            f"missing {missing[:5]}, unexpected {unexpected[:5]}; the file was written by other code or edited"
        )
    if missing:
        log.warning("%s: %d tensors of %s left at init (strict=False), e.g. %s", path, len(missing), hp["model_name"],
                    missing[:5])
    dm = dict(ckpt.get("datamodule_hyper_parameters") or {})
    info: dict[str, Any] = {"hyper_parameters": hp, "datamodule_hyper_parameters": dm}
    names = ckpt.get("class_names") or hp.get("class_names") or dm.get("class_names")
    if names:
        info["class_names"] = list(names)
    if ckpt.get("label_to_cat_id"):
        info["label_to_cat_id"] = {int(k): int(v) for k, v in ckpt["label_to_cat_id"].items()}
    if ckpt.get("preprocess") is not None:
        info["preprocess"] = dict(ckpt["preprocess"])
        source = "saved with the checkpoint"
    else:
        info["preprocess"] = {}
        source = "not saved, the model's pretrained_cfg"
    log.info("%s: rebuilt %s (%d tensors); preprocessing %s: %s", path, hp["model_name"], len(state), source,
             info["preprocess"] or "model defaults")
    return model, info


def _fits_as_saved(model: nn.Module, state: dict[str, Any]) -> bool:
    """Whether ``state`` has exactly ``model``'s keys and shapes (a checkpoint of this visiontf)."""
    own = model.state_dict()
    return own.keys() == state.keys() and all(tuple(own[k].shape) == tuple(state[k].shape) for k in own)


# ---------------------------------------------------------------------------------------- which file
#: ``last.ckpt``, and the ``last-v1.ckpt`` copies older Lightning runs wrote next to it
_LAST = re.compile(r"last(-v\d+)?\.ckpt")


def _listing(folder: Path) -> str:
    found = sorted(p.name for p in folder.glob("*.ckpt")) if folder.is_dir() else []
    if not found:
        return f"{folder} holds no .ckpt files" if folder.is_dir() else f"{folder} does not exist"
    return f"{folder} holds {', '.join(found[:8])}{' ...' if len(found) > 8 else ''}"


def run_checkpoint_dir(default_root_dir: str | Path | None, dirpath: str | Path | None = None) -> Path:
    """Where ``tools/train.py`` keeps a run's checkpoints: ``checkpoint.dirpath`` when set, else
    ``<trainer.default_root_dir>/checkpoints`` (``outputs/checkpoints`` without one)."""
    if dirpath:
        return Path(dirpath)
    return Path(default_root_dir or "outputs") / "checkpoints"


def config_checkpoint_dir(config: str | Path | None) -> Path | None:
    """:func:`run_checkpoint_dir` of a training YAML (None without a config)."""
    if not config:
        return None
    import yaml

    cfg = yaml.safe_load(Path(config).read_text()) or {}
    trainer, checkpoint = cfg.get("trainer") or {}, cfg.get("checkpoint") or {}
    return run_checkpoint_dir(trainer.get("default_root_dir"), checkpoint.get("dirpath"))


def find_last_checkpoint(checkpoint_dir: str | Path) -> Path | None:
    """``<checkpoint_dir>/last.ckpt`` (the newest of ``last.ckpt`` / ``last-vN.ckpt`` if an older run
    left copies), or None."""
    folder = Path(checkpoint_dir)
    if not folder.is_dir():
        return None
    found = [p for p in folder.iterdir() if _LAST.fullmatch(p.name) and p.is_file()]
    if not found:
        return None
    newest = max(found, key=lambda p: p.stat().st_mtime)
    if len(found) > 1:
        log.info("%s: %d last checkpoints (%s); using the newest, %s", folder, len(found),
                 ", ".join(sorted(p.name for p in found)), newest.name)
    return newest


def resolve_checkpoint(ckpt_path: str | Path | None, checkpoint_dir: str | Path | None = None, *,
                       for_fit: bool = False) -> str | None:
    """The checkpoint file that ``--ckpt_path`` means, checked; the one resolver of every tool.

    * ``None``: None (no checkpoint).
    * ``"last"``: the run's ``last.ckpt`` in ``checkpoint_dir`` (``<default_root_dir>/checkpoints``).
      None there is an error (:class:`CheckpointError` naming the folder and what it holds), except
      when fitting (``for_fit``): then one INFO line says the run starts fresh (a requeued job's first
      start uses the same command line as its resumes).
    * ``"best"``, ``"hpc"``, ``"registry:..."``: returned as they are (Lightning resolves them).
    * a path: it must be a complete checkpoint file; a missing or truncated file is a
      :class:`CheckpointError`, also when fitting (a typo must not silently start a new run).
    """
    if ckpt_path is None:
        return None
    text = str(ckpt_path)
    if text in ("best", "hpc") or text.startswith("registry:"):
        return text
    if text == "last":
        if checkpoint_dir is None:
            raise CheckpointError(
                "--ckpt_path last: no run folder to look in; pass the checkpoint's path "
                "(<trainer.default_root_dir>/checkpoints/last.ckpt) or the training --config"
            )
        found = find_last_checkpoint(checkpoint_dir)
        if found is None:
            if for_fit:
                log.info("--ckpt_path last: no last.ckpt in %s yet; starting a fresh run", checkpoint_dir)
                return None
            raise CheckpointError(
                f"--ckpt_path last: no last.ckpt in {checkpoint_dir} ({_listing(Path(checkpoint_dir))}); check "
                "trainer.default_root_dir (the run folder) or pass the checkpoint's path; nothing was evaluated"
            )
        path = found
    else:
        path = Path(text).expanduser()
    if path.is_dir():
        raise CheckpointError(f"{path}: is a folder, not a checkpoint ({_listing(path)}); pass the .ckpt file")
    if not path.is_file():
        broken = " (a broken symbolic link)" if path.is_symlink() else ""
        raise CheckpointError(f"{path}: checkpoint not found{broken}; {_listing(path.parent)}")
    _check_complete(path)
    return str(path)


def _check_complete(path: Path) -> None:
    """Refuse a file that is not a complete torch archive, before Lightning or torch.load reads it."""
    damaged = "the file is empty" if path.stat().st_size == 0 else damaged_record(path)
    if damaged:
        raise CheckpointError(str(corrupt_file_error(path, damaged)))


# ---------------------------------------------------------------------------------------- what it may name
#: keys under which a checkpoint's hyper-parameters name a class that jsonargparse (LightningCLI) would import
#: before checking its type: ``_class_path`` (how LightningCLI saves the task and data module) and
#: ``class_path`` (a subclass spec, also nested in ``Any``-typed values such as ``model_kwargs``)
CLASS_PATH_KEYS = ("_class_path", "class_path")
#: the one ``_instantiator`` LightningCLI saves (Lightning's own allow-list has no other)
CHECKPOINT_INSTANTIATORS = ("lightning.pytorch.cli.instantiate_module",)
#: the parts of a checkpoint that name classes: the task's and the data module's hyper-parameters
HYPER_PARAMETER_SECTIONS = ("hyper_parameters", "datamodule_hyper_parameters")


def checkpoint_class_paths() -> frozenset[str]:
    """The class paths a checkpoint may name: every task and data module of the task table, as
    ``module.Class``, ``module:Class`` and the short ``Class`` a config may give."""
    from visiontf.adapters.task_table import data_module_class_paths, task_class_paths

    full = (*task_class_paths(), *data_module_class_paths())
    return frozenset([*full, *(p.rpartition(".")[2] for p in full), *(":".join(p.rsplit(".", 1)) for p in full)])


def _class_references(value: Any, key: str):
    """``(dotted key, value)`` of every class path and instantiator under ``value``, at any depth."""
    import argparse

    if isinstance(value, argparse.Namespace):
        value = vars(value)
    if isinstance(value, dict):
        for k, v in value.items():
            here = f"{key}.{k}"
            if k in CLASS_PATH_KEYS or k == "_instantiator":
                yield here, v
            yield from _class_references(v, here)
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _class_references(v, f"{key}[{i}]")


def check_checkpoint_classes(ckpt: Any, path: str | Path, trusted: tuple[str | None, ...] = ()) -> None:
    """Refuse a checkpoint whose hyper-parameters name a class that is not visiontf's, before anything reads them.

    LightningCLI merges ``--ckpt_path``'s hyper-parameters into the config, and jsonargparse imports
    whatever module a ``class_path`` names before it checks the class: a shared checkpoint naming
    ``this.Zen``, ``antigravity`` or a module planted on the path would run that module's top-level
    code. Every ``_class_path``/``class_path`` (at any depth) must be a task or data module of the
    task table (:func:`checkpoint_class_paths`) or one of ``trusted`` (the classes the user's own
    config names), and ``_instantiator`` Lightning's; anything else is a :class:`CheckpointError`
    naming the key and the file. Nothing is imported here.
    """
    if not isinstance(ckpt, dict):
        return
    allowed = checkpoint_class_paths() | {str(t) for t in trusted if t}
    for section in HYPER_PARAMETER_SECTIONS:
        for key, value in _class_references(ckpt.get(section), section):
            ok = CHECKPOINT_INSTANTIATORS if key.endswith("._instantiator") else allowed
            if isinstance(value, str) and value in ok:
                continue
            shown = repr(value) if len(repr(value)) <= 120 else repr(value)[:117] + "..."
            what = "Lightning's CLI instantiator" if key.endswith("._instantiator") else "a visiontf task or data module"
            raise CheckpointError(
                f"{path}: {key} is {shown}, not {what}; a checkpoint may name only visiontf's task and data "
                "module classes (visiontf.adapters.task_table.TASK_TABLE), so it was refused before anything it names "
                "was imported; use a checkpoint written by visiontf's tools/train.py"
            )


def check_file_classes(path: Any, trusted: tuple[str | None, ...] = ()) -> None:
    """:func:`check_checkpoint_classes` of a checkpoint file (read memory-mapped, weights only). A path
    that is not a local file, or a file torch cannot read with ``weights_only`` (its reader then decides),
    is left to whoever reads it next."""
    if not isinstance(path, (str, Path)) or not Path(path).is_file():
        return
    path = Path(path)
    try:
        ckpt = safe_torch_load(path, mmap=True)
    except Exception:  # noqa: BLE001 - not readable as plain data: the caller's own load reports it
        return
    check_checkpoint_classes(ckpt, path, trusted)


# ---------------------------------------------------------------------------------------- does it fit
def checkpoint_task(ckpt: dict[str, Any]) -> str | None:
    """The task a visiontf checkpoint was trained for: saved since visiontf stores it (``task``), else
    found through the registry tags of its ``model_name``; None for other checkpoints."""
    if ckpt.get("task"):
        return str(ckpt["task"])
    name = (ckpt.get("hyper_parameters") or {}).get("model_name")
    if not name:
        return None
    from visiontf.adapters.task_table import TASKS
    from visiontf.models import get_entry

    try:
        tags = get_entry(name).tags
    except Exception:  # noqa: BLE001 - a name this version does not know: nothing to compare
        return None
    return next((t for t in tags if t in TASKS), None)


def check_checkpoint_task(path: str | Path, task_class_path: str | None) -> None:
    """Refuse a checkpoint of another task than the config's ``model.class_path`` (read memory-mapped,
    so a large checkpoint costs nothing here)."""
    import importlib

    if not task_class_path or "." not in str(task_class_path):
        return
    module, name = str(task_class_path).rsplit(".", 1)
    task = getattr(getattr(importlib.import_module(module), name, None), "task", None)
    if not task:
        return
    ckpt = safe_torch_load(path, mmap=True)
    ck_task = checkpoint_task(ckpt) if isinstance(ckpt, dict) else None
    if ck_task is not None and ck_task != task:
        hp = ckpt.get("hyper_parameters") or {}
        raise CheckpointError(
            f"{path}: a {ck_task} checkpoint ({hp.get('model_name')}), but this config builds a {task} model "
            f"({name}); use the config the checkpoint was trained with"
        )


def check_config_model(ckpt: dict[str, Any], path: str | Path, model_name: str | None, config: Any = None) -> None:
    """Refuse a checkpoint of another model than the config's ``model_name``, before LightningCLI merges the
    checkpoint's hyper-parameters into the config.

    The merge builds the checkpoint's model, so the run would go on silently with the other model's data and
    trainer settings: a ``detr_tiny`` checkpoint evaluated with the ``dino_tiny`` config was scored at
    DINO's evaluation size. Giving ``--model.init_args.model_name`` the checkpoint's model says it is meant.
    """
    ck_model = (ckpt.get("hyper_parameters") or {}).get("model_name")
    if not ck_model or not model_name or ck_model == model_name:
        return
    files = [str(c) for c in (config or []) if c]
    which = f"the config ({', '.join(files)})" if files else "the config"
    raise CheckpointError(
        f"{path}: a checkpoint of {ck_model}, but {which} builds {model_name}, and its data and trainer settings "
        f"(image sizes, batches, callbacks) are {model_name}'s; use the config the checkpoint was trained with "
        f"(config.yaml beside its logs), or add --model.init_args.model_name={ck_model} to run it with this "
        "config's settings on purpose"
    )


def check_checkpoint_fits(ckpt: dict[str, Any], path: str | Path | None, *, task: str, model_name: str,
                          num_classes: int | None) -> None:
    """Refuse, before any weight is copied, a checkpoint of another task, model or number of classes.

    Called by the tasks when Lightning restores ``--ckpt_path`` (fit, validate, test, predict); the
    message names the file, both sides and the fix. Checkpoints without visiontf hyper-parameters
    pass (Lightning's own key check then applies).
    """
    hp = ckpt.get("hyper_parameters") or {}
    if "model_name" not in hp:
        return
    where = str(path) if path else "the checkpoint"
    ck_task, ck_model, ck_classes = checkpoint_task(ckpt), hp["model_name"], hp.get("num_classes")
    if ck_task is not None and ck_task != task:
        raise CheckpointError(
            f"{where}: a {ck_task} checkpoint ({ck_model}), but this config builds a {task} model ({model_name}); "
            "use the config the checkpoint was trained with"
        )
    if ck_model != model_name:
        raise CheckpointError(
            f"{where}: a checkpoint of {ck_model}, but this config builds {model_name}; use the config it was trained "
            f"with (--model.init_args.model_name={ck_model}), or start a new run from its weights with "
            f"--model.init_args.pretrained={where}"
        )
    if ck_classes is not None and num_classes is not None and int(ck_classes) != int(num_classes):
        raise CheckpointError(
            f"{where}: trained for {ck_classes} classes, but this run has {num_classes} (from the data); --ckpt_path "
            f"resumes or evaluates that same model. To fine-tune with a new head, start a new run with "
            f"`--model.init_args.pretrained={where}` instead of --ckpt_path"
        )


__all__ = ["INIT_ONLY_KWARGS", "CheckpointError", "WeightsError", "check_checkpoint_classes", "check_checkpoint_fits",
           "check_checkpoint_task", "check_file_classes", "checkpoint_class_paths",
           "check_config_model", "checkpoint_task", "config_checkpoint_dir", "find_last_checkpoint", "load_checkpoint_model",
           "resolve_checkpoint", "run_checkpoint_dir"]
