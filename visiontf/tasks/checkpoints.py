"""Reading visiontf's Lightning task checkpoints without Lightning: the network and what it needs to predict.

A task checkpoint holds the network's weights (``state_dict`` under ``model.``), the task's
hyper-parameters (``model_name``, ``num_classes``, ``model_kwargs``), the class names and category
ids of its data, and, since visiontf saves it, ``preprocess``: the complete eval preprocessing
(``pretrained_cfg`` keys) resolved by the task's adapter when the checkpoint was written.

A checkpoint without ``preprocess`` (not written by a visiontf task) predicts with the model's own
``pretrained_cfg``.
"""
from __future__ import annotations

import contextvars
import functools
import logging
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from visiontf.core.errors import UserError
from visiontf.core.saved_arguments import SavedArgumentsError, check_value, label_table
from visiontf.io.lightning_checkpoint import lies_under, load_lightning_checkpoint, saved_init_arguments, spelled
from visiontf.io.weights import (
    WeightsError,
    check_tensor_values,
    corrupt_file_error,
    damaged_record,
    not_a_tensor,
    safe_torch_load,
    weights_from_checkpoint,
)

log = logging.getLogger(__name__)


class CheckpointError(UserError, ValueError):
    """A checkpoint cannot be used as asked (missing, incomplete, of another task, model or number of
    classes); the message names the file and the fix."""

#: the hyper-parameters that rebuild a task's network, and their types (every task takes them first)
MODEL_ARGUMENTS = {"model_name": str, "num_classes": int | None, "model_kwargs": dict[str, Any] | None}


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
    arguments = checkpoint_arguments(ckpt, path)
    hp = arguments.task_arguments
    if "model_name" not in hp or "state_dict" not in ckpt:
        raise CheckpointError(
            f"{path}: not a visiontf task checkpoint (needs 'hyper_parameters.model_name' and 'state_dict'; "
            f"has keys {sorted(ckpt)[:10]}). For a plain state dict use create_model(name, pretrained=path)."
        )
    if arguments.task is None:  # a run outside the CLI names no task class: what is read here is typed here
        try:
            for key, hint in MODEL_ARGUMENTS.items():
                check_value(hp.get(key), hint, str(path), f"hyper_parameters.{key}")
        except SavedArgumentsError as e:
            raise CheckpointError(str(e)) from None
    if not isinstance(ckpt["state_dict"], Mapping):
        raise CheckpointError(f"{path}: 'state_dict' is a {type(ckpt['state_dict']).__name__}, not a mapping of tensor names to "
                              "tensors; not a visiontf task checkpoint")
    saved = {k[len("model."):]: v for k, v in ckpt["state_dict"].items() if isinstance(k, str) and k.startswith("model.")}
    odd = next((k for k, v in saved.items() if not torch.is_tensor(v)), None)
    if odd is not None:  # before any shape is compared or converted
        raise CheckpointError(str(not_a_tensor(str(path), f"model.{odd}", saved[odd])))
    kwargs = {**(hp.get("model_kwargs") or {}), **overrides}
    check_checkpoint_builds_what_it_holds(ckpt, path, {**hp, "model_kwargs": kwargs})
    # the checkpoint holds every weight: no file its settings name is read (a backbone's pretrained, timm's checkpoint_path)
    with weights_from_checkpoint():
        model = create_model(hp["model_name"], num_classes=hp.get("num_classes"), **kwargs)
    # nn.Module.compile keeps names, but torch.compile(model) adds "_orig_mod."
    saved = {k.replace("_orig_mod.", ""): v for k, v in saved.items()}
    state = saved
    if not _fits_as_saved(model, saved):
        state = convert_state(model, dict(saved), strict=strict)
    check_tensor_values(state, model, str(path))
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
    except RuntimeError as e:  # shapes that differ: the hyper-parameters and the weights are not of one model
        shapes = "; ".join(line.strip() for line in str(e).splitlines() if "size mismatch" in line)
        raise CheckpointError(f"{path}: weights do not fit {hp['model_name']} built from the checkpoint's own hyper-parameters "
                              f"({shapes[:600] or str(e)[:600]}); the file was written by other code or edited") from None
    if strict and (missing or unexpected):
        raise CheckpointError(
            f"{path}: weights do not fit {hp['model_name']} built from the checkpoint's own hyper-parameters: "
            f"missing {missing[:5]}, unexpected {unexpected[:5]}; the file was written by other code or edited"
        )
    if missing:
        log.warning("%s: %d tensors of %s left at init (strict=False), e.g. %s", path, len(missing), hp["model_name"],
                    missing[:5])
    dm = arguments.data_arguments
    info: dict[str, Any] = {"hyper_parameters": hp, "datamodule_hyper_parameters": dm}
    saved_names, ids = saved_class_table(ckpt, path)
    names = saved_names or hp.get("class_names") or dm.get("class_names")
    if names:
        info["class_names"] = list(names)
    if ids:
        info["label_to_cat_id"] = ids
    if ckpt.get("preprocess") is not None:  # written by visiontf as {setting: value}: anything else is refused by key
        try:
            preprocess = check_value(ckpt["preprocess"], dict[str, Any], str(path), "preprocess")
        except SavedArgumentsError as e:
            raise CheckpointError(str(e)) from None
        info["preprocess"] = dict(preprocess)
        source = "saved with the checkpoint"
    else:
        info["preprocess"] = {}
        source = "not saved, the model's pretrained_cfg"
    log.info("%s: rebuilt %s (%d tensors); preprocessing %s: %s", path, hp["model_name"], len(state), source,
             info["preprocess"] or "model defaults")
    return model, info


def saved_class_table(ckpt: Mapping[str, Any], where: str | Path) -> tuple[list[str] | None, dict[int, int] | None]:
    """A checkpoint's class names and ``label -> category id`` table, as visiontf writes them (a list of strings, a
    mapping of integer labels, or their strings, to integers; either may be absent), or :class:`CheckpointError`
    naming the file and the key."""
    try:
        names = check_value(ckpt.get("class_names"), list[str] | None, str(where), "class_names")
        ids = ckpt.get("label_to_cat_id")
        return names, None if ids is None else label_table(ids, str(where), "label_to_cat_id")
    except SavedArgumentsError as e:
        raise CheckpointError(str(e)) from None


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
    from visiontf.core.config_files import read_config

    cfg = read_config(config)  # with its base files (a variant's config: key)
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


def best_checkpoint(checkpoint_dir: str | Path) -> Path:
    """The best checkpoint of the run whose checkpoints are in ``checkpoint_dir``: the one its ``last.ckpt``
    records (the checkpoint callback's ``best_model_path``), found in that folder by name when the run folder
    has moved since."""
    folder = Path(checkpoint_dir)
    last = find_last_checkpoint(folder)
    if last is None:
        raise CheckpointError(f"--ckpt_path best: no last.ckpt in {folder} to read the run's best checkpoint from "
                              f"({_listing(folder)}); check trainer.default_root_dir or pass the checkpoint's path")
    ckpt = safe_torch_load(last, mmap=True)
    states = (ckpt.get("callbacks") if isinstance(ckpt, dict) else None) or {}
    recorded = sorted({str(v["best_model_path"]) for v in states.values()
                       if isinstance(v, dict) and isinstance(v.get("best_model_path"), str) and v["best_model_path"]})
    if not recorded:
        raise CheckpointError(f"--ckpt_path best: {last} records no best checkpoint (no checkpoint was kept by a "
                              f"monitored metric yet); pass the checkpoint's path ({_listing(folder)})")
    if len(recorded) > 1:
        raise CheckpointError(f"--ckpt_path best: {last} records several best checkpoints ({', '.join(recorded)}), one "
                              "per checkpoint callback; pass the one you mean")
    best = Path(recorded[0])
    inside = functools.partial(lies_under, folder=os.path.realpath(folder))
    if not inside(os.path.realpath(best)) and (folder / best.name).is_file():
        best = folder / best.name  # the run folder was moved or copied: the same file in its new place
    if not inside(os.path.realpath(best)):
        # what a checkpoint records is data: it names a file of its own run, never one elsewhere to be read
        raise CheckpointError(f"--ckpt_path best: {last} records the best checkpoint {best}, outside the run's checkpoint "
                              f"folder {folder}, where a run keeps its checkpoints; pass the checkpoint's path")
    return best


def newest_hpc_checkpoint(root_dir: str | Path | None) -> Path | None:
    """``<root_dir>/hpc_ckpt_<N>.ckpt`` with the largest N (what Lightning's SLURM requeue writes), or None."""
    folder = Path(root_dir or "outputs")
    found = [(int(m.group(1)), p) for p in folder.glob("hpc_ckpt_*.ckpt")
             if (m := re.fullmatch(r"hpc_ckpt_(\d+)\.ckpt", p.name)) and p.is_file()] if folder.is_dir() else []
    return max(found)[1] if found else None


def resolve_checkpoint(ckpt_path: str | Path | None, checkpoint_dir: str | Path | None = None, *,
                       for_fit: bool = False, root_dir: str | Path | None = None) -> str | None:
    """The checkpoint file that ``--ckpt_path`` means, checked; the one resolver of every tool.

    Lightning's keywords become files here, so that what a tool reads is the file it names and goes through the
    same checks as a path (a file named ``best`` in the working folder is never read in its place):

    * ``None``: None (no checkpoint).
    * ``"last"``: the run's ``last.ckpt`` in ``checkpoint_dir`` (``<default_root_dir>/checkpoints``).
    * ``"best"``: the best checkpoint that run's ``last.ckpt`` records (:func:`best_checkpoint`).
    * ``"hpc"``: the newest ``hpc_ckpt_<N>.ckpt`` in ``root_dir`` (``trainer.default_root_dir``).
    * ``"registry:..."``: returned as it is (Lightning downloads it and restores the weights alone).
    * a path: it must be a complete checkpoint file; a missing or truncated file is a
      :class:`CheckpointError`, also when fitting (a typo must not silently start a new run).

    ``last`` and ``hpc`` with nothing there are an error (:class:`CheckpointError` naming the folder and
    what it holds), except when fitting (``for_fit``): then one INFO line says the run starts fresh (a
    requeued job's first start uses the same command line as its resumes).
    """
    if ckpt_path is None:
        return None
    text = str(ckpt_path)
    if text.startswith("registry:"):
        return text
    if text in ("last", "best") and checkpoint_dir is None:
        raise CheckpointError(
            f"--ckpt_path {text}: no run folder to look in; pass the checkpoint's path "
            "(<trainer.default_root_dir>/checkpoints/last.ckpt) or the training --config"
        )
    if text == "last":
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
    elif text == "best":
        path = best_checkpoint(checkpoint_dir)
    elif text == "hpc":
        found = newest_hpc_checkpoint(root_dir)
        if found is None:
            if for_fit:
                log.info("--ckpt_path hpc: no hpc_ckpt_<N>.ckpt in %s yet; starting a fresh run", root_dir or "outputs")
                return None
            raise CheckpointError(f"--ckpt_path hpc: no hpc_ckpt_<N>.ckpt in {root_dir or 'outputs'} (the trainer's "
                                  "default_root_dir); pass the checkpoint's path")
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
def checkpoint_classes(*trusted: type | None) -> dict[str, type]:
    """The classes a checkpoint may name, by every spelling (``module.Class``, ``module:Class``, ``Class``): the
    task table's tasks and data modules (visiontf's own, imported here) and ``trusted`` (the classes that the
    user's own config or call names)."""
    from visiontf.tasks.task_table import data_module_class_paths, import_class, task_class_paths

    ours = [import_class(p) for p in (*task_class_paths(), *data_module_class_paths())]
    return spelled([*ours, *(t for t in trusted if t is not None)])


@dataclass(frozen=True)
class SavedArguments:
    """A checkpoint's task and data module, as the classes they name and their constructor arguments, checked
    as data (:func:`checkpoint_arguments`). A class is None when the file names none (a run outside the CLI)."""

    task: type | None
    task_arguments: dict[str, Any]
    data: type | None
    data_arguments: dict[str, Any]


def checkpoint_arguments(ckpt: Any, path: str | Path, task: type | None = None, data: type | None = None) -> SavedArguments:
    """A checkpoint's hyper-parameters read as data, the one reader of them in visiontf.

    ``hyper_parameters`` may name (``_class_path``) only a task of the task table or ``task`` (the class the
    caller builds), and a subclass of ``task`` when given; ``datamodule_hyper_parameters`` only a data module of
    the table or ``data``. Every value is checked against the named class's typed signature (plain data where no
    class is named), so a class reference in any spelling, a value of another type or an unknown key is a
    :class:`CheckpointError` naming the file and the dotted key. Nothing is imported or called that the file names.
    """
    from visiontf.tasks.optim import RENAMED

    if not isinstance(ckpt, dict):
        raise CheckpointError(f"{path}: holds a {type(ckpt).__name__}, not a checkpoint (a mapping of its parts)")
    allowed = checkpoint_classes(task, data)
    try:
        task_cls, task_args = saved_init_arguments(ckpt.get("hyper_parameters"), path, "hyper_parameters", allowed,
                                                   expected=task, ignored=RENAMED)
        data_cls, data_args = saved_init_arguments(ckpt.get("datamodule_hyper_parameters"), path,
                                                   "datamodule_hyper_parameters", allowed)
    except SavedArgumentsError as e:
        raise CheckpointError(str(e)) from None
    return SavedArguments(task_cls, task_args, data_cls, data_args)


def check_checkpoint_builds_what_it_holds(ckpt: Mapping[str, Any], path: Any, task_arguments: Mapping[str, Any]) -> None:
    """Refuse a checkpoint whose ``model_name`` and ``model_kwargs`` build a model far larger than its ``state_dict``
    holds (``num_queries: 200_000_000`` beside a tiny detector's weights asked for 100 GB), before anything is built
    (:func:`~visiontf.models.check_settings_fit_the_weights`, on the meta device)."""
    from visiontf.models import check_settings_fit_the_weights

    name, state = task_arguments.get("model_name"), ckpt.get("state_dict")
    if not isinstance(name, str) or not isinstance(state, Mapping):
        return
    held = sum(v.numel() for k, v in state.items() if isinstance(k, str) and k.startswith("model.") and torch.is_tensor(v))
    kwargs = {"num_classes": task_arguments.get("num_classes"), **(task_arguments.get("model_kwargs") or {})}
    try:
        check_settings_fit_the_weights(name, kwargs, held, str(path))
    except WeightsError as e:
        raise CheckpointError(str(e)) from None


def load_task_checkpoint(cls: type, checkpoint_path: Any, **kwargs: Any) -> Any:
    """``cls.load_from_checkpoint(checkpoint_path, ...)`` (Lightning's arguments) with the hyper-parameters read
    as data (:func:`checkpoint_arguments`'s rules): the task built by a plain call, never by what the file names."""
    from visiontf.tasks.optim import RENAMED

    if isinstance(checkpoint_path, (str, Path)):
        checkpoint_path = resolve_checkpoint(checkpoint_path)
    token = _LOADING.set(str(checkpoint_path) if isinstance(checkpoint_path, (str, Path)) else None)
    try:
        return load_lightning_checkpoint(cls, checkpoint_path, checkpoint_classes(cls), ignored=RENAMED,
                                         check_before_build=functools.partial(_check_sizes_before_build, checkpoint_path),
                                         **kwargs)
    except SavedArgumentsError as e:
        raise CheckpointError(str(e)) from None
    finally:
        _LOADING.reset(token)


#: the file :func:`load_task_checkpoint` is loading, for the task's ``on_load_checkpoint`` to name (it has no trainer,
#: whose ``ckpt_path`` names the file of ``--ckpt_path``)
_LOADING: contextvars.ContextVar[str | None] = contextvars.ContextVar("visiontf_loading_checkpoint", default=None)


def checkpoint_being_loaded() -> str | None:
    """The path :func:`load_task_checkpoint` is loading (None outside it, or for a file object)."""
    return _LOADING.get()


def _check_sizes_before_build(path: Any, ckpt: Mapping[str, Any], arguments: Mapping[str, Any]) -> None:
    check_checkpoint_builds_what_it_holds(ckpt, path if isinstance(path, (str, Path)) else "the checkpoint", arguments)


# ---------------------------------------------------------------------------------------- does it fit
def checkpoint_task(ckpt: dict[str, Any]) -> str | None:
    """The task a visiontf checkpoint was trained for: saved since visiontf stores it (``task``), else
    found through the registry tags of its ``model_name``; None for other checkpoints."""
    if isinstance(ckpt.get("task"), str) and ckpt["task"]:
        return ckpt["task"]
    name = _saved_hparams(ckpt).get("model_name")
    if not isinstance(name, str) or not name:
        return None
    from visiontf.models import get_entry
    from visiontf.tasks.task_table import TASKS

    try:
        tags = get_entry(name).tags
    except Exception:  # noqa: BLE001 - a name this version does not know: nothing to compare
        return None
    return next((t for t in tags if t in TASKS), None)


def check_checkpoint_task(ckpt: dict[str, Any], path: str | Path, task_class: type | None) -> None:
    """Refuse a checkpoint of another task than ``task_class`` (the config's ``model.class_path``) builds."""
    task = getattr(task_class, "task", None)
    ck_task = checkpoint_task(ckpt)
    if task and ck_task is not None and ck_task != task:
        raise CheckpointError(
            f"{path}: a {ck_task} checkpoint ({_saved_hparams(ckpt).get('model_name')}), but this config builds a "
            f"{task} model ({task_class.__name__}); use the config the checkpoint was trained with"
        )


def _saved_hparams(ckpt: Any) -> dict[str, Any]:
    """A checkpoint's ``hyper_parameters`` for a look at a field (empty when it holds no mapping there)."""
    hp = ckpt.get("hyper_parameters") if isinstance(ckpt, dict) else None
    return hp if isinstance(hp, dict) else {}


def check_config_model(ckpt: dict[str, Any], path: str | Path, model_name: str | None, config: Any = None) -> None:
    """Refuse a checkpoint of another model than the config's ``model_name``, before LightningCLI merges the
    checkpoint's hyper-parameters into the config.

    The merge builds the checkpoint's model, so the run would go on silently with the other model's data and
    trainer settings: a ``detr_tiny`` checkpoint evaluated with the ``dino_tiny`` config was scored at
    DINO's evaluation size. Giving ``--model.init_args.model_name`` the checkpoint's model says it is meant.
    """
    ck_model = _saved_hparams(ckpt).get("model_name")
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
                          num_classes: int | None, class_names: Sequence[str] | None = None,
                          label_to_cat_id: Mapping[int, int] | None = None, data: str = "the data",
                          through: str = "--ckpt_path") -> None:
    """Refuse, before any weight is copied, a checkpoint of another task, model or number of classes, or one whose
    classes (names and category ids, as saved with it) are not ``class_names`` / ``label_to_cat_id`` of ``data``.

    Called by the tasks when Lightning restores ``--ckpt_path`` (fit, validate, test, predict), and by
    ``Task.load_from_checkpoint`` (``through``, which the fix names); the message names the file, both sides
    and the fix. Checkpoints without visiontf hyper-parameters pass (Lightning's own key check then
    applies), and so do classes either side does not record.
    """
    hp = _saved_hparams(ckpt)
    if not isinstance(hp.get("model_name"), str):
        return
    where = str(path) if path else "the checkpoint"
    pretrained = f"`--model.init_args.pretrained={where}` instead of --ckpt_path" if through == "--ckpt_path" else (
        f"the task built with pretrained={where!r} instead of {through}")
    ck_task, ck_model, ck_classes = checkpoint_task(ckpt), hp["model_name"], hp.get("num_classes")
    if ck_task is not None and ck_task != task:
        raise CheckpointError(
            f"{where}: a {ck_task} checkpoint ({ck_model}), but this config builds a {task} model ({model_name}); "
            "use the config the checkpoint was trained with"
        )
    if ck_model != model_name:
        raise CheckpointError(
            f"{where}: a checkpoint of {ck_model}, but this config builds {model_name}; use the config it was trained "
            f"with ({'--model.init_args.' if through == '--ckpt_path' else ''}model_name={ck_model}), or start a new "
            f"run from its weights with {pretrained}"
        )
    if isinstance(ck_classes, int) and num_classes is not None and ck_classes != int(num_classes):
        raise CheckpointError(
            f"{where}: trained for {ck_classes} classes, but this run has {num_classes} "
            f"({'from the data' if through == '--ckpt_path' else data}); {through} resumes or evaluates that same model. "
            f"To fine-tune with a new head, start a new run with {pretrained}"
        )
    saved_names, saved_ids = saved_class_table(ckpt, where)
    names_differ = bool(saved_names and class_names) and list(saved_names) != list(class_names)
    ids_differ = bool(saved_ids and label_to_cat_id) and (
        saved_ids != {int(k): int(v) for k, v in label_to_cat_id.items()})
    if names_differ or ids_differ:
        # the same class count with other names or ids: each output would be scored (or trained) as another category
        raise CheckpointError(
            f"{where}: trained on {describe_classes(saved_names or class_names, saved_ids)}, but {data} has "
            f"{describe_classes(class_names or saved_names, label_to_cat_id)}; {through} resumes or evaluates that same "
            f"model on the classes it was trained on: give the data it was trained with, or start a new run from its "
            f"weights on these classes with {pretrained}"
        )


def describe_classes(names: Sequence[str] | None, ids: Mapping[Any, Any] | None) -> str:
    """``4 classes (circle=1, square=2, ...)``: a class table (names by label, ``label -> category id``) as the messages
    about checkpoints and their data name it."""
    table = {int(k): int(v) for k, v in (ids or {}).items()}
    listed = [f"{name}={table[i]}" if i in table else str(name) for i, name in enumerate(names or [])]
    shown = ", ".join(listed[:6]) + (", ..." if len(listed) > 6 else "")
    return f"{len(listed)} classes ({shown})"


__all__ = ["CheckpointError", "SavedArguments", "WeightsError", "check_checkpoint_fits", "saved_class_table",
           "check_checkpoint_task", "checkpoint_arguments", "checkpoint_classes", "load_task_checkpoint",
           "check_config_model", "checkpoint_task", "config_checkpoint_dir", "find_last_checkpoint", "load_checkpoint_model",
           "best_checkpoint", "describe_classes", "newest_hpc_checkpoint", "resolve_checkpoint", "run_checkpoint_dir"]
