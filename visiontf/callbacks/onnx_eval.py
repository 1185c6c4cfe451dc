"""Evaluate (or predict with) an exported ONNX graph through the task's own steps and evaluator.

``tools/eval.py --config C.yaml --ckpt_path K.ckpt --onnx model.onnx`` adds this callback: for validation, test
and prediction it puts an :class:`OnnxRuntimeModel` in place of the task's PyTorch model, so the same data module,
post-processing and COCO evaluator (:class:`~visiontf.tasks.detection.coco_metric.CocoMetric`) score what onnxruntime
computes. Run once with and once without ``--onnx`` to compare the export with the checkpoint it came from. In a
config::

    trainer:
      callbacks:
        - class_path: visiontf.callbacks.OnnxRuntimeEvaluation
          init_args: {onnx: model.onnx}

The graph takes what the model takes (normalised ``images`` and, for detectors, the padding ``mask``) and gives the
outputs the adapter names (``pred_logits``, ``pred_boxes``); everything else the task reads of its model (class head,
post-processing options, ...) is the PyTorch model's, so the checkpoint (or config) must be the one exported.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from torch import Tensor, nn

from visiontf.io.onnx_graph import loop_nodes
from visiontf.io.weights import ONNX_WEIGHTS_KEY, WeightsError, weights_fingerprint
from visiontf.tasks.task_inference import get_adapter

log = logging.getLogger(__name__)

__all__ = ["OnnxRuntimeEvaluation", "OnnxRuntimeModel"]


class OnnxRuntimeModel(nn.Module):
    """``model``'s exported graph run by onnxruntime (CPU), called as ``model`` is (``images``, ``mask``).

    Attributes other than the call are the PyTorch model's (the task reads its class head, post-processing
    options, ...). Outputs come back on the images' device; a graph of several outputs gives a dict of the
    adapter's output names, of one output the tensor.

    Args:
        path: the ``.onnx`` file (``tools/export.py --onnx``).
        model: the PyTorch model it was exported from (or one of the same settings).
        threads: onnxruntime's intra-op threads (None: torch's current count).
    """

    def __init__(self, path: str | Path, model: nn.Module, threads: int | None = None) -> None:
        super().__init__()
        import onnxruntime as ort

        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"--onnx {path}: no such file (write one with tools/export.py --onnx {path.name})")
        object.__setattr__(self, "torch_model", model)  # not a submodule: no parameters of its own to move or save
        adapter = get_adapter(model)
        self.input_names, self.output_names = list(adapter.input_names), list(adapter.onnx_output_names(model))
        self._refuse_loops(path)
        options = ort.SessionOptions()
        options.intra_op_num_threads = int(threads or torch.get_num_threads())
        try:
            self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        except Exception as e:  # noqa: BLE001 - onnxruntime's own classes (InvalidProtobuf, Fail, ...): the file's fault
            reason = " ".join(str(e).split())[:300]
            raise WeightsError(f"--onnx {path}: onnxruntime cannot load it as a graph ({type(e).__name__}: {reason}); "
                               f"write it again with tools/export.py --onnx {path.name}") from None
        graph_inputs = [i.name for i in self.session.get_inputs()]
        if not set(graph_inputs) <= set(self.input_names):
            raise ValueError(f"--onnx {path}: the graph takes {graph_inputs}, the {adapter.task} model "
                             f"{self.input_names}; export it from this model with tools/export.py --onnx")
        self._check_weights(path, model)
        self.path = path

    @staticmethod
    def _refuse_loops(path: Path) -> None:
        """A graph that repeats a subgraph (``Loop``, ``Scan``) may run for ever, and no visiontf export holds one:
        refused before onnxruntime loads it (:mod:`visiontf.io.onnx_graph`)."""
        try:
            loops = loop_nodes(path)
        except Exception as e:  # noqa: BLE001 - onnx's own parse errors (DecodeError, ...): the file's fault
            reason = " ".join(str(e).split())[:300]
            raise WeightsError(f"--onnx {path}: onnx cannot read it as a graph ({type(e).__name__}: {reason}); write it "
                               f"again with tools/export.py --onnx {path.name}") from None
        loops = list(dict.fromkeys(loops))  # a subgraph shared by two branches is walked twice
        if loops:
            shown = ", ".join(loops[:3]) + (f" and {len(loops) - 3} more" if len(loops) > 3 else "")
            raise WeightsError(f"--onnx {path}: the graph holds {shown}: a node that repeats a subgraph for as long as the "
                               f"file says, which no visiontf export has; export the checkpoint with tools/export.py "
                               f"--onnx {path.name}")

    def _check_weights(self, path: Path, model: nn.Module) -> None:
        """The task reads everything but the outputs from ``model`` (its classes, post-processing), so a graph of
        other weights would be scored as if it were this model: refused when the graph names its weights (visiontf's
        exports do), and warned about when it names none."""
        exported = self.session.get_modelmeta().custom_metadata_map.get(ONNX_WEIGHTS_KEY)
        if exported is None:
            log.warning("--onnx %s names no weights (%s; not exported by visiontf's tools/export.py): it cannot be "
                        "checked to be this checkpoint's model", path, ONNX_WEIGHTS_KEY)
            return
        here = weights_fingerprint(model)
        if exported != here:
            raise WeightsError(f"--onnx {path}: the graph was exported from other weights than the model it stands in "
                               f"for ({ONNX_WEIGHTS_KEY} {exported[:12]}..., this model's {here[:12]}...); export this "
                               f"checkpoint with tools/export.py --ckpt_path <the same .ckpt> --onnx {path.name}")

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(object.__getattribute__(self, "torch_model"), name)

    def forward(self, images: Tensor, mask: Tensor | None = None, **_: Any) -> Any:
        given = {"images": images, "mask": mask}
        feeds = {}
        for i in self.session.get_inputs():
            value = given.get(i.name)
            if value is None and i.name == "mask":  # nothing padded
                value = torch.zeros((images.shape[0], *images.shape[-2:]), dtype=torch.bool)
            feeds[i.name] = value.detach().cpu().numpy() if i.name != "images" else value.detach().float().cpu().numpy()
        try:
            ran = self.session.run(None, feeds)
        except Exception as e:  # onnxruntime's own errors (Fail, RuntimeException, ...) name neither the file nor a fix
            raise WeightsError(f"--onnx {self.path}: onnxruntime could not run the graph on a batch of "
                               f"{tuple(images.shape)} ({type(e).__name__}: {' '.join(str(e).split())[:300]}); export "
                               f"the checkpoint again with tools/export.py --onnx {Path(self.path).name}") from e
        outputs = [torch.from_numpy(np.asarray(o)).to(images.device) for o in ran]
        if len(outputs) == 1:
            return outputs[0]
        return dict(zip(self.output_names, outputs))


class OnnxRuntimeEvaluation(pl.Callback):
    """Validation, test and prediction run the exported graph ``onnx`` (onnxruntime, CPU) in place of the task's
    ``model``; training is untouched, and the PyTorch model comes back after each.

    Args:
        onnx: the ``.onnx`` file.
        threads: onnxruntime's intra-op threads (None: torch's current count).
    """

    def __init__(self, onnx: str, threads: int | None = None) -> None:
        self.onnx, self.threads = onnx, threads
        self._saved: nn.Module | None = None

    def _swap_in(self, pl_module: pl.LightningModule) -> None:
        if self._saved is not None:
            return
        model = pl_module.model
        self._saved = model
        pl_module.model = OnnxRuntimeModel(self.onnx, model.eval(), self.threads)
        log.info("evaluating the ONNX graph %s with onnxruntime in place of the PyTorch model", self.onnx)

    def _swap_out(self, pl_module: pl.LightningModule) -> None:
        if self._saved is not None:
            pl_module.model, self._saved = self._saved, None

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._swap_in(pl_module)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._swap_out(pl_module)

    def on_test_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._swap_in(pl_module)

    def on_test_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._swap_out(pl_module)

    def on_predict_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._swap_in(pl_module)

    def on_predict_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._swap_out(pl_module)
