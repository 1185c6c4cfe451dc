"""Progress on long work: a tqdm bar with an estimate, and one switch for every tool's ``--quiet``.

Prediction over many images, IPT's tiles of a large one, anything that can take minutes shows how far it
is and how long it has left, as Lightning's own bar does for training and evaluation. The tools set the
switch (:func:`set_progress`): on, or off with ``--quiet``. Left unset (the Python API), a bar appears on a
terminal and nothing is written to a log file or a captured stream (tqdm's own choice).
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

_enabled: bool | None = None


def set_progress(enabled: bool | None) -> None:
    """Show progress bars (True), never (False, ``--quiet``), or on a terminal only (None, the default)."""
    global _enabled
    _enabled = enabled


def progress(iterable: Iterable[Any] | None = None, *, total: int | None = None, desc: str | None = None,
             unit: str = "it", leave: bool = True) -> Any:
    """A tqdm bar over ``iterable`` (or one to ``update`` by hand, with ``total``), as :func:`set_progress` says."""
    from tqdm.auto import tqdm

    disable = None if _enabled is None else not _enabled
    return tqdm(iterable, total=total, desc=desc, unit=unit, leave=leave, disable=disable, dynamic_ncols=True)


__all__ = ["progress", "set_progress"]
