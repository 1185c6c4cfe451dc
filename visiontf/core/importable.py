"""The packages a file a user loads may make visiontf import classes from, and the user's own, admitted by the
environment only (:mod:`visiontf.cli.config_imports` applies them to configs, :class:`visiontf.tasks.fsdp.FSDPStrategy`
to the block classes it wraps).
"""
from __future__ import annotations

import os
import sys

from visiontf.core.errors import UsageError

#: the packages whose classes a config may name: visiontf's tasks, data modules and callbacks; Lightning's callbacks,
#: loggers, strategies, profilers and plugins
IMPORTABLE = ("visiontf", "lightning.pytorch", "lightning.fabric", "pytorch_lightning", "lightning_fabric")
#: the environment variable that admits the user's own packages (comma-separated import paths)
IMPORTABLE_ENV = "VISIONTF_IMPORTABLE"
#: modules under :data:`IMPORTABLE` that no config names: command lines and the functions that import by name
NOT_IMPORTABLE = ("lightning.pytorch.cli", "lightning.fabric.cli", "pytorch_lightning.cli", "lightning_fabric.cli",
                  "visiontf.cli", "visiontf.tasks.task_table", "visiontf.core")


def importable() -> list[str]:
    """:data:`IMPORTABLE` and the import paths :data:`IMPORTABLE_ENV` adds; a malformed entry is refused, naming it."""
    added = [entry.strip() for entry in os.environ.get(IMPORTABLE_ENV, "").split(",") if entry.strip()]
    for entry in added:
        if not all(part.isidentifier() for part in entry.split(".")):
            raise UsageError(f"{IMPORTABLE_ENV}={os.environ[IMPORTABLE_ENV]!r}: {entry!r} is not an import path; give "
                             "package or module names separated by commas (my_project,my_project.callbacks)")
    return [*IMPORTABLE, *added]


def check_importable(path: str, where: str, imported_roots: tuple[str, ...] = ()) -> None:
    """Refuse an import path outside :func:`importable`, or inside :data:`NOT_IMPORTABLE`, naming ``where`` it was
    written; a path under ``imported_roots`` (torch's, timm's blocks) passes only when its module is already imported,
    so nothing new is imported for it. Nothing is imported here."""
    def under(prefixes: tuple[str, ...] | list[str]) -> bool:
        return any(path == p or path.startswith(p + ".") for p in prefixes)

    if under(NOT_IMPORTABLE):
        allowed = False
    elif under(importable()):
        allowed = True
    else:
        allowed = under(imported_roots) and path.rpartition(".")[0] in sys.modules
    if not allowed:
        roots = f", or a class of {', '.join(imported_roots)} already imported" if imported_roots else ""
        raise UsageError(f"{where}: {path} is not a class of {', '.join(importable())}{roots}; a file may name only "
                         f"those, so nothing else it names is imported; a package of your own: set {IMPORTABLE_ENV}="
                         "PACKAGE in the environment")


__all__ = ["IMPORTABLE", "IMPORTABLE_ENV", "NOT_IMPORTABLE", "check_importable", "importable"]
