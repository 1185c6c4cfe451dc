"""The export check: does onnxruntime give what users consume from the model, up to float32 noise?

An absolute tolerance on the raw outputs was set on random weights, whose logits are near 0; a
trained detector's logits reach tens, and the same float32 reordering (onnxruntime's kernels vs
PyTorch's) then moves them by a few 1e-4 (a trained ``dino_tiny``: 2.46e-4), which refused good
exports. The check therefore compares:

* every raw output with a relative tolerance, elementwise ``|onnx - torch| <= atol + rtol * |torch|``
  (numpy's ``allclose`` rule; :class:`ExportTolerance`);
* what the task's users consume, through the adapter's ``onnx_disagreements``: for detection the
  post-processed detections (boxes in pixels, scores, labels), tie-aware
  (:func:`visiontf.detection.agreement.detections_disagreement`).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from visiontf.adapters.base import Task, get_adapter

__all__ = ["DEFAULT_TOLERANCE", "ExportTolerance", "check_onnx", "onnx_and_torch_outputs"]


@dataclass(frozen=True)
class ExportTolerance:
    """How far onnxruntime may be from PyTorch (float32 on CPU) and still pass the export check.

    Attributes:
        rtol, atol: raw outputs (logits, boxes, ...), ``|onnx - torch| <= atol + rtol * |torch|``
            elementwise: float32 reordering noise grows with the values, so large logits get
            proportionally more room, logits near 0 ``atol``.
        score_atol: detection scores (sigmoid/softmax probabilities, in [0, 1]).
        box_rtol: detection box corners in pixels, as a fraction of the image's longer side
            (1e-4: 0.13 px on a 1333-pixel image).
    """

    rtol: float = 1e-3
    atol: float = 1e-4
    score_atol: float = 1e-4
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

    Returns the report: ``onnx_max_abs_diff`` and ``onnx_max_rel_diff`` (the largest
    ``|onnx - torch| / (atol + rtol * |torch|)``, <= 1 passes) over the raw outputs.
    """
    adapter = get_adapter(model, task)
    ref, got = onnx_and_torch_outputs(model, path, inputs, adapter.task)
    problems, report = [], {"onnx_max_abs_diff": 0.0, "onnx_max_rel_diff": 0.0}
    for name, r, g in zip(adapter.output_names, ref, got):
        if tuple(g.shape) != tuple(r.shape):
            problems.append(f"{name}: shape {tuple(g.shape)}, PyTorch {tuple(r.shape)}")
            continue
        diff = (g - r).abs()
        rel = diff / (tolerance.atol + tolerance.rtol * r.abs())
        abs_max, rel_max = (float(diff.max()), float(rel.max())) if diff.numel() else (0.0, 0.0)
        report["onnx_max_abs_diff"] = max(report["onnx_max_abs_diff"], abs_max)
        report["onnx_max_rel_diff"] = max(report["onnx_max_rel_diff"], rel_max)
        if not rel_max <= 1.0:  # also catches NaN
            problems.append(f"{name}: differs by up to {abs_max:.3g}, more than atol {tolerance.atol:g} + rtol "
                            f"{tolerance.rtol:g} * |PyTorch| ({rel_max:.3g} times the allowed difference)")
    if not problems:
        problems = adapter.onnx_disagreements(model, inputs, ref, got, tolerance)
    if problems:
        raise RuntimeError(f"{path}: onnxruntime differs from PyTorch: " + "; ".join(problems))
    return report
