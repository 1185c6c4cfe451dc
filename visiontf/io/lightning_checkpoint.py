"""Lightning checkpoints read as data: which class a section names, its constructor arguments checked against
the class's typed signature, and the module built from them by a plain call.

Lightning's ``load_from_checkpoint`` hands a checkpoint's hyper-parameters to the ``_instantiator`` the file
names (LightningCLI's runs jsonargparse), and LightningCLI merges them into its config through jsonargparse:
both parse strings as YAML or JSON and import what a ``class_path`` names. Here the file's ``_class_path`` is
looked up among classes the caller already holds (nothing is imported), ``_instantiator`` is recognised and
dropped (never called), and every other value goes through :func:`visiontf.core.saved_arguments.check_arguments`.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import IO, Any

import torch

from visiontf.core.former_paths import former_spellings
from visiontf.core.saved_arguments import SavedArgumentsError, check_arguments, plain_data, short_repr
from visiontf.io.weights import WeightsError, check_tensor_values, safe_torch_load, weights_from_checkpoint

#: what LightningCLI writes as ``_instantiator``: recognised and dropped, never called
LIGHTNING_CLI_INSTANTIATORS = ("lightning.pytorch.cli.instantiate_module", "pytorch_lightning.cli.instantiate_module")


def class_spellings(cls: type) -> tuple[str, ...]:
    """The ways a config or a checkpoint writes ``cls``: ``module.Class``, ``module:Class``, the short ``Class``,
    and the first two at the module it had before the task packages (:mod:`visiontf.core.former_paths`)."""
    return (f"{cls.__module__}.{cls.__qualname__}", f"{cls.__module__}:{cls.__qualname__}", cls.__qualname__,
            *former_spellings(cls))


def spelled(classes: Iterable[type]) -> dict[str, type]:
    """Every spelling of ``classes`` (:func:`class_spellings`) -> the class; a short name two classes share
    names neither."""
    out: dict[str, type] = {}
    clashes: set[str] = set()
    for cls in classes:
        for name in class_spellings(cls):
            if name in out and out[name] is not cls:
                clashes.add(name)
            out[name] = cls
    return {k: v for k, v in out.items() if k not in clashes}


def saved_init_arguments(section: Any, where: str | Path, key: str, allowed: Mapping[str, type],
                         expected: type | None = None, ignored: Iterable[str] = ()) -> tuple[type | None, dict[str, Any]]:
    """The class a checkpoint section (``hyper_parameters``, ``datamodule_hyper_parameters``) names and its
    constructor arguments, checked as data.

    ``_class_path`` must be one of ``allowed`` (spelling -> class), and a subclass of ``expected`` when given;
    without one the class is ``expected``. ``_instantiator`` must be LightningCLI's, and is dropped. The
    arguments are checked against the class's typed signature (:func:`check_arguments`; ``ignored``: former
    names, left out), or, with no class known, as plain data. :class:`SavedArgumentsError` names ``where``
    and the dotted key.
    """
    where = str(where)
    if section is None:
        section = {}
    section = plain_data(section, where, key) if not isinstance(section, Mapping) else dict(section)
    if not isinstance(section, dict):
        raise SavedArgumentsError(f"{where}: {key} is a {type(section).__name__}, not a mapping of constructor "
                                  "arguments; use a checkpoint written by visiontf's tools/train.py")
    instantiator = section.pop("_instantiator", None)
    if instantiator is not None and instantiator not in LIGHTNING_CLI_INSTANTIATORS:
        raise SavedArgumentsError(
            f"{where}: {key}._instantiator is {instantiator!r}, not Lightning's CLI instantiator; visiontf builds a "
            "checkpoint's classes itself and never calls what a file names, so the file was refused")
    cls = expected
    if "_class_path" in section:
        named = section.pop("_class_path")
        found = allowed.get(named) if isinstance(named, str) else None
        if found is None:
            shown = repr(named) if len(repr(named)) <= 120 else repr(named)[:117] + "..."
            raise SavedArgumentsError(
                f"{where}: {key}._class_path is {shown}, not a class visiontf knows (visiontf's task and data modules, "
                "and the classes your own config or call names); a checkpoint may name only those, so it was refused "
                "before anything it names was imported; use a checkpoint written by visiontf's tools/train.py")
        if expected is not None and not issubclass(found, expected):
            raise SavedArgumentsError(
                f"{where}: {key}._class_path names {found.__name__}, but {expected.__name__} is being built; load it "
                f"with {found.__name__} (or the config it was trained with)")
        cls = found
    if cls is None:
        return None, {k: plain_data(v, where, f"{key}.{k}") for k, v in section.items()
                      if isinstance(k, str) or _refuse_key(k, where, key)}
    return cls, check_arguments(cls, section, where, key, ignored=ignored)


def _refuse_key(k: Any, where: str, key: str) -> bool:
    raise SavedArgumentsError(f"{where}: {key} has the key {k!r}, where constructor arguments have names; use a "
                              "checkpoint written by visiontf's tools/train.py")


def load_lightning_checkpoint(cls: type, checkpoint_path: str | Path | IO[bytes], allowed: Mapping[str, type],
                              map_location: Any = None, hparams_file: str | Path | None = None,
                              strict: bool | None = None, ignored: Iterable[str] = (),
                              check_before_build: Callable[[dict, dict], None] | None = None, **overrides: Any) -> Any:
    """What Lightning's ``cls.load_from_checkpoint`` returns, with the hyper-parameters read as data.

    The class is ``cls`` or the subclass the file's ``_class_path`` names among ``allowed``; it is called with the
    checked hyper-parameters (a YAML ``hparams_file`` in their place, read with ``yaml.safe_load``) and
    ``overrides`` on top, then, for a LightningModule, ``configure_model``, ``on_load_checkpoint`` with the file
    as saved, and ``load_state_dict``, and it is moved to the device of the loaded weights, as Lightning does.
    A LightningDataModule gets its saved state. ``check_before_build(checkpoint, arguments)`` may refuse the file
    before anything is built (a higher layer's checks: the model its settings would build, against its weights).
    """
    import lightning.pytorch as pl
    from lightning.pytorch.core.saving import _default_map_location
    from lightning.pytorch.utilities.migration.utils import _pl_migrate_checkpoint
    from lightning.pytorch.utilities.model_helpers import is_overridden

    where = str(checkpoint_path) if isinstance(checkpoint_path, (str, Path)) else "the checkpoint"
    location = map_location or _default_map_location
    source = Path(checkpoint_path).expanduser() if isinstance(checkpoint_path, (str, Path)) else checkpoint_path
    checkpoint = safe_torch_load(source, map_location=location)
    if not isinstance(checkpoint, dict):
        raise SavedArgumentsError(f"{where}: holds a {type(checkpoint).__name__}, not a Lightning checkpoint")
    checkpoint = _pl_migrate_checkpoint(checkpoint, checkpoint_path=checkpoint_path if where != "the checkpoint" else None)
    section_key = cls.CHECKPOINT_HYPER_PARAMS_KEY
    section, source = checkpoint.get(section_key), where
    if hparams_file is not None:
        section, source = _read_hparams_file(hparams_file), str(hparams_file)
    built, arguments = saved_init_arguments(section, source, section_key, allowed, expected=cls, ignored=ignored)
    arguments.update(overrides)
    if check_before_build is not None:
        check_before_build(checkpoint, arguments)
    # the file's state dict replaces every weight (unless only what fits is asked for): no file to start from is read
    with weights_from_checkpoint() if strict is not False else contextlib.nullcontext():
        obj = (built or cls)(**arguments)
    if isinstance(obj, pl.LightningDataModule):
        state = checkpoint.get(type(obj).__qualname__)
        if state is not None:
            obj.load_state_dict(state)
        return obj
    if obj._strict_loading is not None and strict is not None and strict != obj.strict_loading:
        raise ValueError(f"load_from_checkpoint(..., strict={strict!r}) conflicts with "
                         f"{type(obj).__name__}.strict_loading={obj.strict_loading!r}; give the same value to both")
    strict = obj.strict_loading if strict is None else strict
    if is_overridden("configure_model", obj):
        obj.configure_model()
    obj.on_load_checkpoint(checkpoint)
    state_dict = checkpoint.get("state_dict")
    if state_dict is None:
        raise SavedArgumentsError(f"{where}: no 'state_dict'; not a Lightning checkpoint of {type(obj).__name__}")
    if not isinstance(state_dict, Mapping):
        raise WeightsError(f"{where}: 'state_dict' is a {type(state_dict).__name__}, not a mapping of tensor names to "
                           "tensors; not a Lightning checkpoint")
    # what the CLI and the other loaders refuse (NaN, integer, quantised, meta or sparse weights) is refused here too
    check_tensor_values(state_dict, obj, where)
    obj.load_state_dict(state_dict, strict=strict)
    device = next((t.device for t in state_dict.values() if isinstance(t, torch.Tensor)), None)
    return obj.to(device) if device is not None else obj


#: the fields of a checkpoint callback's state (Lightning's ``ModelCheckpoint``) that name files: the callback deletes
#: ``kth_best_model_path`` and ``last_model_path`` when it replaces them, reads ``best_model_path`` for
#: ``ckpt_path="best"``, and visiontf's W&B callback uploads ``best_model_path`` and ``last_model_path``
CHECKPOINT_PATH_FIELDS = ("best_model_path", "kth_best_model_path", "last_model_path")


def lies_under(path: str, folder: str) -> bool:
    """Whether ``path`` names something below ``folder`` as written: ``folder`` and a separator, then names only, no
    empty, ``.`` or ``..`` segment (``folder/../x`` is below ``folder`` for ``pathlib``'s parents, which Lightning
    checks, and ``folder//x`` joins to ``/x``). Local paths, URLs and paths written on Windows alike."""
    prefix = folder.rstrip("/\\")
    if not path.startswith(prefix) or path[len(prefix):len(prefix) + 1] not in ("/", "\\"):
        return False
    segments = path[len(prefix) + 1:].replace("\\", "/").split("/")
    return not any(segment in ("", ".", "..") for segment in segments)


def _is_score(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return value.numel() == 1 and not value.dtype.is_complex and value.dtype != torch.bool
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_callback_paths(checkpoint: Any, where: str | Path) -> None:
    """Refuse a checkpoint whose callback state names files outside that callback's own folder.

    Lightning restores a ``ModelCheckpoint``'s paths from the file when its ``dirpath`` is the run's, and on the
    next save deletes the restored ``kth_best_model_path`` and ``last_model_path``: a file could name any path
    (``<dirpath>/../../x`` passes Lightning's own check) and have it deleted. Every path a checkpoint callback
    writes lies under its ``dirpath``, so anything else is refused, naming the file and the field.

    Raises:
        WeightsError: a path field that is not a string, or names something outside the state's ``dirpath``; a score
            that is not a number; a k-th best path that is not among the best k.
    """
    callbacks = checkpoint.get("callbacks") if isinstance(checkpoint, Mapping) else None
    if not isinstance(callbacks, Mapping):
        return
    for key, state in callbacks.items():
        if not isinstance(state, Mapping) or not (set(state) & {"dirpath", "best_k_models", *CHECKPOINT_PATH_FIELDS}):
            continue

        def refuse(field: str, value: Any, why: str, key: Any = key) -> WeightsError:
            return WeightsError(f"{where}: callbacks[{short_repr(key)}].{field} is {short_repr(value)}, {why}: use a "
                                "checkpoint written by visiontf's tools/train.py")

        best_k = state.get("best_k_models")
        if best_k is not None and not isinstance(best_k, Mapping):
            raise refuse("best_k_models", best_k, "not a mapping of checkpoint paths to scores")
        best_k = best_k or {}
        # the scores Lightning compares a new one with (a string or a list fails there with a bare TypeError)
        scores = [(f"best_k_models[{short_repr(k)}]", v) for k, v in best_k.items()]
        scores += [(field, state.get(field)) for field in ("best_model_score", "kth_value", "current_score")]
        for field, score in scores:
            if score is not None and not _is_score(score):
                raise refuse(field, score, "not a score (a number)")
        kth = state.get("kth_best_model_path")
        if best_k and kth and kth not in best_k:
            raise refuse("kth_best_model_path", kth, "not one of its best_k_models")
        folder = state.get("dirpath")
        named = [(field, state.get(field)) for field in CHECKPOINT_PATH_FIELDS] + [("best_k_models", p) for p in best_k]
        for field, path in named:
            if path is None or path == "":
                continue
            if not isinstance(path, str):
                raise refuse(field, path, "not a path")
            if not isinstance(folder, str) or not folder or not lies_under(path, folder):
                raise refuse(field, path, f"outside the checkpoint folder {short_repr(folder)} the callback writes in; a "
                             "checkpoint callback names only files in its own folder, and Lightning deletes the files "
                             "these fields name when it replaces them, so the file is refused")


def _read_hparams_file(path: str | Path) -> Any:
    import yaml

    path = Path(path)
    if path.suffix.lower() not in (".yaml", ".yml"):
        raise SavedArgumentsError(f"hparams_file={path}: give a .yaml or .yml file of the hyper-parameters")
    try:
        return yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise SavedArgumentsError(f"hparams_file={path}: not readable as YAML ({str(e).splitlines()[0]})") from e


__all__ = ["CHECKPOINT_PATH_FIELDS", "LIGHTNING_CLI_INSTANTIATORS", "check_callback_paths", "class_spellings",
           "lies_under", "load_lightning_checkpoint", "saved_init_arguments", "spelled"]
