"""Checks of the files and folders a command line names, before anything heavy is imported.

Each raises :class:`~visiontf.core.errors.UsageError` naming the option, the path and the fix, so a
mistyped path costs a second, not the ten it takes to import torch and Lightning. Standard library only.
"""
from __future__ import annotations

import zipfile
from collections.abc import Sequence
from pathlib import Path

from visiontf.core.errors import UsageError

__all__ = ["checkpoint_file", "input_paths", "output_folder", "weights_file"]

#: ``--ckpt_path`` values that Lightning resolves itself (tools/train.py)
LIGHTNING_CKPT_KEYWORDS = ("last", "best", "hpc")


def _is_registry(path: str) -> bool:
    """Lightning's spelling of its model registry (``registry`` or ``registry:NAME``); a file whose name starts
    with "registry" (``registry_runs/last.ckpt``) is a file, checked as the others."""
    return path == "registry" or path.startswith("registry:")


def _is_truncated_zip(path: Path) -> bool:
    """Starts like a zip archive (``torch.save``'s format) but has no readable directory: cut off."""
    with open(path, "rb") as f:
        return f.read(4) == b"PK\x03\x04" and not zipfile.is_zipfile(path)


def _is_torch_file(path: Path) -> bool:
    """A ``torch.save`` file: a zip archive (the default since torch 1.6) or a legacy pickle (protocol >= 2)."""
    if zipfile.is_zipfile(path):
        return True
    with open(path, "rb") as f:
        return f.read(1) == b"\x80"


def checkpoint_file(path: str | Path | None, option: str = "--ckpt_path", lightning_keywords: bool = False) -> Path | None:
    """The checkpoint file ``option`` names; refuses a missing file, a folder, an export and a non-torch file.

    With ``lightning_keywords`` (tools/train.py), ``last``/``best``/``hpc``/``registry:...`` and None
    pass through as None, for Lightning to resolve.
    """
    if lightning_keywords and (path is None or str(path) in LIGHTNING_CKPT_KEYWORDS or _is_registry(str(path))):
        return None
    if path is None:
        raise UsageError(f"{option} is required")
    p = Path(str(path))
    if p.is_dir():
        raise UsageError(f"{option} {p}: a folder; give the checkpoint file, e.g. {p / 'checkpoints' / 'last.ckpt'}")
    if not p.is_file():
        raise UsageError(f"{option} {p}: checkpoint not found")
    if p.suffix == ".safetensors":
        raise UsageError(f"{option} {p}: an exported model, not a Lightning checkpoint; predict with "
                         f"tools/predict.py --weights {p}, or train from it with --model.init_args.pretrained={p}")
    if _is_truncated_zip(p):
        raise UsageError(f"{option} {p}: corrupt or incomplete ({p.stat().st_size:,} bytes): a zip archive without "
                         "its directory (the write was cut off); use another checkpoint, e.g. the best one beside it")
    if not _is_torch_file(p):
        raise UsageError(f"{option} {p}: not a PyTorch checkpoint (tools/train.py writes .ckpt files under "
                         "<default_root_dir>/checkpoints/)")
    return p


def weights_file(path: str | Path, option: str = "--weights") -> Path:
    """An exported model file (``.safetensors`` from tools/export.py)."""
    p = Path(str(path))
    if p.suffix == ".ckpt":
        raise UsageError(f"{option} {p}: a Lightning checkpoint; give it as --ckpt_path {p}")
    if not p.is_file():
        raise UsageError(f"{option} {p}: file not found")
    return p


def input_paths(inputs: Sequence[str], option: str = "--input") -> None:
    """Every input exists (files or folders)."""
    missing = [i for i in inputs if not Path(i).exists()]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise UsageError(f"{option} {missing[0]}: no such file or folder{more}")


def output_folder(output: str | Path, option: str = "--output") -> Path:
    """A folder to write into (it may not exist yet), not a file."""
    out = Path(output)
    if out.exists() and not out.is_dir():
        raise UsageError(f"{option} {out}: a file; give a folder")
    return out
