"""The export check: does onnxruntime give what users consume from the model, up to float32 noise?

An absolute tolerance on the raw outputs was set on random weights, whose logits are near 0; a
trained detector's logits reach tens, and the same float32 reordering (onnxruntime's kernels vs
PyTorch's) then moves them by a few 1e-4 (a trained ``dino_tiny``: 2.46e-4), which refused good
exports. The check therefore compares:

* every raw output with a relative tolerance, elementwise ``|onnx - torch| <= atol + rtol * |torch|``
  (numpy's ``allclose`` rule; :class:`ExportTolerance`);
* what the task's users consume, through the adapter's ``onnx_disagreements``: for detection the
  post-processed detections (boxes in pixels, scores, labels), tie-aware
  (:func:`visiontf.set_prediction.agreement.detections_disagreement`).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from visiontf.tasks.task_inference import Task, get_adapter

__all__ = ["DEFAULT_TOLERANCE", "ExportTolerance", "check_onnx", "onnx_and_torch_outputs"]


@dataclass(frozen=True)
class ExportTolerance:
    """How far onnxruntime may be from PyTorch (float32 on CPU) and still pass the export check.

    Attributes:
        rtol, atol: raw outputs (logits, boxes, ...), ``|onnx - torch| <= atol + rtol * |torch|``
            elementwise: float32 reordering noise grows with the activations, so large logits get
            proportionally more room. ``atol`` 1e-3 moves a sigmoid score by at most 2.5e-4 and a
            normalised box by 1e-3; a wrong graph (another image size, a missing step) is off by
            1e-1 or more.
        score_atol: detection scores (sigmoid/softmax probabilities, in [0, 1]).
        box_rtol: detection box corners in pixels, as a fraction of the image's longer side
            (1e-4: 0.13 px on a 1333-pixel image).
    """

    rtol: float = 1e-3
    atol: float = 1e-3
    score_atol: float = 1e-3
    box_rtol: float = 1e-4


#: the defaults, what ``tools/export.py`` checks with unless given ``--rtol``/``--atol``
DEFAULT_TOLERANCE = ExportTolerance()


def onnx_and_torch_outputs(model: nn.Module, path: str | Path, inputs: dict[str, Tensor],
                           task: Task | None = None) -> tuple[tuple[Tensor, ...], tuple[Tensor, ...]]:
    """The graph's outputs from PyTorch (the adapter's wrapper, float32 on CPU) and from onnxruntime (CPU)."""
    import onnxruntime as ort

    adapter = get_adapter(model, task)
    wrapper = adapter.onnx_wrapper(model).eval()
    with torch.inference_mode():
        ref = wrapper(*(inputs[n] for n in adapter.input_names))
    ref = tuple(r.float().cpu() for r in (ref if isinstance(ref, tuple) else (ref,)))
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = {i.name: inputs[i.name].cpu().numpy() for i in sess.get_inputs()}
    got = tuple(torch.from_numpy(np.asarray(g)) for g in sess.run(None, feeds))
    return ref, got


def check_onnx(model: nn.Module, path: str | Path, inputs: dict[str, Tensor], task: Task | None = None,
               tolerance: ExportTolerance = DEFAULT_TOLERANCE) -> dict:
    """Compare onnxruntime with PyTorch on ``inputs``; raise ``RuntimeError`` naming what differs.

    Raw outputs are compared elementwise; for an adapter whose outputs are sets along an axis
    (``onnx_set_axis``: a detector's queries), a row (query) that differs from PyTorch's row of the same
    index may equal another row instead (all outputs together): two-stage selection orders queries by
    encoder scores, and an exact tie between two of them may come out in either order.

    Returns the report: ``onnx_max_abs_diff`` and ``onnx_max_rel_diff`` (the largest
    ``|onnx - torch| / (atol + rtol * |torch|)``, <= 1 passes) over the raw outputs, and for set outputs
    ``onnx_reordered_rows`` (rows that matched another index).
    """
    adapter = get_adapter(model, task)
    ref, got = onnx_and_torch_outputs(model, path, inputs, adapter.task)
    names = adapter.onnx_output_names(model)
    problems = [f"{n}: shape {tuple(g.shape)}, PyTorch {tuple(r.shape)}" for n, r, g in zip(names, ref, got) if g.shape != r.shape]
    if problems:
        raise RuntimeError(f"{path}: onnxruntime differs from PyTorch: " + "; ".join(problems))
    axis = getattr(adapter, "onnx_set_axis", None)
    report: dict = {}
    if axis is None:
        excess = [_excess(r, g, tolerance) for r, g in zip(ref, got)]
        abs_diff = [(g - r).abs() for r, g in zip(ref, got)]
    else:
        excess, abs_diff, reordered = _set_excess(ref, got, axis, tolerance)
        report["onnx_reordered_rows"] = reordered
    report["onnx_max_abs_diff"] = max((float(d.max()) for d in abs_diff if d.numel()), default=0.0)
    report["onnx_max_rel_diff"] = max((float(e.max()) for e in excess if e.numel()), default=0.0)
    for name, e, d in zip(names, excess, abs_diff):
        worst = float(e.max()) if e.numel() else 0.0
        if not worst <= 1.0:  # also catches NaN
            rows = "" if axis is None else f" ({int((e.flatten(axis + 1).amax(-1) > 1).sum())} rows match no PyTorch row)"
            problems.append(f"{name}: differs by up to {float(d.max()):.3g}, more than atol {tolerance.atol:g} + rtol "
                            f"{tolerance.rtol:g} * |PyTorch| ({worst:.3g} times the allowed difference){rows}")
    if not problems:
        problems = adapter.onnx_disagreements(model, inputs, ref, got, tolerance)
    if problems:
        raise RuntimeError(f"{path}: onnxruntime differs from PyTorch: " + "; ".join(problems))
    return report


def _excess(ref: Tensor, got: Tensor, tolerance: ExportTolerance) -> Tensor:
    """``|got - ref| / (atol + rtol * |ref|)`` elementwise: <= 1 within tolerance."""
    return (got - ref).abs() / (tolerance.atol + tolerance.rtol * ref.abs())


def _set_excess(ref: Sequence[Tensor], got: Sequence[Tensor], axis: int, tolerance: ExportTolerance
                ) -> tuple[list[Tensor], list[Tensor], int]:
    """Per output, the excess and absolute difference of each of ``got``'s rows against its PyTorch row:
    the row of the same index, or, where that one differs, the closest row (all outputs together) of the
    same leading index (image). Also how many rows took another index."""
    # (..., Q, F): rows along the set axis, each output's trailing dimensions flattened
    rows = lambda t: t.flatten(axis + 1) if t.dim() > axis + 1 else t.unsqueeze(-1)  # noqa: E731
    ref_rows, got_rows = [rows(r) for r in ref], [rows(g) for g in got]
    same = torch.stack([_excess(r, g, tolerance).amax(-1) for r, g in zip(ref_rows, got_rows)]).amax(0)  # (..., Q)
    pick = torch.arange(same.shape[-1]).expand_as(same).clone()
    reordered = 0
    for idx in (~(same <= 1.0)).nonzero().tolist():
        lead, q = tuple(idx[:-1]), idx[-1]
        # this row against every PyTorch row of its image, all outputs together
        other = torch.stack([_excess(r[lead], g[lead + (q,)], tolerance).amax(-1) for r, g in zip(ref_rows, got_rows)]).amax(0)
        best = int(other.argmin())
        if other[best] <= 1.0:
            pick[lead + (q,)] = best
            reordered += 1
    excess, abs_diff = [], []
    for r, g in zip(ref, got):
        index = pick.view(*pick.shape, *([1] * (r.dim() - axis - 1))).expand_as(r)
        matched = torch.gather(r, axis, index)
        excess.append(_excess(matched, g, tolerance))
        abs_diff.append((g - matched).abs())
    return excess, abs_diff, reordered
