"""One-call inference for every visiontf task: images of any form and size in, results out.

``Predictor`` runs the model's eval preprocessing (built by the task's adapter from the model's
``pretrained_cfg``, or the settings saved with a checkpoint or export), batches images of different
sizes, and maps every result back to the original image: detection boxes in original pixels,
segmentation label maps at the original resolution. Everything task-specific is the adapter's
(``visiontf.tasks.<task>.<task>_inference``); this module loops over batches, which :mod:`visiontf.data.inputs`
streams (files decoded in DataLoader workers, so memory does not grow with the number of files).

An image that cannot be predicted (unreadable, no pixels, NaN values, or one the model fails on
alone) gets ``{"source", "error", "image_size"}`` and a warning naming it; the others still run.
"""
from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from visiontf.core.errors import UserError
from visiontf.data.inputs import (
    InputError,
    InputFailure,
    LoadedImage,
    expand_inputs,
    iter_batches,
    list_image_files,
    load_inputs,
)
from visiontf.io.weights import labels_path, read_labels_file, write_labels_file
from visiontf.tasks.checkpoints import load_checkpoint_model
from visiontf.tasks.eval_settings import EvalSettings
from visiontf.tasks.task_inference import PreprocessModule, Task, TaskAdapter, get_adapter, infer_task
from visiontf.tasks.task_table import TASKS

log = logging.getLogger(__name__)

#: what a model raises on an image it cannot take (sizes too small for a layer, empty tensors)
_MODEL_ERRORS = (RuntimeError, ValueError, ZeroDivisionError, IndexError)
#: ``precision`` as Lightning's Trainer spells it -> the autocast dtype of the forward pass (None: float32)
AUTOCAST_DTYPES = {"32-true": None, "bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}


# ---------------------------------------------------------------------------------------- predictor
def saved_settings(adapter: TaskAdapter, model: nn.Module, saved: Mapping[str, Any] | None, where: str,
                   given: Mapping[str, Any] | EvalSettings | PreprocessModule | None = None
                   ) -> EvalSettings | PreprocessModule:
    """The eval settings a checkpoint or an export saved (an unknown key refused naming ``where``), ``given``
    on top (a preprocessing module given is used as it is)."""
    if isinstance(given, PreprocessModule):
        return given
    adapter.settings_type.check_keys(saved or {}, where)
    # the file's sizes, bounded, and taken by the model, named as the file's
    adapter.check_model_takes(model, adapter.eval_settings(model, saved, where=where).check_sizes(where), where)
    settings = adapter.eval_settings(model, saved, given, where="preprocess=")
    adapter.check_model_takes(model, settings, "preprocess=")
    return settings


class DeviceError(UserError, ValueError):
    """A device that this machine does not have."""


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``device`` as a torch device this machine has (CUDA when available for None); a GPU that is not there is a
    :class:`DeviceError` naming it and what there is, before anything is moved to it."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        found = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise DeviceError(f"device {device!r}: not a device name ({e}); use cpu, cuda or cuda:N") from None
    if found.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise DeviceError(f"device {device}: no CUDA GPU is visible on this machine (torch.cuda.is_available() is "
                              "False: no GPU, no driver, or a CPU build of torch); use cpu")
        if found.index is not None and found.index >= count:
            raise DeviceError(f"device {device}: this machine has {count} CUDA GPU(s), cuda:0 to cuda:{count - 1}")
    if found.type == "mps" and not torch.backends.mps.is_available():
        raise DeviceError(f"device {device}: Apple's MPS is not available here; use cpu")
    return found


class Predictor:
    """Run a classification, detection, segmentation or restoration model on raw images.

    Args:
        model: a visiontf model (or any module with a ``pretrained_cfg`` and the same outputs).
        class_names: names by label index; defaults to ``"class_<i>"``.
        task: found through the model's registry tags when ``None``.
        device: defaults to CUDA when available.
        batch_size: images per forward pass.
        preprocess: the eval settings over the model's ``pretrained_cfg``: a mapping of some keys of the
            task's settings (the adapter's ``settings_type``; an unknown key is refused by name), complete
            settings, or a preprocessing module built by the task's adapter. The keys by task:
            classification ``input_size``, ``crop_pct``, ``interpolation``, ``mean``, ``std``; detection
            ``min_size``, ``max_size`` (e.g. ``{"min_size": 256}`` for a ``detr_tiny`` trained on small
            images), ``mean``, ``std``; segmentation ``mean``, ``std``, ``resize`` (mmseg's keep-ratio
            scale ``(long, short)``; None segments at the original resolution), ``test_mode``
            (``"whole"`` or ``"slide"``), ``crop_size``, ``stride``; restoration ``tasks``,
            ``restore_task``, ``self_ensemble``; generation ``mean``, ``std``.
        label_to_cat_id: detection label -> dataset category id (for COCO results files).
        postprocess: detection post-processing options over the model's own (a checkpoint's), e.g.
            ``{"nms_iou_threshold": 0.6}`` (0 or -1: no NMS), ``num_top``, ``nms_class_agnostic``
            (:func:`visiontf.set_prediction.set_postprocess`; the model is changed in place).
        precision: ``"32-true"``, or ``"bf16-mixed"`` / ``"16-mixed"`` to run the model under
            ``torch.autocast`` as a Trainer with that precision validates (bf16 is fast on GPUs and
            on CPUs with native bf16; results are returned in float32).
        num_workers: DataLoader workers decoding image files (default: up to 4 when there is more than
            one batch of files; 0 decodes in this process).
    """

    def __init__(
        self,
        model: nn.Module,
        class_names: Sequence[str] | None = None,
        task: Task | None = None,
        device: str | torch.device | None = None,
        batch_size: int = 8,
        *,
        preprocess: Mapping[str, Any] | EvalSettings | PreprocessModule | None = None,
        label_to_cat_id: dict[int, int] | None = None,
        num_workers: int | None = None,
        postprocess: dict[str, Any] | None = None,
        precision: Literal["32-true", "bf16-mixed", "16-mixed"] = "32-true",
    ) -> None:
        if precision not in AUTOCAST_DTYPES:
            raise ValueError(f"precision {precision!r}: use one of {', '.join(AUTOCAST_DTYPES)}")
        self.precision = precision
        self.adapter = get_adapter(model, task)
        if postprocess:
            self.adapter.set_postprocess(model, postprocess)
        self.task: Task = self.adapter.task  # type: ignore[assignment]
        self.device = resolve_device(device)
        self.model = model.to(self.device).eval()
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.batch_size = batch_size
        self.num_workers = num_workers
        if not isinstance(preprocess, PreprocessModule):
            preprocess = self.adapter.preprocess(model, preprocess, where="Predictor(preprocess=)")
        self.preprocess = preprocess.to(self.device)
        self.num_classes = self._num_classes()
        if class_names is not None and self.num_classes is not None and len(class_names) != self.num_classes:
            raise ValueError(f"{len(class_names)} class names for a model with {self.num_classes} classes")
        self.class_names = list(class_names) if class_names is not None else None
        self.label_to_cat_id = {int(k): int(v) for k, v in (label_to_cat_id or {}).items()} or None

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_checkpoint(cls, ckpt_path: str | Path, class_names: Sequence[str] | None = None, **kwargs: Any) -> Predictor:
        """Rebuild the network of a visiontf Lightning checkpoint (read with ``weights_only=True``).

        Preprocessing is the one saved with the checkpoint, ``kwargs["preprocess"]`` on top.
        """
        model, info = load_checkpoint_model(ckpt_path)
        kwargs["preprocess"] = saved_settings(get_adapter(model, kwargs.get("task")), model, info.get("preprocess"),
                                              f"{ckpt_path}: its saved preprocess", kwargs.get("preprocess"))
        if info.get("label_to_cat_id"):
            kwargs.setdefault("label_to_cat_id", info["label_to_cat_id"])
        return cls(model, class_names=class_names if class_names is not None else info.get("class_names"), **kwargs)

    @classmethod
    def from_file(cls, path: str | Path, class_names: Sequence[str] | None = None, **kwargs: Any) -> Predictor:
        """A model exported with :func:`visiontf.save_model` (``tools/export.py``), with the class names
        and preprocessing of its labels file."""
        from visiontf.models import load_model

        model = load_model(path)
        labels = read_labels_file(path)
        kwargs.setdefault("label_to_cat_id", labels.get("label_to_cat_id"))
        kwargs["preprocess"] = saved_settings(get_adapter(model, kwargs.get("task")), model, labels.get("preprocess"),
                                              f"{labels_path(path)}: its preprocess", kwargs.get("preprocess"))
        return cls(model, class_names=class_names if class_names is not None else labels.get("class_names"), **kwargs)

    def _num_classes(self) -> int | None:
        n = self.model.num_classes
        return int(n) if n else None

    def class_name(self, label: int) -> str:
        if self.class_names is not None and 0 <= label < len(self.class_names):
            return str(self.class_names[label])
        return f"class_{label}"

    @property
    def settings(self) -> EvalSettings:
        """The complete eval settings (the task's ``settings_type``)."""
        return self.preprocess.settings

    @property
    def cfg(self) -> dict[str, Any]:
        """The complete eval settings as plain data, as a checkpoint or an export stores them."""
        return self.preprocess.cfg

    # ------------------------------------------------------------------ inference
    @torch.inference_mode()
    def __call__(self, inputs: Any, score_threshold: float | None = 0.5, top_k: int | None = None) -> list[dict[str, Any]]:
        """Predict every image in ``inputs`` (see :func:`load_inputs`); one dict per image, in order.

        * classification: ``labels`` (k,), ``scores`` (k,) softmax probabilities, ``class_names``;
          ``top_k`` classes (default 5, at most the number of classes).
        * detection: ``boxes`` (N, 4) xyxy in original image pixels, ``scores``, ``labels``,
          ``class_names``, and ``category_ids`` (the dataset's ids of the labels; -1 for a label no
          category has) when the model's ``label_to_cat_id`` is known; detections with
          ``score > score_threshold`` (``None`` keeps all), at most ``top_k`` (default: no limit),
          sorted by score.
        * segmentation: ``label_map`` (H, W) int64 at the original resolution.
        * restoration: ``image`` uint8 (3, H*s, W*s), the restored image (``s`` the model's scale),
          and ``task``: the task of a multi-task model that ran (``preprocess={"restore_task": ...}``).

        Every dict also has ``source`` and ``image_size``; an image that could not be predicted has
        ``error`` instead of results (see the module docstring); when no image could, the first error
        is raised. For many files use :meth:`stream`, which holds one batch at a time.
        """
        # only the results are kept: each decoded image is released with its batch, so memory grows
        # with the results (a few numbers per detection), not with the pixels
        results: list[dict[str, Any]] = []
        first_failure: InputFailure | None = None
        for image, r in self.stream(inputs, score_threshold=score_threshold, top_k=top_k):
            if not results and isinstance(image, InputFailure):
                first_failure = image
            results.append(r)
        if results and all("error" in r for r in results):
            if first_failure is not None and first_failure.exception is not None:
                raise first_failure.exception
            raise InputError(results[0]["error"])
        return results

    @torch.inference_mode()
    def stream(self, inputs: Any, score_threshold: float | None = 0.5, top_k: int | None = None
               ) -> Iterator[tuple[LoadedImage | InputFailure, dict[str, Any]]]:
        """``(image, result)`` per input, in order, one batch in memory at a time (see :meth:`__call__`)."""
        items = inputs if isinstance(inputs, list) and inputs and all(isinstance(i, LoadedImage) for i in inputs) else None
        batches = ([items[i : i + self.batch_size] for i in range(0, len(items), self.batch_size)] if items is not None
                   else iter_batches(inputs, self.batch_size, self.num_workers))
        worked = False
        for batch in batches:
            images = [b for b in batch if isinstance(b, LoadedImage)]
            predicted = self._predict_images(images, score_threshold, top_k, raise_if_all_fail=not worked)
            worked = worked or any("error" not in r for r in predicted)
            results = iter(predicted)
            for b in batch:
                if isinstance(b, InputFailure):
                    log.warning("not predicted: %s", b.error)
                    yield b, {"source": b.source, "error": b.error, "image_size": None}
                else:
                    r = next(results)
                    r["source"], r["image_size"] = b.source, b.size
                    yield b, r

    def _predict_images(self, images: Sequence[LoadedImage], score_threshold: float | None, top_k: int | None,
                        raise_if_all_fail: bool) -> list[dict[str, Any]]:
        """Results for ``images``. When the batch fails, each image runs alone, so that an image the
        model cannot take (e.g. 10 x 10000 pixels) fails alone, named, and the others still get results.
        When every image fails and nothing has worked before (``raise_if_all_fail``), the first error is
        raised: then the problem is the model or its settings, not an image."""
        if not images:
            return []

        dtype = AUTOCAST_DTYPES[self.precision]

        def run(ims: Sequence[LoadedImage]) -> list[dict[str, Any]]:
            with torch.autocast(self.device.type, dtype=dtype, enabled=dtype is not None):
                results = self.adapter.predict(self.model, self.preprocess, [im.tensor.to(self.device) for im in ims],
                                               score_threshold=score_threshold, top_k=top_k, class_name=self.class_name)
            return [self.adapter.with_category_ids({k: v.float() if torch.is_tensor(v) and v.is_floating_point() else v
                                                    for k, v in r.items()}, self.label_to_cat_id) for r in results]

        try:
            return run(images)
        except _MODEL_ERRORS as batch_error:
            if raise_if_all_fail and len(images) == 1:
                raise
            results, errors = [], []
            for im in images:
                try:
                    if len(images) == 1:  # it has just failed alone
                        raise batch_error
                    results.extend(run([im]))
                except _MODEL_ERRORS as e:
                    errors.append(e)
                    what = f"{im.source or 'image'} ({im.size[1]}x{im.size[0]} px, WxH)"
                    message = f"{what}: the model failed on this image: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
                    log.warning("%s", message)
                    results.append({"error": message})
            if raise_if_all_fail and len(errors) == len(images):
                raise errors[0] from batch_error
            return results


__all__ = [
    "TASKS", "InputError", "InputFailure", "LoadedImage", "Predictor", "Task", "expand_inputs", "infer_task", "labels_path",
    "list_image_files", "load_checkpoint_model", "load_inputs", "read_labels_file", "write_labels_file",
]
