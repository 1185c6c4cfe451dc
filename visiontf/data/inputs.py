"""The Predictor's inputs: any image form in, batches of float images out, streamed.

Files are listed first and decoded only when their batch comes, in DataLoader workers (uint8, a
quarter of the float size), so memory does not grow with the number of files: at any time the
loader holds ``batch_size x (prefetch + 1)`` decoded images per worker, and the Predictor one float
batch. In-memory inputs (PIL images, numpy arrays, tensors) are converted batch by batch too.

Two kinds of bad input:

* the wrong *form* (an unsupported type, floats outside [0, 1], 2 channels): ``ValueError`` /
  ``TypeError`` at once, as before: the call is wrong;
* an image that cannot be predicted (an unreadable or empty file, a broken symbolic link, a side of
  0 pixels, NaN or infinite values): an :class:`InputFailure` for *that* image, naming it; the other
  images still run (the Predictor returns ``{"source", "error"}`` for it and logs a warning).
"""
from __future__ import annotations

import logging
import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from visiontf.core.errors import UserError
from visiontf.data.loading import IMAGE_EXTENSIONS

log = logging.getLogger(__name__)


class InputError(UserError, ValueError):
    """One input image cannot be predicted (no pixels, non-finite values); the message names it."""


@dataclass
class LoadedImage:
    """An input image as float (3, H, W) in [0, 1] and where it came from (a path or ``None``)."""

    tensor: Tensor
    source: str | None = None

    @property
    def size(self) -> tuple[int, int]:
        return int(self.tensor.shape[-2]), int(self.tensor.shape[-1])

    def uint8(self) -> Tensor:
        """The image as uint8 (3, H, W), for drawing."""
        return (self.tensor * 255.0).round().clamp(0, 255).to(torch.uint8)


@dataclass
class InputFailure:
    """An input that could not be turned into an image (see the module docstring): ``what`` names it
    (its path, or ``tensor[3]``), ``error`` says why."""

    what: str
    error: str
    source: str | None = None
    exception: Exception | None = None


# ---------------------------------------------------------------------------------------- listing
def list_image_files(folder: str | Path) -> list[Path]:
    """Image files directly inside ``folder``, sorted by name; broken symbolic links (a loop of them too) and entries
    named as images that are no regular files (a FIFO, a socket) are kept, so that they are reported as failed inputs
    instead of vanishing (they are never opened)."""
    folder = Path(folder)
    entries = sorted(folder.iterdir())
    files = [p for p in entries if p.suffix.lower() in IMAGE_EXTENSIONS and not p.is_dir()]
    skipped = [p.name for p in entries if p.is_file() and p.suffix.lower() not in IMAGE_EXTENSIONS]
    if skipped:
        log.info("%s: %d non-image files skipped (e.g. %s)", folder, len(skipped), skipped[:3])
    broken = [p.name for p in files if not p.is_file()]
    if broken:
        log.warning("%s: %d broken symbolic link(s) or entries that are no regular files (e.g. %s); reported as failed "
                    "inputs", folder, len(broken), broken[:3])
    if not files:
        raise FileNotFoundError(f"{folder}: no image files ({', '.join(IMAGE_EXTENSIONS)}) in this folder")
    return files


@dataclass
class _Item:
    obj: Any  # a Path, or an in-memory image (PIL, numpy HxWxC, tensor CxHxW)
    what: str
    source: str | None


def expand_inputs(inputs: Any) -> list[_Item]:
    """A flat list of the images in ``inputs`` without decoding any (see :func:`load_inputs` for the forms)."""
    from PIL import Image

    if isinstance(inputs, (str, Path)):
        path = Path(inputs)
        if path.is_dir():
            return [_Item(p, str(p), str(p)) for p in list_image_files(path)]
        return [_Item(path, str(path), str(path))]
    if isinstance(inputs, LoadedImage):
        return [_Item(inputs.tensor, inputs.source or "image", inputs.source)]
    if isinstance(inputs, Image.Image):
        return [_Item(inputs, "PIL image", None)]
    if isinstance(inputs, np.ndarray):
        if inputs.ndim == 4:
            return [_Item(a, f"array[{i}]", None) for i, a in enumerate(inputs)]
        return [_Item(inputs, "numpy image", None)]
    if isinstance(inputs, Tensor):
        t = inputs.detach()
        if t.dim() == 4:
            return [_Item(x, f"tensor[{i}]", None) for i, x in enumerate(t)]
        if t.dim() == 3:
            return [_Item(t, "tensor", None)]
        if t.dim() == 2:
            return [_Item(t[None], "tensor", None)]
        raise ValueError(f"tensor inputs must be (C, H, W) or (B, C, H, W), got shape {tuple(t.shape)}")
    if isinstance(inputs, (list, tuple)):
        out: list[_Item] = []
        for item in inputs:
            out.extend(expand_inputs(item))
        return out
    raise TypeError(
        f"unsupported input type {type(inputs).__name__}; pass a path, a folder, PIL images, numpy HxWxC arrays "
        "or (B,)C,H,W tensors, or a list of them"
    )


# ---------------------------------------------------------------------------------------- decoding
def _from_array(arr: np.ndarray, what: str) -> Tensor:
    if arr.ndim == 2:
        arr = arr[..., None]
    if arr.ndim != 3 or arr.shape[-1] not in (1, 3, 4):
        raise ValueError(f"{what}: numpy images must be HxW or HxWxC with C in 1/3/4, got shape {arr.shape}")
    if arr.shape[-1] == 4:
        log.info("%s: alpha channel dropped", what)
        arr = arr[..., :3]
    # a private copy: inputs may be read-only (PIL buffers) and must not be changed in place
    return _checked(torch.from_numpy(np.array(arr, copy=True)).permute(2, 0, 1), what)


def _checked(t: Tensor, what: str) -> Tensor:
    """``t`` as (3, H, W) uint8 or float in [0, 1], on the CPU; format errors raise ValueError, content
    errors (no pixels, non-finite values) :class:`InputError`."""
    t = t.detach().cpu()
    if t.shape[0] == 1:
        t = t.expand(3, -1, -1)
    if t.shape[0] != 3:
        raise ValueError(f"{what}: expected 1 or 3 channels first (C, H, W), got shape {tuple(t.shape)}")
    if t.shape[-2] == 0 or t.shape[-1] == 0:
        raise InputError(f"{what}: image of {t.shape[-1]}x{t.shape[-2]} pixels (WxH) has nothing to predict")
    if t.dtype == torch.uint8:
        return t
    if not t.is_floating_point():
        raise ValueError(f"{what}: integer images must be uint8 (0-255), got {t.dtype}")
    t = t.float()
    finite = torch.isfinite(t)
    if not bool(finite.all()):
        n = int((~finite).sum())
        raise InputError(f"{what}: {n} of {t.numel()} values are NaN or infinite; the image cannot be predicted "
                         "(check the code that produced it)")
    if t.min() < -1e-3 or t.max() > 1.0 + 1e-3:
        raise ValueError(
            f"{what}: float images must hold values in [0, 1], got [{float(t.min()):.3g}, {float(t.max()):.3g}]; "
            "pass uint8 0-255 or divide by 255 (do not normalise: the Predictor does that)"
        )
    return t


def _to_float(t: Tensor) -> Tensor:
    return t.float() / 255.0 if t.dtype == torch.uint8 else t


def decode(item: _Item) -> Tensor:
    """The (3, H, W) uint8 or float tensor of one input (files decoded here)."""
    from PIL import Image

    from visiontf.data.io import read_image

    obj = item.obj
    if isinstance(obj, Path):
        return _from_array(read_image(obj), item.what)
    if isinstance(obj, Image.Image):
        return _from_array(np.asarray(obj.convert("RGB")), item.what)
    if isinstance(obj, np.ndarray):
        return _from_array(obj, item.what)
    return _checked(obj, item.what)


class _Decoded(Dataset):
    """Decodes one input per item; a content error becomes an :class:`InputFailure` (in the worker)."""

    def __init__(self, items: Sequence[_Item]) -> None:
        self.items = list(items)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> Tensor | InputFailure:
        item = self.items[i]
        try:
            return decode(item)
        except UserError as e:  # ImageReadError, InputError: this image only
            return InputFailure(item.what, str(e), item.source, e)


def _workers(items: Sequence[_Item], batch_size: int, num_workers: int | None) -> int:
    if not all(isinstance(it.obj, Path) for it in items):
        return 0  # in-memory inputs are already here: no process would make them faster
    if num_workers is not None:
        return max(0, int(num_workers))
    if len(items) <= batch_size:
        return 0  # one batch: starting workers costs more than it saves
    return min(4, os.cpu_count() or 1, math.ceil(len(items) / batch_size))


def iter_batches(inputs: Any, batch_size: int, num_workers: int | None = None
                 ) -> Iterator[list[LoadedImage | InputFailure]]:
    """Batches of ``inputs`` in order: each item a :class:`LoadedImage` (float, [0, 1]) or an
    :class:`InputFailure`. Files are decoded by ``num_workers`` DataLoader workers (default: up to 4
    when there is more than one batch of files)."""
    items = inputs if isinstance(inputs, list) and all(isinstance(i, _Item) for i in inputs) else expand_inputs(inputs)
    if not items:
        return
    workers = _workers(items, batch_size, num_workers)
    loader = DataLoader(_Decoded(items), batch_size=batch_size, shuffle=False, num_workers=workers,
                        collate_fn=list, persistent_workers=False)
    start = 0
    for decoded in loader:
        batch: list[LoadedImage | InputFailure] = []
        for item, x in zip(items[start : start + len(decoded)], decoded):
            batch.append(x if isinstance(x, InputFailure) else LoadedImage(_to_float(x), item.source))
        start += len(decoded)
        yield batch


def load_inputs(inputs: Any) -> list[LoadedImage]:
    """Turn any supported input into a flat list of images, all decoded (for a few images; the
    Predictor streams instead).

    Accepts a path (file or folder), a list of any of these, PIL images, numpy HxWxC uint8 (or float
    0-1) arrays, and CHW / BCHW tensors (uint8 0-255 or float 0-1). An image that cannot be used
    raises (:class:`InputError`, ``ImageReadError``).
    """
    return [LoadedImage(_to_float(decode(item)), item.source) for item in expand_inputs(inputs)]


__all__ = ["InputError", "InputFailure", "LoadedImage", "decode", "expand_inputs", "iter_batches", "list_image_files",
           "load_inputs"]
