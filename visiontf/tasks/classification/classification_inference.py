"""The classification adapter (ViT, DeiT): timm's eval crop, softmax top-k, captions, logits export."""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from torch import Tensor, nn
from torchvision.transforms.v2 import InterpolationMode
from torchvision.transforms.v2 import functional as TF

from visiontf.models.contract import AttentionRollout, Classifier
from visiontf.models.vit.vit import merge_distilled
from visiontf.tasks import drawing
from visiontf.tasks.eval_settings import MAX_SIDE, EvalSettings, SettingsError
from visiontf.tasks.task_inference import PreprocessModule, TaskAdapter

_INTERPOLATION = {"bicubic": InterpolationMode.BICUBIC, "nearest": InterpolationMode.NEAREST}


def interpolation_mode(name: str | None) -> InterpolationMode:
    """torchvision's mode for a ``pretrained_cfg`` ``interpolation`` name (bilinear when unknown)."""
    return _INTERPOLATION.get(name or "", InterpolationMode.BILINEAR)


def classification_view(image: Tensor, input_size: Sequence[int], crop_pct: float, interpolation: str = "bicubic") -> Tensor:
    """timm's eval transform before normalisation: shorter side to ``size / crop_pct``, centre crop.

    ``image``: float (3, H, W) in [0, 1]; returns (3, h, w) with (h, w) = ``input_size[-2:]``.
    """
    h, w = int(input_size[-2]), int(input_size[-1])
    scale = math.floor(min(h, w) / crop_pct)
    H, W = int(image.shape[-2]), int(image.shape[-1])
    if max(H, W) * scale > _MAX_STRETCH * min(H, W) * max(h, w):
        # an extreme aspect ratio (10 x 10000) would be resized to 256 x 256000 before the crop keeps
        # 224 x 224 of it: crop the part the centre crop keeps first (plus a margin for the filter)
        keep_h = min(H, math.ceil(h * min(H, W) / scale) + 4)
        keep_w = min(W, math.ceil(w * min(H, W) / scale) + 4)
        image = TF.center_crop(image, [keep_h, keep_w])
        size = [max(1, round(keep_h * scale / min(H, W))), max(1, round(keep_w * scale / min(H, W)))]
        x = TF.resize(image, size, interpolation=interpolation_mode(interpolation), antialias=True)
    else:
        x = TF.resize(image, [scale], interpolation=interpolation_mode(interpolation), antialias=True)
    return TF.center_crop(x, [h, w]).clamp(0.0, 1.0)


#: above this aspect ratio (times the crop's), classification_view crops before resizing; below it,
#: timm's exact order (resize, then crop)
_MAX_STRETCH = 8


@dataclass(frozen=True)
class ClassificationSettings(EvalSettings):
    """timm's eval transform: the shorter side resized to ``input_size / crop_pct`` with ``interpolation``,
    the centre ``input_size`` (C, H, W) cropped, normalised with ``mean``/``std``."""

    input_size: tuple[int, int, int] = (3, 224, 224)
    crop_pct: float = 1.0
    interpolation: str = "bicubic"
    mean: tuple[float, ...] = tuple(IMAGENET_DEFAULT_MEAN)
    std: tuple[float, ...] = tuple(IMAGENET_DEFAULT_STD)

    pixel_fields = ("input_size",)

    def __post_init__(self) -> None:
        super().__post_init__()
        size = self.input_size
        object.__setattr__(self, "input_size", (3, int(size[-2]), int(size[-1])))
        object.__setattr__(self, "crop_pct", float(self.crop_pct))

    def check_sizes(self, where: str) -> ClassificationSettings:
        super().check_sizes(where)
        # the image is first resized to input_size / crop_pct (timm's crop_pct are 0.875 to 1.15)
        if not (self.crop_pct > 0 and min(self.input_size[-2:]) / self.crop_pct <= MAX_SIDE):
            raise SettingsError(f"{where}: crop_pct is {self.crop_pct!r}: it must be above 0, and input_size / crop_pct "
                                f"at most {MAX_SIDE} pixels")
        return self


class ClassificationPreprocess(PreprocessModule):
    """timm's eval preprocessing (:class:`ClassificationSettings`).

    ``forward(images)``: float (3, H_i, W_i) images in [0, 1] -> (B, 3, h, w) normalised.
    """

    settings: ClassificationSettings

    def view(self, image: Tensor) -> Tensor:
        """The crop the model sees, before normalisation: (3, h, w) in [0, 1]."""
        s = self.settings
        return classification_view(image, s.input_size, s.crop_pct, s.interpolation)

    def forward(self, images: Sequence[Tensor]) -> Tensor:
        views = torch.stack([self.view(im) for im in images])
        return TF.normalize(views, list(self.settings.mean), list(self.settings.std))


class ClassificationAdapter(TaskAdapter):
    """Image classification: ``(B, 3, H, W) -> logits (B, K)``; DeiT's two heads are averaged."""

    task = "classification"
    output_names = ("logits",)
    settings_type = ClassificationSettings

    def check_model_takes(self, model: nn.Module, settings: ClassificationSettings, where: str) -> None:
        reason = model.input_size_error(settings.input_size[-2:]) if isinstance(model, Classifier) else None
        if reason:
            size = settings.input_size
            raise SettingsError(f"{where}: input_size is ({size[0]}, {size[1]}, {size[2]}), but {reason}")

    def build_preprocess(self, settings: ClassificationSettings) -> ClassificationPreprocess:
        return ClassificationPreprocess(settings)

    def normalize_outputs(self, outputs: Tensor | tuple[Tensor, Tensor]) -> Tensor:
        """(B, K) logits; a distilled model left in its training form gives (class, distillation) logits."""
        return merge_distilled(outputs)

    def predict(self, model: nn.Module, preprocess: nn.Module, images: Sequence[Tensor], *,
                score_threshold: float | None = None, top_k: int | None = None,
                class_name: Callable[[int], str] = lambda i: f"class_{i}") -> list[dict[str, Any]]:
        """``labels`` (k,), ``scores`` (k,) softmax probabilities and ``class_names`` of the ``top_k``
        classes (default 5, at most the number of classes)."""
        probs = self.normalize_outputs(model(preprocess(images))).float().softmax(dim=-1)
        k = max(1, min(5 if top_k is None else int(top_k), probs.shape[-1]))
        scores, labels = probs.topk(k, dim=-1)
        return [{"labels": l.cpu(), "scores": s.cpu(), "class_names": [class_name(int(i)) for i in l]}
                for s, l in zip(scores, labels)]

    def draw(self, image: Tensor, result: dict[str, Any], num_classes: int | None = None) -> Tensor:
        return drawing.draw_caption(image, drawing.classification_caption(result))

    def record(self, result: dict[str, Any], score_threshold: float | None = None,
               class_name: Callable[[int], str] = lambda i: f"class_{i}") -> dict[str, Any]:
        """The top classes, best first: label, class name, probability."""
        names = result.get("class_names") or [class_name(int(label)) for label in result["labels"]]
        return {"top_classes": [{"label": int(label), "class_name": str(n), "score": round(float(s), 4)}
                                for label, n, s in zip(result["labels"], names, result["scores"])]}

    def describe(self, result: dict[str, Any], score_threshold: float | None = None,
                 class_name: Callable[[int], str] = lambda i: f"class_{i}") -> str:
        return "top classes: " + ", ".join(drawing.classification_caption(result, k=5))

    def top_classes(self, result: dict[str, Any]) -> dict[str, float] | None:
        names = result.get("class_names") or [f"class_{int(label)}" for label in result["labels"]]
        return {str(n): float(s) for n, s in zip(names, result["scores"])}

    def render_batch(self, pl_module: Any, batch: Any, settings: ClassificationSettings,
                     class_names: Sequence[str] | None, num_images: int, score_threshold: float) -> list[Tensor]:
        """A caption with the top prediction and the true class on each of the first images."""
        images, labels = batch[0][:num_images], batch[1][:num_images]
        probs = self.normalize_outputs(pl_module.model(images)).float().softmax(-1)
        score, top = probs.max(-1)
        name = lambda i: class_names[i] if class_names and 0 <= i < len(class_names) else f"class_{i}"  # noqa: E731
        out = []
        for img, s, t, y in zip(images, score, top, labels):
            truth = int(y) if y.dim() == 0 else int(y.argmax())
            lines = [f"pred {name(int(t))} {float(s):.2f}", f"true {name(truth)}"]
            out.append(drawing.draw_caption(drawing.denormalize(img, settings.mean, settings.std), lines))
        return out

    def write_predictions(self, images: Sequence[Any], results: Sequence[dict[str, Any]], stems: Sequence[str],
                          out: Path, predictor: Any, annotations: str | Path | None = None) -> list[dict[str, Any]]:
        records = []
        for im, r, stem in zip(images, results, stems):
            drawing.save_image(self.draw(im.uint8(), r), out / f"{stem}.png")
            records.append({"file": im.source, "labels": r["labels"].tolist(), "scores": r["scores"].tolist(),
                            "class_names": r["class_names"]})
        return records

    def save_attention(self, predictor: Any, image: Any, out: Path, stem: str, score_threshold: float | None = None
                       ) -> Path | None:
        """ViT attention rollout over the crop the model saw (models with ``forward_attention``); it shows no
        detections, so ``score_threshold`` does not apply."""
        if not isinstance(predictor.model, AttentionRollout):
            return super().save_attention(predictor, image, out, stem)
        from visiontf.tasks.attention_pictures import save_rollout_overlay, vit_attention_rollout

        x = predictor.preprocess([image.tensor.to(predictor.device)])
        rollout = vit_attention_rollout(predictor.model, x, preprocess=False)[0]
        return save_rollout_overlay(predictor.preprocess.view(image.tensor), rollout, out / f"{stem}_rollout.png")
