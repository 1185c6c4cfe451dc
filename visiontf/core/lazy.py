"""Lazy package attributes (PEP 562), so light entry points never import torch or Lightning."""
from __future__ import annotations

from collections.abc import Callable
from importlib import import_module
from typing import Any


def lazy_getattr(package: str, names: dict[str, str], namespace: dict[str, Any]) -> Callable[[str], Any]:
    """A module ``__getattr__`` importing ``names[attr]`` on first use and caching it in ``namespace``."""

    def __getattr__(name: str) -> Any:
        if name in names:
            value = getattr(import_module(names[name]), name)
            namespace[name] = value
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
