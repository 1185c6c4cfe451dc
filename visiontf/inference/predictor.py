"""One-call inference for every visiontf task: images of any form and size in, results out.

``Predictor`` applies the model's own preprocessing (from ``pretrained_cfg``, or from the data
module a checkpoint was trained with), batches images of different sizes, and maps every result
back to the original image: detection boxes in original pixels, segmentation label maps at the
original resolution.
"""
from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchvision.transforms.v2 import functional as TF
from torchvision.transforms.v2 import InterpolationMode
from timm.data import IMAGENET_DEFAULT_MEAN as IMAGENET_MEAN, IMAGENET_DEFAULT_STD as IMAGENET_STD

from visiontf.data.loading import IMAGE_EXTENSIONS

log = logging.getLogger(__name__)

Task = Literal["classification", "detection", "segmentation"]
TASKS: tuple[str, ...] = ("classification", "detection", "segmentation")
#: kwargs that point at weight files used only to initialise training; a checkpoint has all weights
_INIT_ONLY_KWARGS = ("backbone_pretrained", "encoder_pretrained", "pretrained")


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


# ---------------------------------------------------------------------------------------- task
def infer_task(model: nn.Module) -> Task:
    """classification / detection / segmentation from the model's class or its registry tags."""
    names = [c.__name__ for c in type(model).__mro__]
    if "VisionTransformer" in names:
        return "classification"
    if "DETR" in names:
        return "detection"
    if "SETR" in names:
        return "segmentation"
    model_name = getattr(model, "model_name", None)
    if model_name:
        from visiontf.registry import get_entry

        for tag in get_entry(model_name).tags:
            if tag in TASKS:
                return tag  # type: ignore[return-value]
    raise ValueError(
        f"cannot tell the task of a {type(model).__name__}; pass task='classification'|'detection'|'segmentation'"
    )


# ---------------------------------------------------------------------------------------- preprocessing
def _interp(name: str | None) -> InterpolationMode:
    return {"bicubic": InterpolationMode.BICUBIC, "nearest": InterpolationMode.NEAREST}.get(name or "", InterpolationMode.BILINEAR)


def _normalize(x: Tensor, mean: Sequence[float], std: Sequence[float]) -> Tensor:
    return TF.normalize(x, list(mean), list(std))


def classification_view(image: Tensor, input_size: tuple[int, int], crop_pct: float, interpolation: str = "bicubic") -> Tensor:
    """timm's eval transform before normalisation: shorter side to ``size / crop_pct``, centre crop."""
    h, w = input_size
    scale = math.floor(min(h, w) / crop_pct)
    x = TF.resize(image, [scale], interpolation=_interp(interpolation), antialias=True)
    return TF.center_crop(x, [h, w]).clamp(0.0, 1.0)


def detection_resize(image: Tensor, min_size: int, max_size: int | None) -> Tensor:
    """DETR's eval resize: shorter side ``min_size``, longer side at most ``max_size``."""
    from visiontf.data.detection_transforms import resized_hw

    h, w = image.shape[-2:]
    out = resized_hw(int(h), int(w), int(min_size), None if max_size is None else int(max_size))
    if tuple(out) == (h, w):
        return image
    return TF.resize(image, list(out), interpolation=InterpolationMode.BILINEAR, antialias=True).clamp(0.0, 1.0)


def pad_batch(images: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
    """Zero-pad (C, h, w) tensors bottom/right to a common size; mask is True on padding."""
    H = max(int(im.shape[-2]) for im in images)
    W = max(int(im.shape[-1]) for im in images)
    out = images[0].new_zeros((len(images), images[0].shape[0], H, W))
    mask = torch.ones((len(images), H, W), dtype=torch.bool, device=images[0].device)
    for i, im in enumerate(images):
        h, w = im.shape[-2:]
        out[i, :, :h, :w] = im
        mask[i, :h, :w] = False
    return out, mask


# ---------------------------------------------------------------------------------------- predictor
class Predictor:
    """Run a classification, detection or segmentation model on raw images.

    Args:
        model: a visiontf model (or any module with a ``pretrained_cfg`` and the same outputs).
        class_names: names by label index; defaults to ``"class_<i>"``.
        task: inferred from the model when ``None``.
        device: defaults to CUDA when available.
        batch_size: images per forward pass.
        mean, std: override the normalisation (default: the model's ``pretrained_cfg``).
        input_size, crop_pct: classification eval crop (default: ``pretrained_cfg``).
        min_size, max_size: detection eval resize (default: ``pretrained_cfg``; e.g. ``min_size=256``
            for a ``detr_tiny`` trained on small images).
        seg_mode, seg_crop, seg_stride: segmentation ``"whole"`` or ``"slide"`` inference.
        seg_scale: mmseg-style keep-ratio resize scale ``(long, short)`` before segmentation; ``None``
            segments at the original resolution.
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
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
        input_size: Sequence[int] | None = None,
        crop_pct: float | None = None,
        min_size: int | None = None,
        max_size: int | None = None,
        seg_mode: Literal["whole", "slide"] = "whole",
        seg_crop: int | Sequence[int] | None = None,
        seg_stride: int | Sequence[int] | None = None,
        seg_scale: Sequence[int] | None = None,
        label_to_cat_id: dict[int, int] | None = None,
    ) -> None:
        self.task: Task = task or infer_task(model)
        if self.task not in TASKS:
            raise ValueError(f"task={self.task!r}; use one of {TASKS}")
        self.device = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.model = model.to(self.device).eval()
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.batch_size = batch_size
        cfg = dict(getattr(model, "pretrained_cfg", {}) or {})
        self.mean = tuple(mean or cfg.get("mean", IMAGENET_MEAN))
        self.std = tuple(std or cfg.get("std", IMAGENET_STD))
        size = input_size or cfg.get("input_size", (3, 224, 224))
        self.input_size = (int(size[-2]), int(size[-1]))
        self.crop_pct = float(crop_pct or cfg.get("crop_pct", 1.0))
        self.interpolation = cfg.get("interpolation", "bicubic")
        self.min_size = int(min_size or cfg.get("min_size", 800))
        self.max_size = max_size if max_size is not None else cfg.get("max_size", 1333)
        self.seg_mode, self.seg_crop, self.seg_stride = seg_mode, seg_crop, seg_stride
        self.seg_scale = tuple(seg_scale) if seg_scale is not None else None
        self.num_classes = self._num_classes()
        if class_names is not None and self.num_classes is not None and len(class_names) != self.num_classes:
            raise ValueError(f"{len(class_names)} class names for a model with {self.num_classes} classes")
        self.class_names = list(class_names) if class_names is not None else None
        self.label_to_cat_id = {int(k): int(v) for k, v in (label_to_cat_id or {}).items()} or None

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_checkpoint(cls, ckpt_path: str | Path, class_names: Sequence[str] | None = None, **kwargs: Any) -> "Predictor":
        """Rebuild the network of a visiontf Lightning checkpoint (read with ``weights_only=True``).

        Preprocessing follows the checkpoint's data module where it saved its settings (mean/std,
        classification crop, detection ``val_size``/``max_size``); ``kwargs`` override.
        """
        model, info = load_checkpoint_model(ckpt_path)
        for key, value in info.get("predictor_kwargs", {}).items():
            kwargs.setdefault(key, value)
        if info.get("label_to_cat_id"):
            kwargs.setdefault("label_to_cat_id", info["label_to_cat_id"])
        return cls(model, class_names=class_names if class_names is not None else info.get("class_names"), **kwargs)

    @classmethod
    def from_file(cls, path: str | Path, class_names: Sequence[str] | None = None, **kwargs: Any) -> "Predictor":
        """A model exported with :func:`visiontf.save_model` (``tools/export.py``)."""
        from visiontf.registry import load_model

        model = load_model(path)
        labels = read_labels_file(path)
        kwargs.setdefault("label_to_cat_id", labels.get("label_to_cat_id"))
        for key, value in labels.get("predictor_kwargs", {}).items():
            kwargs.setdefault(key, value)
        return cls(model, class_names=class_names if class_names is not None else labels.get("class_names"), **kwargs)

    def _num_classes(self) -> int | None:
        n = getattr(self.model, "num_classes", None)
        return int(n) if isinstance(n, int) and n > 0 else None

    def class_name(self, label: int) -> str:
        if self.class_names is not None and 0 <= label < len(self.class_names):
            return str(self.class_names[label])
        return f"class_{label}"

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
            chunk = images[start : start + self.batch_size]
            if self.task == "classification":
                results.extend(self._classify(chunk, 5 if top_k is None else top_k))
            elif self.task == "detection":
                results.extend(self._detect(chunk, score_threshold, top_k))
            else:
                results.extend(self._segment(chunk))
        for r, im in zip(results, images):
            r["source"] = im.source
            r["image_size"] = im.size
        return results

    def preprocess_classification(self, images: Sequence[LoadedImage]) -> Tensor:
        """Normalised (B, 3, H, W) crops as the model sees them."""
        views = [classification_view(im.tensor.to(self.device), self.input_size, self.crop_pct, self.interpolation) for im in images]
        return _normalize(torch.stack(views), self.mean, self.std)

    def preprocess_detection(self, images: Sequence[LoadedImage]) -> tuple[Tensor, Tensor, list[tuple[int, int]]]:
        """Resized, normalised, zero-padded batch, its padding mask, and the resized sizes."""
        resized = [detection_resize(im.tensor.to(self.device), self.min_size, self.max_size) for im in images]
        sizes = [(int(r.shape[-2]), int(r.shape[-1])) for r in resized]
        batch, mask = pad_batch([_normalize(r, self.mean, self.std) for r in resized])
        return batch, mask, sizes

    def _classify(self, images: Sequence[LoadedImage], top_k: int) -> list[dict[str, Any]]:
        logits = self.model(self.preprocess_classification(images))
        if isinstance(logits, (tuple, list)):  # a distilled model left in its training output form
            logits = (logits[0] + logits[1]) / 2
        probs = logits.float().softmax(dim=-1)
        k = max(1, min(int(top_k), probs.shape[-1]))
        scores, labels = probs.topk(k, dim=-1)
        return [
            {"labels": l.cpu(), "scores": s.cpu(), "class_names": [self.class_name(int(i)) for i in l]}
            for s, l in zip(scores, labels)
        ]

    def _detect(self, images: Sequence[LoadedImage], score_threshold: float | None, top_k: int | None) -> list[dict[str, Any]]:
        from visiontf.detection.postprocess import PostProcess

        batch, mask, _ = self.preprocess_detection(images)
        # no mask when nothing is padded: the model then takes its fused attention path
        outputs = self.model(batch, mask if bool(mask.any()) else None)
        # DETR's boxes are relative to each image's unpadded extent, so the original (h, w) maps
        # them straight back to original pixels, whatever the resize and padding were
        orig = torch.tensor([im.size for im in images], device=batch.device)
        k = None if top_k is None else int(top_k)
        if k is None and score_threshold is not None:
            k = int(outputs["pred_logits"].shape[1])  # sorted by score
        preds = PostProcess()(outputs, orig, score_threshold=score_threshold, top_k=k)
        out = []
        for p in preds:
            labels = p["labels"].cpu()
            out.append({
                "boxes": p["boxes"].cpu(), "scores": p["scores"].cpu(), "labels": labels,
                "class_names": [self.class_name(int(i)) for i in labels],
            })
        return out

    def segmentation_logits(self, image: Tensor) -> Tensor:
        """Logits (1, K, H, W) at the original size for one float (3, H, W) image in [0, 1]."""
        H, W = image.shape[-2:]
        x = image.to(self.device)
        if self.seg_scale is not None:
            from visiontf.data.segmentation import keep_ratio_size

            x = TF.resize(x, list(keep_ratio_size(int(H), int(W), self.seg_scale)), antialias=True).clamp(0, 1)
        x = _normalize(x, self.mean, self.std)[None]
        if hasattr(self.model, "inference"):
            logits = self.model.inference(x, self.seg_mode, crop=self.seg_crop, stride=self.seg_stride)
        else:
            logits = self.model(x)
            if isinstance(logits, dict):
                logits = logits["out"]
        if logits.shape[-2:] != (H, W):
            logits = F.interpolate(logits.float(), size=(int(H), int(W)), mode="bilinear", align_corners=False)
        return logits

    def _segment(self, images: Sequence[LoadedImage]) -> list[dict[str, Any]]:
        # one image per pass: sizes differ and whole/slide inference pads each image itself
        return [{"label_map": self.segmentation_logits(im.tensor).argmax(dim=1)[0].to(torch.int64).cpu()} for im in images]


# ---------------------------------------------------------------------------------------- checkpoints
def _torch_load(path: Path) -> dict:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as first:
        # Lightning stores data-module hparams as given; pathlib paths are safe to allow
        import pathlib

        try:
            with torch.serialization.safe_globals([pathlib.PosixPath, pathlib.WindowsPath, pathlib.PurePosixPath]):
                return torch.load(path, map_location="cpu", weights_only=True)
        except Exception:
            raise RuntimeError(
                f"{path}: cannot be read with torch.load(weights_only=True) ({type(first).__name__}: {first}). "
                "visiontf never unpickles arbitrary objects; export the model with tools/export.py from a trusted "
                "environment and use Predictor.from_file."
            ) from first


def load_checkpoint_model(ckpt_path: str | Path) -> tuple[nn.Module, dict[str, Any]]:
    """The plain network of a visiontf Lightning checkpoint, and what it knows about its data.

    Returns ``(model, info)``; ``info`` may hold ``class_names``, ``label_to_cat_id``, ``task`` and
    ``predictor_kwargs`` (preprocessing from the saved data-module hyper-parameters).
    """
    from visiontf.registry import create_model

    path = Path(ckpt_path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    ckpt = _torch_load(path)
    hp = dict(ckpt.get("hyper_parameters") or {})
    if "model_name" not in hp or "state_dict" not in ckpt:
        raise ValueError(
            f"{path}: not a visiontf task checkpoint (needs 'hyper_parameters.model_name' and 'state_dict'; "
            f"has keys {sorted(ckpt)[:10]}). For a plain state dict use create_model(name, pretrained=path)."
        )
    kwargs = {k: v for k, v in dict(hp.get("model_kwargs") or {}).items() if k not in _INIT_ONLY_KWARGS}
    model = create_model(hp["model_name"], num_classes=hp.get("num_classes"), **kwargs)
    state = {k[len("model."):]: v for k, v in ckpt["state_dict"].items() if k.startswith("model.")}
    # nn.Module.compile keeps names, but torch.compile(model) adds "_orig_mod."
    state = {k.replace("_orig_mod.", ""): v for k, v in state.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise RuntimeError(
            f"{path}: weights do not fit {hp['model_name']}: missing {missing[:5]}, unexpected {unexpected[:5]}"
        )
    dm = dict(ckpt.get("datamodule_hyper_parameters") or {})
    info: dict[str, Any] = {"hyper_parameters": hp, "datamodule_hyper_parameters": dm}
    names = ckpt.get("class_names") or hp.get("class_names") or dm.get("class_names")
    if names:
        info["class_names"] = list(names)
    if ckpt.get("label_to_cat_id"):
        info["label_to_cat_id"] = {int(k): int(v) for k, v in ckpt["label_to_cat_id"].items()}
    pk = predictor_kwargs_from_hparams(dm, hp)
    info["predictor_kwargs"] = pk
    log.info("%s: rebuilt %s (%d tensors); preprocessing from the checkpoint: %s", path, hp["model_name"], len(state), pk or "model defaults")
    return model, info


def predictor_kwargs_from_hparams(datamodule_hparams: dict[str, Any], task_hparams: dict[str, Any] | None = None) -> dict[str, Any]:
    """Predictor preprocessing matching a data module's eval transform (and a task's inference mode)."""
    dm, hp = datamodule_hparams or {}, task_hparams or {}
    pk: dict[str, Any] = {}
    for key in ("mean", "std"):
        if dm.get(key) is not None:
            pk[key] = tuple(dm[key])
    if dm.get("image_size") is not None:
        s = dm["image_size"]
        pk["input_size"] = (s, s) if isinstance(s, int) else tuple(s)
    if dm.get("crop_pct") is not None:
        pk["crop_pct"] = float(dm["crop_pct"])
    if dm.get("val_size") is not None:
        pk["min_size"] = int(dm["val_size"])
        if dm.get("max_size") is not None:
            pk["max_size"] = int(dm["max_size"])
    if isinstance(dm.get("val_resize"), (list, tuple)):
        pk["seg_scale"] = tuple(dm["val_resize"])
    elif dm.get("val_resize") is True and (dm.get("base_size") is not None or dm.get("layout")):
        base = dm.get("base_size")
        if base is None:
            from visiontf.data.segmentation import LAYOUTS

            base = LAYOUTS.get(dm["layout"], {}).get("base_size")
        if base is not None:
            pk["seg_scale"] = tuple(base)
    if hp.get("inference_mode") in ("whole", "slide"):
        pk["seg_mode"] = hp["inference_mode"]
        if hp.get("crop_size"):
            pk["seg_crop"] = hp["crop_size"]
        if hp.get("stride"):
            pk["seg_stride"] = hp["stride"]
    return pk


def labels_path(weights_path: str | Path) -> Path:
    """Where :func:`write_labels_file` keeps class names beside an exported model."""
    p = Path(weights_path)
    return p.with_name(p.stem + ".labels.json")


def write_labels_file(weights_path: str | Path, class_names: Sequence[str] | None = None,
                      label_to_cat_id: dict[int, int] | None = None, predictor_kwargs: dict[str, Any] | None = None) -> Path | None:
    """Write class names / category ids / preprocessing beside exported weights (``<stem>.labels.json``)."""
    data: dict[str, Any] = {}
    if class_names:
        data["class_names"] = list(class_names)
    if label_to_cat_id:
        data["label_to_cat_id"] = {str(k): int(v) for k, v in label_to_cat_id.items()}
    if predictor_kwargs:
        data["predictor_kwargs"] = {k: list(v) if isinstance(v, tuple) else v for k, v in predictor_kwargs.items()}
    if not data:
        return None
    out = labels_path(weights_path)
    out.write_text(json.dumps(data, indent=2) + "\n")
    return out


def read_labels_file(weights_path: str | Path) -> dict[str, Any]:
    p = labels_path(weights_path)
    if not p.is_file():
        return {}
    data = json.loads(p.read_text())
    if "label_to_cat_id" in data:
        data["label_to_cat_id"] = {int(k): int(v) for k, v in data["label_to_cat_id"].items()}
    return data

