"""Writing a file so that a file under its name is always complete: ``atomic_save``.

``atomic_save`` writes ``torch.save`` output to a temporary file *in the destination folder*,
flushes and fsyncs it, renames it over the destination with ``os.replace`` (atomic on POSIX within
one filesystem) and fsyncs the folder. So:

* a reader sees the previous file or the new one, never a partial one;
* a failed write (``ENOSPC``, an exception while serialising) removes its temporary file and leaves
  the previous file untouched;
* a process killed while writing (SIGKILL, OOM killer, preemption) leaves at most one temporary
  file beside the destination, never a partial file under its name; the next save into that folder
  removes it (:func:`remove_stale_temporaries`).

No Lightning here (a process that only writes checkpoints starts fast); the Lightning plugin that
uses it is :class:`visiontf.callbacks.checkpoint_io.AtomicCheckpointIO`.
"""
from __future__ import annotations

import logging
import os
import re
import secrets
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)

#: temporary files are ``.<name>.<random>.tmp``: hidden, and not ``*.ckpt``, so neither Lightning's
#: ``last*.ckpt`` search nor a glob for checkpoints ever picks one up
_TMP_SUFFIX = ".tmp"


def _temporary_name(dest: Path) -> Path:
    return dest.with_name(f".{dest.name}.{secrets.token_hex(4)}{_TMP_SUFFIX}")


def _is_temporary_of(path: Path, dest: Path | None) -> bool:
    name = re.escape(dest.name) if dest is not None else ".+"
    return re.fullmatch(rf"\.{name}\.[0-9a-f]{{8}}{re.escape(_TMP_SUFFIX)}", path.name) is not None


def remove_stale_temporaries(dest: str | Path, every_name: bool = False) -> list[Path]:
    """Delete the temporary files an interrupted :func:`atomic_save` of ``dest`` left beside it; with
    ``every_name``, those of every file in ``dest``'s folder (a writer that starts in a run folder:
    a killed run's write of ``epoch002-step000100.ckpt`` is never saved under that name again)."""
    dest = Path(dest)
    removed = []
    if dest.parent.is_dir():
        for p in dest.parent.iterdir():
            if _is_temporary_of(p, None if every_name else dest):
                p.unlink(missing_ok=True)
                removed.append(p)
    if removed:
        log.info("%s: removed %d temporary file(s) of an interrupted write", dest.parent, len(removed))
    return removed


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # some filesystems do not open folders; the rename is still atomic
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _os_error_in_chain(error: BaseException) -> OSError | None:
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, OSError):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def atomic_save(obj: Any, path: str | Path) -> Path:
    """``torch.save(obj)`` to ``path`` all or nothing (see the module docstring).

    On failure the temporary file is removed and the previous ``path`` (if any) is unchanged; a
    failure of the filesystem (a full disk, also when torch reports it as a ``RuntimeError`` of its
    zip writer) is raised as an ``OSError`` with its errno that names the checkpoint and says so.
    """
    dest = Path(path)
    dest.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(dest)
    tmp = _temporary_name(dest)
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, dest)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        cause = _os_error_in_chain(e)
        if cause is None:
            raise
        # torch.save reports a full disk as a RuntimeError of its zip writer, with the OSError as context
        previous = "the previous file is unchanged" if dest.exists() else "there was no previous file"
        raise OSError(cause.errno, f"{cause.strerror or cause}: checkpoint {dest} was not written ({previous}; no "
                      "partial or temporary file was left)") from e
    _fsync_dir(dest.parent)
    return dest


__all__ = ["atomic_save", "remove_stale_temporaries"]
