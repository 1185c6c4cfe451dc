"""What a config file may make jsonargparse import: visiontf's classes and Lightning's, nothing else.

Why: a config is a file users load, not only write (a run's ``config.yaml`` beside a checkpoint someone shared is
what ``tools/eval.py`` is given). LightningCLI builds what a config's ``class_path`` names, and jsonargparse imports
the module of a class path before it checks the class's type; a class specification under an ``Any``-typed value
(``model.init_args.model_kwargs``) was built as well, whatever it named (``{class_path: subprocess.Popen, init_args:
{args: ..., shell: true}}`` ran its command). So every parser of visiontf's tools takes jsonargparse's own import
policy (``set_parsing_settings``): every import path a value names is denied but those under :data:`IMPORTABLE`
(less :data:`NOT_IMPORTABLE`, modules of functions and command lines), and a class specification under ``Any`` stays
a mapping, never built.

jsonargparse also takes a class path naming a *function* for a ``Callable``-typed parameter (a Lightning callback's
hooks, a strategy's functions) and calls it with the given arguments when the classes are built: allowed packages hold
functions that import or run what they are given (``lightning.pytorch.cli.instantiate_class``). So once a config is
parsed, before anything is built, :func:`refuse_code_in_config` walks all of it, and refuses, naming the key: a class
path that names no class, or a class that is no component a config builds (a task, data module, callback, logger,
strategy, accelerator, profiler, plugin, or visiontf option group); a function or module a dotted string named; a
class specification written as plain values (under ``Any``, or a mapping jsonargparse did not read as one); and an
import path outside the packages above in an argument a class declares as one (``import_path_arguments``).

Short names (``CocoDataModule``, ``ModelEMA``) resolve among the classes already imported, as before. A user's own
package (a callback of their project) is admitted by the environment, never by a file:
``VISIONTF_IMPORTABLE=my_project,other`` adds those import paths.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import inspect
import re
import sys
from typing import Any

from visiontf.core.errors import UsageError
from visiontf.core.importable import IMPORTABLE, IMPORTABLE_ENV, NOT_IMPORTABLE, check_importable, importable
from visiontf.core.saved_arguments import CLASS_SPEC_KEYS, class_reference

_DENIED = re.compile(r"Importing '(?P<path>[\w.]+)' is not allowed")
_KEY = re.compile(r'Parser key "(?P<key>[\w.]+)"')
_WRITTEN = re.compile(r"given class_path '(?P<written>[\w.]+)'")


def denied_import_message(error: BaseException) -> str | None:
    """jsonargparse's refusal of a class path under :func:`restrict_config_imports` (its own fix is a call no
    config can make) in visiontf's words, naming the option and the class path; None when ``error``'s chain holds
    no such refusal."""
    chain, seen, current = [], set(), error
    while current is not None and id(current) not in seen:
        chain.append(str(current))
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    denied = next((m for m in map(_DENIED.search, chain) if m), None)
    if denied is None:
        return None
    key = next((m["key"] for m in map(_KEY.search, chain) if m), None)
    # the innermost class path the chain names is the one refused (an outer one is the callback holding it)
    written = [m["written"] for m in map(_WRITTEN.search, chain) if m]
    written = written[-1] if written else denied["path"]
    named = f"class path {denied['path']}" + ("" if written == denied["path"] else f" (reached through {written})")
    return (f"{'--' + key + ': ' if key else ''}{named} is not a class of visiontf or Lightning; a config may name only "
            f"those ({', '.join(importable())}), so nothing else it names is imported; use a visiontf task, data module "
            f"or callback, or a Lightning callback, logger or strategy; a package of your own: set "
            f"{IMPORTABLE_ENV}=PACKAGE in the environment")


def restrict_config_imports() -> None:
    """Set jsonargparse's import policy for this process: deny all but :func:`importable`, never build a class
    specification found under an ``Any``-typed value. (jsonargparse only adds entries: a package admitted once stays
    admitted in this process.)"""
    from jsonargparse import set_parsing_settings

    set_parsing_settings(import_path_denylist=["*", *NOT_IMPORTABLE], import_path_allowlist=importable(),
                         instantiate_subclass_spec_in_any=False, validate_subclass_spec_in_any=False)


def _class_named(class_path: str) -> type | None:
    """The class ``class_path`` names, looked up among the modules already imported (the parser imported what a
    config's class paths name, under the policy), or None: never imported here."""
    module, _, name = class_path.rpartition(".")
    found = getattr(sys.modules.get(module), name, None)
    return found if inspect.isclass(found) else None


@functools.lru_cache(maxsize=1)
def _component_bases() -> tuple[type, ...]:
    """What a config builds: Lightning's tasks, data modules, callbacks, loggers, strategies, accelerators, profilers
    and plugins (visiontf's derive from them)."""
    from lightning.fabric.plugins.environments import ClusterEnvironment
    from lightning.fabric.plugins.io import CheckpointIO
    from lightning.pytorch import Callback, LightningDataModule, LightningModule
    from lightning.pytorch.accelerators import Accelerator
    from lightning.pytorch.loggers import Logger
    from lightning.pytorch.plugins import LayerSync, Precision
    from lightning.pytorch.profilers import Profiler
    from lightning.pytorch.strategies import Strategy

    return (LightningModule, LightningDataModule, Callback, Logger, Strategy, Accelerator, Profiler, Precision,
            ClusterEnvironment, CheckpointIO, LayerSync)


def _a_component(cls: type) -> bool:
    """A class a config may build: a subclass of :func:`_component_bases`, or one of visiontf's option groups (its
    dataclasses: a typed section of a task's arguments)."""
    if issubclass(cls, _component_bases()):
        return True
    return dataclasses.is_dataclass(cls) and (cls.__module__ == "visiontf" or cls.__module__.startswith("visiontf."))


def _import_path_arguments(cls: type, init_args: Any, key: str) -> str | None:
    """The refusal of an import path outside :func:`importable` in the arguments ``cls`` declares as import paths
    (``import_path_arguments``, e.g. FSDPStrategy's ``wrap_modules``), checked before the class imports them."""
    for name in getattr(cls, "import_path_arguments", ()):
        value = getattr(init_args, name, None) if init_args is not None else None
        for i, path in enumerate([value] if isinstance(value, str) else list(value or ())):
            try:
                check_importable(str(path), f"{key}.init_args.{name}[{i}]",
                                 imported_roots=tuple(getattr(cls, "imported_roots", ())))
            except UsageError as e:
                return str(e)
    return None


def code_in_config(value: Any, key: str = "") -> str | None:
    """Where a parsed config (jsonargparse's namespace) holds something that would import or call what a file names,
    and what: a class path that names no class, or a class specification written as plain values; None when
    nothing does. jsonargparse's namespaces are the typed structure it built (an option group, a callback: each with
    its class path), the plain mappings, lists and strings in them are what the file wrote."""
    if isinstance(value, argparse.Namespace):
        class_path = getattr(value, "class_path", None)
        if isinstance(class_path, str):
            cls = _class_named(class_path)
            if cls is None:
                return (f"{key}.class_path: {class_path} is not a class (a function or a module); a config names classes "
                        "only, so nothing it names is called")
            if not _a_component(cls):
                return (f"{key}.class_path: {class_path} is not a component a config builds (a task, data module, "
                        "callback, logger, strategy, accelerator, profiler, plugin, or one of visiontf's option groups), "
                        "so it is not built")
            found = _import_path_arguments(cls, getattr(value, "init_args", None), key)
            if found is not None:
                return found
        items = [(f"{key}.{k}" if key else k, v) for k, v in vars(value).items()]
    elif isinstance(value, (list, tuple)):
        items = [(f"{key}[{i}]", v) for i, v in enumerate(value)]
    elif isinstance(value, dict):
        spec = sorted(CLASS_SPEC_KEYS & set(value))
        if spec:
            return (f"{key}.{spec[0]}: a class specification written as plain values, so nothing it names is imported "
                    "or built; write the setting as plain values (an option group's fields as a mapping)")
        items = [(f"{key}.{k}", v) for k, v in value.items()]
    elif inspect.ismodule(value) or inspect.isroutine(value) or isinstance(value, functools.partial):
        # a dotted string given for a Callable-typed parameter: jsonargparse imported the function, Lightning calls it
        name = getattr(value, "__qualname__", None) or getattr(value, "__name__", repr(value))
        return (f"{key}: {getattr(value, '__module__', '')}.{name} is a function or a module; a config names classes "
                "only, so nothing it names is called")
    else:
        found = class_reference(value)
        return None if found is None else (
            f"{key}{found}: a class specification written in a string, so nothing it names is imported or built; "
            "write the setting as plain values")
    for where, v in items:
        found = code_in_config(v, where)
        if found is not None:
            return found
    return None


class CodeInConfigError(UsageError):
    """A parsed config holds what would import or call what the file names (:func:`code_in_config`)."""


def refuse_code_in_config(config: Any) -> None:
    """Raise :class:`CodeInConfigError` with :func:`code_in_config`'s finding, if any."""
    found = code_in_config(config)
    if found is not None:
        raise CodeInConfigError(found)


__all__ = ["IMPORTABLE", "IMPORTABLE_ENV", "NOT_IMPORTABLE", "CodeInConfigError", "code_in_config", "denied_import_message", "importable",
           "refuse_code_in_config", "restrict_config_imports"]
