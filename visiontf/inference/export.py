"""Exporting trained models: safetensors (+ config, for ``visiontf.load_model``) and ONNX.

ONNX goes through the TorchScript-based exporter (``torch.onnx.export(..., dynamo=False)``, opset
17): the dynamo exporter needs ``onnxscript``, which this environment does not ship. Graph inputs
and outputs:

* classification: ``images`` (B, 3, H, W) -> ``logits`` (B, K); batch dynamic, H/W fixed (the
  position-embedding resampling is traced for the export size).
* detection (DETR): ``images`` (B, 3, H, W), ``mask`` (B, H, W) bool, True on padding (all False for
  unpadded images) -> ``pred_logits`` (B, Q, K+1), ``pred_boxes`` (B, Q, 4); batch, H and W dynamic.
* segmentation: ``images`` (B, 3, H, W) -> ``logits`` (B, K, H, W); batch dynamic.

Inputs are already normalised; preprocessing stays in :class:`~visiontf.inference.Predictor`.
"""
from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from torch import Tensor, nn

from visiontf.inference.predictor import Task, infer_task

log = logging.getLogger(__name__)

OPSET = 17


class _Classifier(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, images: Tensor) -> Tensor:
        out = self.model(images)
        return (out[0] + out[1]) / 2 if isinstance(out, (tuple, list)) else out


class _Detector(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, images: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        out = self.model(images, mask)
        return out["pred_logits"], out["pred_boxes"]


class _Segmenter(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, images: Tensor) -> Tensor:
        out = self.model(images)
        return out["out"] if isinstance(out, dict) else out


def default_image_size(model: nn.Module, task: Task) -> tuple[int, int]:
    cfg = getattr(model, "pretrained_cfg", {}) or {}
    if task == "detection":
        s = int(cfg.get("min_size", 800))
        return s, s
    size = cfg.get("crop_size") or cfg.get("input_size", (3, 224, 224))
    return int(size[-2]), int(size[-1])


def example_inputs(model: nn.Module, task: Task | None = None, image_size: Sequence[int] | None = None,
                   batch_size: int = 1, pad: bool = False) -> dict[str, Tensor]:
    """Random normalised inputs of the graph's signature (``pad``: the second detection image is padded)."""
    task = task or infer_task(model)
    h, w = tuple(image_size) if image_size else default_image_size(model, task)
    images = torch.randn(batch_size, 3, h, w)
    if task != "detection":
        return {"images": images}
    mask = torch.zeros(batch_size, h, w, dtype=torch.bool)
    if pad and batch_size > 1:
        mask[1:, h * 3 // 4 :, :] = True
        mask[1:, :, w * 2 // 3 :] = True
        images[1:] = images[1:].masked_fill(mask[1:, None], 0.0)
    return {"images": images, "mask": mask}


def _wrap(model: nn.Module, task: Task) -> tuple[nn.Module, list[str], list[str], dict[str, dict[int, str]]]:
    if task == "classification":
        return _Classifier(model), ["images"], ["logits"], {"images": {0: "batch"}, "logits": {0: "batch"}}
    if task == "detection":
        dyn = {"images": {0: "batch", 2: "height", 3: "width"}, "mask": {0: "batch", 1: "height", 2: "width"},
               "pred_logits": {0: "batch"}, "pred_boxes": {0: "batch"}}
        return _Detector(model), ["images", "mask"], ["pred_logits", "pred_boxes"], dyn
    return _Segmenter(model), ["images"], ["logits"], {"images": {0: "batch"}, "logits": {0: "batch"}}


def export_onnx(model: nn.Module, path: str | Path, image_size: Sequence[int] | None = None, task: Task | None = None,
                opset: int = OPSET) -> Path:
    """Write ``model`` as an ONNX graph (see the module docstring for its inputs and outputs)."""
    task = task or infer_task(model)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    wrapper, in_names, out_names, dynamic = _wrap(model, task)
    # the exporter restores the wrapper's mode afterwards, recursively: keep it eval so the model stays eval
    wrapper.eval()
    inputs = example_inputs(model, task, image_size, batch_size=2 if task == "detection" else 1, pad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracer warnings about Python ints in shape checks
        torch.onnx.export(
            wrapper, tuple(inputs[n] for n in in_names), str(path), dynamo=False, opset_version=opset,
            input_names=in_names, output_names=out_names, dynamic_axes=dynamic, do_constant_folding=True,
        )
    log.info("wrote %s (%s, opset %d, inputs %s)", path, task, opset, in_names)
    return path


def onnx_max_abs_diff(model: nn.Module, path: str | Path, inputs: dict[str, Tensor], task: Task | None = None) -> float:
    """Largest absolute difference between PyTorch and onnxruntime (CPU) outputs on ``inputs``."""
    import onnxruntime as ort

    task = task or infer_task(model)
    wrapper = _wrap(model, task)[0].eval()
    with torch.inference_mode():
        ref = wrapper(*inputs.values())
    ref = ref if isinstance(ref, tuple) else (ref,)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = {i.name: inputs[i.name].cpu().numpy() for i in sess.get_inputs()}
    got = sess.run(None, feeds)
    return max(float(np.abs(g - r.float().cpu().numpy()).max()) for g, r in zip(got, ref))


def export_model(model: nn.Module, output: str | Path, class_names: Sequence[str] | None = None,
                 label_to_cat_id: dict[int, int] | None = None, predictor_kwargs: dict[str, Any] | None = None,
                 onnx: str | Path | None = None, image_size: Sequence[int] | None = None, check: bool = True,
                 atol: float = 1e-4) -> dict[str, Any]:
    """safetensors (+ ``.json`` config and ``.labels.json``) and optionally ONNX, checked against PyTorch."""
    from visiontf.inference.predictor import write_labels_file
    from visiontf.weights import save_model

    model = model.eval().cpu()
    report: dict[str, Any] = {"safetensors": str(save_model(model, output))}
    labels = write_labels_file(report["safetensors"], class_names, label_to_cat_id, predictor_kwargs)
    if labels:
        report["labels"] = str(labels)
    if onnx:
        task = infer_task(model)
        report["onnx"] = str(export_onnx(model, onnx, image_size, task))
        if check:
            inputs = example_inputs(model, task, image_size, batch_size=2, pad=True)
            diff = onnx_max_abs_diff(model, onnx, inputs, task)
            report["onnx_max_abs_diff"] = diff
            if diff > atol:
                raise RuntimeError(f"{onnx}: onnxruntime differs from PyTorch by {diff:.3g} (> {atol})")
    return report
