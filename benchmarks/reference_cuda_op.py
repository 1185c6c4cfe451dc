"""The original's compiled CUDA op of multi-scale deformable attention, loaded from a folder given on the command line.

fundamentalvision/Deformable-DETR's ``models/ops`` (``MultiScaleDeformableAttention``; detrex, DINO and
mmcv carry the same kernel) is what the original Deformable DETR and DINO train with on a GPU. It
is a benchmark reference only: nothing here builds it or ships it (the repository's rule for fetched
code): a session that has a GPU builds it on that machine, outside the repository, and passes the folder
as ``--ref-op`` (``docs/benchmarks.md``, "GPU").

A folder is searched for, in order, a library per torch version (``torch-<version>/ms_deform_ref.so``:
the original's sources with its two entry points registered as ``torch.ops.ms_deform_ref.forward`` /
``backward``, loadable from any Python of that torch version), then the original's own Python
module (``torch-<version>/MultiScaleDeformableAttention*.so``, importable only by the Python version
that built it). :func:`load_reference_core` returns a core with the signature of
:func:`reference.deformable_detr.original_core`; :func:`routed_to` makes the reference
models call it, as the originals do on a GPU.
"""
from __future__ import annotations

import contextlib
import glob
import importlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from torch import Tensor

#: the original's MSDeformAttn passes 64 (models/ops/modules/ms_deform_attn.py)
IM2COL_STEP = 64


def _entry_points(folder: Path) -> tuple[Callable, Callable, str] | None:
    """(forward, backward, description) of the op built for this torch, or None."""
    version = torch.__version__.split("+")[0]
    lib = folder / f"torch-{version}" / "ms_deform_ref.so"
    if lib.is_file():
        torch.ops.load_library(str(lib))
        op = torch.ops.ms_deform_ref
        return op.forward, op.backward, str(lib)
    for module_file in glob.glob(str(folder / f"torch-{version}" / "MultiScaleDeformableAttention*.so")):
        sys.path.insert(0, str(Path(module_file).parent))
        try:
            module = importlib.import_module("MultiScaleDeformableAttention")
        except ImportError:
            continue  # built by another Python version
        return module.ms_deform_attn_forward, module.ms_deform_attn_backward, module_file
    return None


def describe(folder: str | Path | None) -> str:
    """Which file :func:`load_reference_core` would use, or why there is none (the table's note)."""
    if folder is None:
        return "no --ref-op folder given"
    folder = Path(folder)
    if not folder.is_dir():
        return f"--ref-op {folder}: no such folder"
    found = _entry_points(folder)
    versions = sorted(p.name for p in folder.glob("torch-*"))
    return found[2] if found else f"--ref-op {folder}: nothing built for torch {torch.__version__} (has {versions})"


def load_reference_core(folder: str | Path | None) -> Callable[..., Tensor] | None:
    """The original op as a core ``(value, spatial_shapes, locations, weights) -> (N, Lq, M*D)``, or None.

    As detrex and the DINO code do under mixed precision, half-precision inputs are cast to float32
    (the op's kernels dispatch on float and double only) and the output back to the value's dtype.
    """
    if folder is None or not Path(folder).is_dir():
        return None
    found = _entry_points(Path(folder))
    if found is None:
        return None
    forward, backward, _ = found

    class _OriginalFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, value, shapes, start, loc, attn):
            ctx.save_for_backward(value, shapes, start, loc, attn)
            return forward(value, shapes, start, loc, attn, IM2COL_STEP)

        @staticmethod
        @torch.autograd.function.once_differentiable
        def backward(ctx, grad):
            value, shapes, start, loc, attn = ctx.saved_tensors
            g_value, g_loc, g_attn = backward(value, shapes, start, loc, attn, grad.contiguous(), IM2COL_STEP)
            return g_value, None, None, g_loc, g_attn

    tables: dict = {}  # (shapes, device) -> the op's spatial_shapes and level_start_index, made once

    def core(value: Tensor, spatial_shapes, sampling_locations: Tensor, attention_weights: Tensor) -> Tensor:
        key = (tuple((int(h), int(w)) for h, w in spatial_shapes), value.device)
        if key not in tables:
            shapes = torch.tensor(key[0], dtype=torch.long, device=value.device)
            tables[key] = shapes, torch.cat([shapes.new_zeros(1), (shapes[:, 0] * shapes[:, 1]).cumsum(0)[:-1]])
        shapes, start = tables[key]
        dtype = value.dtype
        out = _OriginalFunction.apply(value.float().contiguous(), shapes, start, sampling_locations.float().contiguous(),
                                      attention_weights.float().contiguous())
        return out.to(dtype)

    return core


@contextlib.contextmanager
def routed_to(core: Callable[..., Tensor] | None) -> Iterator[None]:
    """Within it, the reference Deformable DETR attends through ``core`` (None: unchanged). DINO's own code,
    imported from a checkout, is given the core when it is imported (``scripts/fixtures/make_dino.py``)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the own-words baselines
    from reference import deformable_detr as reference_deformable_detr

    if core is None:
        yield
        return
    saved = reference_deformable_detr.original_core
    reference_deformable_detr.original_core = core
    try:
        yield
    finally:
        reference_deformable_detr.original_core = saved
