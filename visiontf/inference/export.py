"""Exporting trained models: safetensors (+ config, for ``visiontf.load_model``) and ONNX.

ONNX goes through the TorchScript-based exporter (``torch.onnx.export(..., dynamo=False)``, opset
17): the dynamo exporter needs ``onnxscript``, which this environment does not ship. Each task's
adapter gives the graph's wrapper and signature (``visiontf.tasks.<task>.<task>_inference``):

* classification: ``images`` (B, 3, H, W) -> ``logits`` (B, K); batch dynamic, H/W fixed (the
  position-embedding resampling is traced for the export size).
* detection: ``images`` (B, 3, H, W), ``mask`` (B, H, W) bool, True on padding (all False for
  unpadded images) -> ``pred_logits`` (B, Q, K+1 for DETR, K for Deformable DETR), ``pred_boxes``
  (B, Q, 4); batch, height and width dynamic for every detector. Deformable DETR's and DINO's level
  shapes, valid ratios, reference points, two-stage proposals and level offsets are computed in the
  graph from the input's size (:func:`visiontf.nn.ms_deform_tables.tracing_shapes`; eager runs keep
  Python ints and cached tables), and the graph runs the pure-PyTorch ``grid_sample`` attention
  core (:func:`exportable_attention`). Every option of the family exports: the training-only ones
  (denoising queries, Group DETR's extra groups) are not part of the inference graph. A two-stage
  graph needs at least ``num_queries`` feature positions (onnxruntime fails on its TopK otherwise).
  A ViT backbone (plain or with the simple feature pyramid) or a Swin one fixes the height and width
  to the export size: its position table is resampled for that grid before tracing
  (:func:`visiontf.models.backbones.backbone.fixed_position_tables`; the antialiased bicubic resampling has no
  ONNX operator) and its window and patch paddings are traced as constants.
* segmentation: ``images`` (B, 3, H, W) -> ``logits`` (B, K, H, W); batch dynamic.

The check after an export (:func:`visiontf.inference.onnx_check.check_onnx`) compares what users
consume: raw outputs with a relative tolerance and, for detection, the post-processed detections.

Each graph names the weights it was made from in its metadata (``visiontf_weights_sha256``, the
:func:`~visiontf.io.weights.weights_fingerprint` of the model as given, before fusing), so an evaluation of the
graph in place of a checkpoint (``tools/eval.py --onnx``) can refuse a graph of other weights.

Graph inputs are already normalised; the preprocessing settings travel in the ``.labels.json``
beside the safetensors file (``preprocess``), for the :class:`~visiontf.inference.Predictor` and for
anyone feeding the ONNX graph.
"""
from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from visiontf.inference.onnx_check import DEFAULT_TOLERANCE, ExportTolerance, check_onnx, onnx_and_torch_outputs
from visiontf.models.backbones.backbone import fixed_position_tables
from visiontf.nn.ms_deform_attn import MSDeformAttn
from visiontf.tasks.eval_settings import EvalSettings
from visiontf.tasks.task_inference import Task, get_adapter

log = logging.getLogger(__name__)

def default_image_size(model: nn.Module, task: Task | None = None) -> tuple[int, int]:
    """The example input size of an export: the detector's ``min_size`` square, else the model's crop."""
    return get_adapter(model, task).default_export_size(model)


def example_inputs(model: nn.Module, task: Task | None = None, image_size: Sequence[int] | None = None,
                   batch_size: int = 1, pad: bool = False) -> dict[str, Tensor]:
    """Random normalised inputs of the graph's signature (``pad``: detection images after the first are padded)."""
    return get_adapter(model, task).example_inputs(model, image_size, batch_size, pad)


@contextmanager
def exportable_attention(model: nn.Module) -> Iterator[nn.Module]:
    """Every multi-scale deformable attention of ``model`` runs its ``"grid_sample"`` core inside the block.

    The default ``"gather"`` core is an ``embedding_bag`` inside an ``autograd.Function`` with a
    written-out backward, which the exporter cannot be trusted to translate; ``grid_sample`` (ONNX
    GridSample, opset 16+) computes the same values (``tests/nn/test_ms_deform_attn.py``). The cores
    are restored afterwards, so the model keeps running its fast path.
    """
    attns = [m for m in model.modules() if isinstance(m, MSDeformAttn)]
    saved = [m.method for m in attns]
    for m in attns:
        m.method = "grid_sample"
    try:
        yield model
    finally:
        for m, method in zip(attns, saved):
            m.method = method


def inference_form(model: nn.Module) -> nn.Module:
    """What an export runs: for the real-time DETRs (RT-DETR, D-FINE, DEIM) a copy fused for inference
    (:func:`visiontf.models.rtdetr.deploy.fuse_for_inference`: BatchNorms folded, RepVGG blocks re-parameterised, the
    same outputs up to float rounding); any other model, or one already fused, as it is. ``model`` is not changed."""
    import copy

    from visiontf.models.rtdetr.deploy import fuse_for_inference, is_fused
    from visiontf.models.rtdetr.rtdetr import RTDETR

    if not isinstance(model, RTDETR) or is_fused(model):
        return model
    fused = copy.deepcopy(model)
    fuse_for_inference(fused)
    return fused


def export_onnx(model: nn.Module, path: str | Path, image_size: Sequence[int] | None = None, task: Task | None = None,
                opset: int | None = None, fuse: bool = True) -> Path:
    """Write ``model`` as an ONNX graph (see the module docstring for its inputs and outputs) in ``opset``
    (by default the task's, :attr:`~visiontf.tasks.task_inference.TaskAdapter.onnx_opset`); ``fuse``: export the
    model's :func:`inference_form` (the real-time DETRs' fused copy; ``model`` itself is left as it is)."""
    from visiontf.io.weights import ONNX_WEIGHTS_KEY, weights_fingerprint

    fingerprint = weights_fingerprint(model)
    if fuse:
        model = inference_form(model)
    adapter = get_adapter(model, task)
    opset = adapter.onnx_opset if opset is None else opset
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # the exporter restores the wrapper's mode afterwards, recursively: keep it eval so the model stays eval
    wrapper = adapter.onnx_wrapper(model).eval()
    inputs = adapter.example_inputs(model, image_size, batch_size=adapter.trace_batch_size, pad=True)
    in_names, out_names = list(adapter.input_names), list(adapter.onnx_output_names(model))
    size = tuple(inputs["images"].shape[-2:]) if "images" in inputs else None
    with warnings.catch_warnings(), exportable_attention(model), fixed_position_tables(model, size) if size else nullcontext():
        warnings.simplefilter("ignore")  # tracer warnings about Python ints in shape checks
        torch.onnx.export(
            wrapper, tuple(inputs[n] for n in in_names), str(path), dynamo=False, opset_version=opset,
            input_names=in_names, output_names=out_names, dynamic_axes=adapter.dynamic_axes(model), do_constant_folding=True,
        )
    _write_metadata(path, {ONNX_WEIGHTS_KEY: fingerprint})
    log.info("wrote %s (%s, opset %d, inputs %s)", path, adapter.task, opset, in_names)
    return path


def _write_metadata(path: Path, entries: Mapping[str, str]) -> None:
    import onnx

    graph = onnx.load(str(path))
    for key, value in entries.items():
        graph.metadata_props.add(key=key, value=value)
    onnx.save(graph, str(path))


def onnx_max_abs_diff(model: nn.Module, path: str | Path, inputs: dict[str, Tensor], task: Task | None = None) -> float:
    """Largest absolute difference between PyTorch and onnxruntime (CPU) outputs on ``inputs``."""
    ref, got = onnx_and_torch_outputs(model, path, inputs, task)
    return max(float((g - r).abs().max()) for g, r in zip(got, ref))


def export_model(model: nn.Module, output: str | Path, class_names: Sequence[str] | None = None,
                 label_to_cat_id: dict[int, int] | None = None, preprocess: Mapping[str, Any] | EvalSettings | None = None,
                 onnx: str | Path | None = None, image_size: Sequence[int] | None = None, check: bool = True,
                 tolerance: ExportTolerance = DEFAULT_TOLERANCE) -> dict[str, Any]:
    """safetensors (+ ``.json`` config and ``.labels.json``) and optionally ONNX, checked against PyTorch
    (:func:`~visiontf.inference.onnx_check.check_onnx` with ``tolerance``, on a padded batch of 3: not the batch the
    export traces, so a batch size fixed in the graph fails the check).

    ``preprocess``: eval settings (keys of the task's settings, or complete ones) over the model's
    ``pretrained_cfg``; the labels file keeps the complete settings (``preprocess``).
    """
    from visiontf.io.weights import save_model, write_labels_file

    model = model.eval().cpu()
    adapter = get_adapter(model)
    report: dict[str, Any] = {"safetensors": str(save_model(model, output))}
    complete = adapter.eval_settings(model, preprocess, where="export_model(preprocess=)")
    labels = write_labels_file(report["safetensors"], class_names, label_to_cat_id, complete.to_dict())
    if labels:
        report["labels"] = str(labels)
    if onnx:
        report["onnx"] = str(export_onnx(model, onnx, image_size, adapter.task))
        if check:
            inputs = adapter.example_inputs(model, image_size, batch_size=3, pad=True)
            report.update(check_onnx(model, onnx, inputs, adapter.task, tolerance))
    return report
