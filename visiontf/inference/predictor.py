"""One-call inference for every visiontf task: images of any form and size in, results out.

``Predictor`` runs the model's eval preprocessing (built by the task's adapter from the model's
``pretrained_cfg``, or the settings saved with a checkpoint or export), batches images of different
sizes, and maps every result back to the original image: detection boxes in original pixels,
segmentation label maps at the original resolution. Everything task-specific is the adapter's
(:mod:`visiontf.adapters`); this module reads inputs and loops over batches.
"""
from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor, nn

from visiontf.adapters.base import TASKS, Task, canonical_cfg, get_adapter, infer_task
from visiontf.checkpoints import load_checkpoint_model
from visiontf.data.loading import IMAGE_EXTENSIONS
from visiontf.weights import labels_path, read_labels_file, write_labels_file

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------- inputs
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


def list_image_files(folder: str | Path) -> list[Path]:
    """Image files directly inside ``folder``, sorted by name."""
    folder = Path(folder)
    files = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS)
    skipped = [p.name for p in folder.iterdir() if p.is_file() and p.suffix.lower() not in IMAGE_EXTENSIONS]
    if skipped:
        log.info("%s: %d non-image files skipped (e.g. %s)", folder, len(skipped), skipped[:3])
    if not files:
        raise FileNotFoundError(f"{folder}: no image files ({', '.join(IMAGE_EXTENSIONS)}) in this folder")
    return files


def _from_array(arr: np.ndarray, what: str) -> Tensor:
    if arr.ndim == 2:
        arr = arr[..., None]
    if arr.ndim != 3 or arr.shape[-1] not in (1, 3, 4):
        raise ValueError(f"{what}: numpy images must be HxW or HxWxC with C in 1/3/4, got shape {arr.shape}")
    if arr.shape[-1] == 4:
        log.info("%s: alpha channel dropped", what)
        arr = arr[..., :3]
    # a private copy: inputs may be read-only (PIL buffers) and must not be changed in place
    t = torch.from_numpy(np.array(arr, copy=True)).permute(2, 0, 1)
    return _to_float(t, what)


def _to_float(t: Tensor, what: str) -> Tensor:
    if t.shape[0] == 1:
        t = t.expand(3, -1, -1)
    if t.shape[0] != 3:
        raise ValueError(f"{what}: expected 1 or 3 channels first (C, H, W), got shape {tuple(t.shape)}")
    if t.dtype == torch.uint8:
        return t.float() / 255.0
    if not t.is_floating_point():
        raise ValueError(f"{what}: integer images must be uint8 (0-255), got {t.dtype}")
    t = t.float()
    if t.numel() and (t.min() < -1e-3 or t.max() > 1.0 + 1e-3):
        raise ValueError(
            f"{what}: float images must hold values in [0, 1], got [{float(t.min()):.3g}, {float(t.max()):.3g}]; "
            "pass uint8 0-255 or divide by 255 (do not normalise: the Predictor does that)"
        )
    return t


def load_inputs(inputs: Any) -> list[LoadedImage]:
    """Turn any supported input into a flat list of images.

    Accepts a path (file or folder), a list of any of these, PIL images, numpy HxWxC uint8 (or float
    0-1) arrays, and CHW / BCHW tensors (uint8 0-255 or float 0-1).
    """
    from PIL import Image

    from visiontf.data.io import read_image

    if isinstance(inputs, (str, Path)):
        path = Path(inputs)
        if path.is_dir():
            return [LoadedImage(_from_array(read_image(p), str(p)), str(p)) for p in list_image_files(path)]
        return [LoadedImage(_from_array(read_image(path), str(path)), str(path))]
    if isinstance(inputs, Image.Image):
        return [LoadedImage(_from_array(np.asarray(inputs.convert("RGB")), "PIL image"))]
    if isinstance(inputs, np.ndarray):
        if inputs.ndim == 4:
            return [LoadedImage(_from_array(a, f"array[{i}]")) for i, a in enumerate(inputs)]
        return [LoadedImage(_from_array(inputs, "numpy image"))]
    if isinstance(inputs, Tensor):
        t = inputs.detach().cpu()
        if t.dim() == 4:
            return [LoadedImage(_to_float(x, f"tensor[{i}]")) for i, x in enumerate(t)]
        if t.dim() == 3:
            return [LoadedImage(_to_float(t, "tensor"))]
        if t.dim() == 2:
            return [LoadedImage(_to_float(t[None], "tensor"))]
        raise ValueError(f"tensor inputs must be (C, H, W) or (B, C, H, W), got shape {tuple(t.shape)}")
    if isinstance(inputs, (list, tuple)):
        out: list[LoadedImage] = []
        for item in inputs:
            out.extend(load_inputs(item))
        return out
    raise TypeError(
        f"unsupported input type {type(inputs).__name__}; pass a path, a folder, PIL images, numpy HxWxC arrays "
        "or (B,)C,H,W tensors, or a list of them"
    )


# ---------------------------------------------------------------------------------------- predictor
class Predictor:
    """Run a classification, detection or segmentation model on raw images.

    Args:
        model: a visiontf model (or any module with a ``pretrained_cfg`` and the same outputs).
        class_names: names by label index; defaults to ``"class_<i>"``.
        task: found through the model's registry tags when ``None``.
        device: defaults to CUDA when available.
        batch_size: images per forward pass.
        preprocess: eval settings (``pretrained_cfg`` keys, e.g. from a checkpoint), or a
            preprocessing module built by the task's adapter; default: the model's ``pretrained_cfg``.
        mean, std: override the normalisation.
        input_size, crop_pct: classification eval crop.
        min_size, max_size: detection eval resize (e.g. ``min_size=256`` for a ``detr_tiny`` trained
            on small images).
        seg_mode, seg_crop, seg_stride: segmentation ``"whole"`` or ``"slide"`` inference
            (``pretrained_cfg`` keys ``test_mode``, ``crop_size``, ``stride``).
        seg_scale: mmseg-style keep-ratio resize scale ``(long, short)`` before segmentation
            (``resize``); ``None`` segments at the original resolution.
        label_to_cat_id: detection label -> dataset category id (for COCO results files).
    """

    def __init__(
        self,
        model: nn.Module,
        class_names: Sequence[str] | None = None,
        task: Task | None = None,
        device: str | torch.device | None = None,
        batch_size: int = 8,
        *,
        preprocess: dict[str, Any] | nn.Module | None = None,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
        input_size: Sequence[int] | None = None,
        crop_pct: float | None = None,
        min_size: int | None = None,
        max_size: int | None = None,
        seg_mode: Literal["whole", "slide"] | None = None,
        seg_crop: int | Sequence[int] | None = None,
        seg_stride: int | Sequence[int] | None = None,
        seg_scale: Sequence[int] | None = None,
        label_to_cat_id: dict[int, int] | None = None,
    ) -> None:
        self.adapter = get_adapter(model, task)
        self.task: Task = self.adapter.task  # type: ignore[assignment]
        self.device = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.model = model.to(self.device).eval()
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.batch_size = batch_size
        overrides = canonical_cfg(dict(mean=mean, std=std, input_size=input_size, crop_pct=crop_pct, min_size=min_size,
                                       max_size=max_size, seg_mode=seg_mode, seg_crop=seg_crop, seg_stride=seg_stride,
                                       seg_scale=seg_scale))
        if isinstance(preprocess, nn.Module):
            base = preprocess.cfg
        else:
            base = canonical_cfg(preprocess)
        self.preprocess = self.adapter.preprocess(model, {**base, **overrides}).to(self.device)
        self.num_classes = self._num_classes()
        if class_names is not None and self.num_classes is not None and len(class_names) != self.num_classes:
            raise ValueError(f"{len(class_names)} class names for a model with {self.num_classes} classes")
        self.class_names = list(class_names) if class_names is not None else None
        self.label_to_cat_id = {int(k): int(v) for k, v in (label_to_cat_id or {}).items()} or None

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_checkpoint(cls, ckpt_path: str | Path, class_names: Sequence[str] | None = None, **kwargs: Any) -> Predictor:
        """Rebuild the network of a visiontf Lightning checkpoint (read with ``weights_only=True``).

        Preprocessing is the one saved with the checkpoint (older checkpoints: derived from their data
        module's settings, see :func:`visiontf.checkpoints.legacy_eval_cfg`); ``kwargs`` override.
        """
        model, info = load_checkpoint_model(ckpt_path)
        kwargs["preprocess"] = {**info.get("preprocess", {}), **canonical_cfg(kwargs.get("preprocess"))}
        if info.get("label_to_cat_id"):
            kwargs.setdefault("label_to_cat_id", info["label_to_cat_id"])
        return cls(model, class_names=class_names if class_names is not None else info.get("class_names"), **kwargs)

    @classmethod
    def from_file(cls, path: str | Path, class_names: Sequence[str] | None = None, **kwargs: Any) -> Predictor:
        """A model exported with :func:`visiontf.save_model` (``tools/export.py``), with the class names
        and preprocessing of its labels file."""
        from visiontf.registry import load_model

        model = load_model(path)
        labels = read_labels_file(path)
        kwargs.setdefault("label_to_cat_id", labels.get("label_to_cat_id"))
        # older exports hold only the overrides ("predictor_kwargs"); newer ones the complete settings too
        saved = {**canonical_cfg(labels.get("predictor_kwargs")), **canonical_cfg(labels.get("preprocess"))}
        kwargs["preprocess"] = {**saved, **canonical_cfg(kwargs.get("preprocess"))}
        return cls(model, class_names=class_names if class_names is not None else labels.get("class_names"), **kwargs)

    def _num_classes(self) -> int | None:
        n = getattr(self.model, "num_classes", None)
        return int(n) if isinstance(n, int) and n > 0 else None

    def class_name(self, label: int) -> str:
        if self.class_names is not None and 0 <= label < len(self.class_names):
            return str(self.class_names[label])
        return f"class_{label}"

    @property
    def cfg(self) -> dict[str, Any]:
        """The complete eval preprocessing settings (``pretrained_cfg`` keys)."""
        return self.preprocess.cfg

    # the former attribute names of the settings
    mean = property(lambda self: self.cfg.get("mean"))
    std = property(lambda self: self.cfg.get("std"))
    crop_pct = property(lambda self: self.cfg.get("crop_pct"))
    input_size = property(lambda self: tuple(self.cfg["input_size"][-2:]) if "input_size" in self.cfg else None)
    min_size = property(lambda self: self.cfg.get("min_size"))
    max_size = property(lambda self: self.cfg.get("max_size"))

    # ------------------------------------------------------------------ inference
    @torch.inference_mode()
    def __call__(self, inputs: Any, score_threshold: float | None = 0.5, top_k: int | None = None) -> list[dict[str, Any]]:
        """Predict every image in ``inputs`` (see :func:`load_inputs`); one dict per image.

        * classification: ``labels`` (k,), ``scores`` (k,) softmax probabilities, ``class_names``;
          ``top_k`` classes (default 5, at most the number of classes).
        * detection: ``boxes`` (N, 4) xyxy in original image pixels, ``scores``, ``labels``,
          ``class_names``; detections with ``score > score_threshold`` (``None`` keeps all), at most
          ``top_k`` (default: no limit), sorted by score.
        * segmentation: ``label_map`` (H, W) int64 at the original resolution.
        """
        images = inputs if isinstance(inputs, list) and inputs and all(isinstance(i, LoadedImage) for i in inputs) else load_inputs(inputs)
        results: list[dict[str, Any]] = []
        for start in range(0, len(images), self.batch_size):
            chunk = [im.tensor.to(self.device) for im in images[start : start + self.batch_size]]
            results.extend(self.adapter.predict(self.model, self.preprocess, chunk, score_threshold=score_threshold,
                                                top_k=top_k, class_name=self.class_name))
        for r, im in zip(results, images):
            r["source"] = im.source
            r["image_size"] = im.size
        return results

    def preprocess_classification(self, images: Sequence[LoadedImage]) -> Tensor:
        """Normalised (B, 3, H, W) crops as a classifier sees them."""
        return self.preprocess([im.tensor.to(self.device) for im in images])

    def preprocess_detection(self, images: Sequence[LoadedImage]) -> tuple[Tensor, Tensor, list[tuple[int, int]]]:
        """A detector's input: resized, normalised, zero-padded batch, its padding mask, and the resized sizes."""
        batch, sizes = self.preprocess([im.tensor.to(self.device) for im in images])
        return batch.images, batch.mask, sizes

    def segmentation_logits(self, image: Tensor) -> Tensor:
        """A segmenter's logits (1, K, H, W) at the original size of one float (3, H, W) image in [0, 1]."""
        return self.adapter.logits(self.model, self.preprocess, image.to(self.device))


__all__ = [
    "TASKS", "LoadedImage", "Predictor", "Task", "infer_task", "labels_path", "list_image_files", "load_checkpoint_model",
    "load_inputs", "read_labels_file", "write_labels_file",
]
