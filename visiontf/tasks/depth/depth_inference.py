"""The monocular-depth adapter: images resized to the model's input, depth maps back at each image's
original size (metres), coloured pictures, 16-bit depth PNGs and the depth export."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from torch import Tensor, nn
from torchvision.transforms.v2 import InterpolationMode
from torchvision.transforms.v2 import functional as TF

from visiontf.tasks import drawing
from visiontf.tasks.eval_settings import EvalSettings
from visiontf.tasks.task_inference import PreprocessModule, TaskAdapter

#: what a written depth PNG's value means: millimetres (16 bits: up to 65.5 m)
DEPTH_PNG_SCALE = 1000.0
#: near -> far colours (matplotlib's magma at 0, 1/4, ..., 1, reversed): near is bright
_RAMP = torch.tensor([(252, 253, 191), (251, 135, 97), (183, 55, 121), (81, 18, 124), (0, 0, 4)], dtype=torch.float32)


def colour_depth(depth: Tensor, max_depth: float) -> Tensor:
    """A uint8 (3, H, W) picture of a (H, W) depth map in metres: near bright, far dark, 0 (unmeasured) black."""
    t = (depth.float().cpu().clamp(0, max_depth) / max_depth) * (len(_RAMP) - 1)
    low = t.floor().long().clamp(max=len(_RAMP) - 2)
    frac = (t - low)[..., None]
    rgb = _RAMP[low] * (1 - frac) + _RAMP[low + 1] * frac
    rgb[depth.cpu() <= 0] = 0
    return rgb.round().to(torch.uint8).permute(2, 0, 1)


@dataclass(frozen=True)
class DepthSettings(EvalSettings):
    """Images resized to ``input_size`` (C, H, W) (bilinear, antialiased), normalised with ``mean``/``std``."""

    pixel_fields = ("input_size",)

    input_size: tuple[int, int, int] = (3, 224, 224)
    mean: tuple[float, ...] = tuple(IMAGENET_DEFAULT_MEAN)
    std: tuple[float, ...] = tuple(IMAGENET_DEFAULT_STD)

    def __post_init__(self) -> None:
        super().__post_init__()
        size = self.input_size
        object.__setattr__(self, "input_size", (3, int(size[-2]), int(size[-1])))


class DepthPreprocess(PreprocessModule):
    """Float (3, H_i, W_i) images in [0, 1] -> (B, 3, h, w) normalised at ``input_size`` (:class:`DepthSettings`)."""

    settings: DepthSettings

    def forward(self, images: Sequence[Tensor]) -> Tensor:
        s = self.settings
        size = list(s.input_size[-2:])
        resized = [TF.resize(im, size, interpolation=InterpolationMode.BILINEAR, antialias=True).clamp(0, 1) for im in images]
        return TF.normalize(torch.stack(resized), list(s.mean), list(s.std))


class DepthAdapter(TaskAdapter):
    """Monocular depth: ``(B, 3, H, W) -> depth (B, 1, H, W)`` in metres; results ``{"depth": float (H, W)}``."""

    task = "depth"
    output_names = ("depth",)
    settings_type = DepthSettings

    def build_preprocess(self, settings: DepthSettings) -> DepthPreprocess:
        return DepthPreprocess(settings)

    def predict(self, model: nn.Module, preprocess: nn.Module, images: Sequence[Tensor], *,
                score_threshold: float | None = None, top_k: int | None = None,
                class_name: Callable[[int], str] = lambda i: f"class_{i}") -> list[dict[str, Any]]:
        """``depth``: float32 (H, W) metres at each image's original size (bilinear from the model's output)."""
        depth = model(preprocess(images)).float()
        return [{"depth": F.interpolate(d[None], size=tuple(im.shape[-2:]), mode="bilinear", align_corners=False)[0, 0].cpu()}
                for d, im in zip(depth, images)]

    def draw(self, image: Tensor, result: dict[str, Any], num_classes: int | None = None) -> Tensor:
        """The image beside its depth map, coloured (near bright) up to the map's deepest value."""
        depth = result["depth"]
        return torch.cat([image.cpu(), colour_depth(depth, max(float(depth.max()), 1e-6))], dim=-1)

    def render_batch(self, pl_module: Any, batch: Any, settings: DepthSettings, class_names: Sequence[str] | None,
                     num_images: int, score_threshold: float) -> list[Tensor]:
        """Image | true depth | predicted depth, coloured on the model's range."""
        images, depth = batch[0][:num_images], batch[1][:num_images]
        predicted = pl_module.model(images)
        top = float(pl_module.model.max_depth)
        return [torch.cat([drawing.denormalize(im, settings.mean, settings.std), colour_depth(d[0], top),
                           colour_depth(p[0], top)], dim=-1) for im, d, p in zip(images, depth, predicted)]

    def write_predictions(self, images: Sequence[Any], results: Sequence[dict[str, Any]], stems: Sequence[str],
                          out: Path, predictor: Any, annotations: str | Path | None = None) -> list[dict[str, Any]]:
        """``<stem>.png``: the picture; ``<stem>_depth.png``: the depth as a 16-bit PNG in millimetres."""
        from PIL import Image

        records = []
        for im, r, stem in zip(images, results, stems):
            drawing.save_image(self.draw(im.uint8(), r), out / f"{stem}.png")
            millimetres = (r["depth"].clamp(0, 65535 / DEPTH_PNG_SCALE) * DEPTH_PNG_SCALE).round().numpy().astype(np.uint16)
            Image.fromarray(millimetres).save(out / f"{stem}_depth.png")
            records.append({"file": im.source, "depth": f"{stem}_depth.png", "depth_scale": DEPTH_PNG_SCALE,
                            "min": round(float(r["depth"].min()), 4), "max": round(float(r["depth"].max()), 4)})
        return records


__all__ = ["DepthAdapter", "DepthPreprocess", "DepthSettings", "colour_depth"]
