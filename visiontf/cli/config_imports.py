"""What a config file may make jsonargparse import: visiontf's classes and Lightning's, nothing else.

Why: a config is a file users load, not only write (a run's ``config.yaml`` beside a checkpoint someone shared is
what ``tools/eval.py`` is given). LightningCLI builds what a config's ``class_path`` names, and jsonargparse imports
the module of a class path before it checks the class's type; a class specification under an ``Any``-typed value
(``model.init_args.model_kwargs``) was built as well, whatever it named (``{class_path: subprocess.Popen, init_args:
{args: ..., shell: true}}`` ran its command). So every parser of visiontf's tools takes jsonargparse's own import
policy (``set_parsing_settings``): every import path a value names is denied but those under :data:`IMPORTABLE`,
and a class specification under ``Any`` stays a mapping, never built (visiontf's task arguments are plain data
and typed option groups: one there is then refused by the model's checks, naming its key).

Short names (``CocoDataModule``, ``ModelEMA``) resolve among the classes already imported, as before. A user's own
package (a callback of their project) is admitted by the environment, never by a file:
``VISIONTF_IMPORTABLE=my_project,other`` adds those import paths.
"""
from __future__ import annotations

import os
import re

#: the packages whose classes a config may name: visiontf's tasks, data modules and callbacks; Lightning's callbacks,
#: loggers, strategies, profilers and plugins
IMPORTABLE = ("visiontf", "lightning.pytorch", "lightning.fabric", "pytorch_lightning", "lightning_fabric")
#: the environment variable that admits the user's own packages (comma-separated import paths)
IMPORTABLE_ENV = "VISIONTF_IMPORTABLE"


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
    written = next((m["written"] for m in map(_WRITTEN.search, chain) if m), denied["path"])
    named = f"class path {written}" if written == denied["path"] else f"class path {written} (that is {denied['path']})"
    return (f"{'--' + key + ': ' if key else ''}{named} is not a class of visiontf or Lightning; a config may name only "
            f"those ({', '.join(importable())}), so nothing else it names is imported; use a visiontf task, data module "
            f"or callback, or a Lightning callback, logger or strategy; a package of your own: set "
            f"{IMPORTABLE_ENV}=PACKAGE in the environment")


def importable() -> list[str]:
    """:data:`IMPORTABLE` and the import paths :data:`IMPORTABLE_ENV` adds; a malformed entry is refused, naming it."""
    from visiontf.core.errors import UsageError

    added = [entry.strip() for entry in os.environ.get(IMPORTABLE_ENV, "").split(",") if entry.strip()]
    for entry in added:
        if not all(part.isidentifier() for part in entry.split(".")):
            raise UsageError(f"{IMPORTABLE_ENV}={os.environ[IMPORTABLE_ENV]!r}: {entry!r} is not an import path; give "
                             "package or module names separated by commas (my_project,my_project.callbacks)")
    return [*IMPORTABLE, *added]


def restrict_config_imports() -> None:
    """Set jsonargparse's import policy for this process: deny all but :func:`importable`, never build a class
    specification found under an ``Any``-typed value. (jsonargparse only adds entries: a package admitted once stays
    admitted in this process.)"""
    from jsonargparse import set_parsing_settings

    set_parsing_settings(import_path_denylist=["*"], import_path_allowlist=importable(),
                         instantiate_subclass_spec_in_any=False, validate_subclass_spec_in_any=False)


__all__ = ["IMPORTABLE", "IMPORTABLE_ENV", "denied_import_message", "importable", "restrict_config_imports"]
