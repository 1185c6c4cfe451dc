"""Every name a package exports lazily (visiontf/core/lazy.py, a ``_LAZY`` table) resolves to the object its
module defines: a name left behind when a function moves is an AttributeError only on first use.

Cost: imports every package once; a few seconds.
"""
from __future__ import annotations

import ast
from importlib import import_module
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _lazy_tables() -> dict[str, dict[str, str]]:
    """``{package: its _LAZY table}`` read from the source, so a package is found without importing it."""
    tables = {}
    for init in sorted((ROOT / "visiontf").rglob("__init__.py")):
        for node in ast.parse(init.read_text()).body:
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "_LAZY" for t in node.targets):
                package = ".".join(init.parent.relative_to(ROOT).parts)
                tables[package] = ast.literal_eval(node.value)
    return tables


TABLES = _lazy_tables()


def test_the_lazy_tables_are_found():
    assert {"visiontf", "visiontf.cli", "visiontf.tasks.detection"} <= set(TABLES)


@pytest.mark.parametrize("package", sorted(TABLES))
def test_every_lazy_name_resolves_to_its_modules_object(package):
    for name, module in TABLES[package].items():
        value = getattr(import_module(package), name)
        assert value is getattr(import_module(module), name), f"{package}.{name}"
        assert name in import_module(package).__all__, f"{package}.{name} not in __all__"
