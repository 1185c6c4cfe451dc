"""The generation adapter (VQGAN tokenizers): images in, reconstructions at the original size out.

``Predictor(model)`` of a first stage returns, per image, ``reconstruction`` (uint8 (3, H, W), the
original size: the model pads to a multiple of its downsampling factor, at least two codes a side, and crops back), ``codes``
(int64 (h, w) code indices of the padded image) and ``psnr`` (dB, against the input).
``tools/predict.py`` writes ``<stem>.png`` (the reconstruction) per input and the PSNRs in
``predictions.json``. Second stages (``Net2NetTransformer``) sample rather than predict:
``tools/sample.py``.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from visiontf.models.contract import Tokenizer
from visiontf.tasks import drawing
from visiontf.tasks.eval_settings import EvalSettings
from visiontf.tasks.task_inference import PreprocessModule, TaskAdapter, pretrained_cfg


@dataclass(frozen=True)
class GenerationSettings(EvalSettings):
    """Normalisation of [0, 1] RGB into the tokenizer's range (``mean``/``std`` 0.5: [-1, 1], VQGAN's)."""

    mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    std: tuple[float, ...] = (0.5, 0.5, 0.5)


class GenerationPreprocess(PreprocessModule):
    """One float (3, H, W) image in [0, 1] -> (1, 3, H, W) normalised (:class:`GenerationSettings`)."""

    settings: GenerationSettings

    def forward(self, image: Tensor) -> Tensor:
        mean = torch.tensor(self.settings.mean, device=image.device)[:, None, None]
        std = torch.tensor(self.settings.std, device=image.device)[:, None, None]
        return ((image - mean) / std)[None]


class GenerationAdapter(TaskAdapter):
    """Image tokenizers: ``(B, 3, H, W) -> reconstruction (B, 3, H, W)``."""

    task = "generation"
    output_names = ("reconstruction",)
    settings_type = GenerationSettings

    def build_preprocess(self, settings: GenerationSettings) -> GenerationPreprocess:
        return GenerationPreprocess(settings)

    @staticmethod
    def _check_tokenizer(model: nn.Module) -> None:
        if not isinstance(model, Tokenizer):
            raise ValueError(f"{type(model).__name__} is a second stage: it samples codes, it does not reconstruct "
                             "images; draw samples with tools/sample.py, or predict with its first stage's checkpoint")

    def to_uint8(self, x: Tensor, settings: GenerationSettings) -> Tensor:
        mean = torch.tensor(settings.mean, device=x.device)[:, None, None]
        std = torch.tensor(settings.std, device=x.device)[:, None, None]
        return ((x.float() * std + mean).clamp(0, 1) * 255).round().to(torch.uint8)

    @torch.no_grad()
    def predict(self, model: nn.Module, preprocess: nn.Module, images: Sequence[Tensor], *,
                score_threshold: float | None = None, top_k: int | None = None,
                class_name: Callable[[int], str] = lambda i: f"class_{i}") -> list[dict[str, Any]]:
        self._check_tokenizer(model)
        out = []
        for image in images:  # one at a time: sizes differ
            x = preprocess(image)
            H, W = x.shape[-2:]
            f = model.downsample_factor
            # a multiple of the factor, and at least 2 codes a side: at one code, a GroupNorm of the encoder's
            # lowest level normalises single values (a 1x1 image failed there)
            pad_h, pad_w = max(-H % f, 2 * f - H), max(-W % f, 2 * f - W)
            padded = F.pad(x, (0, pad_w, 0, pad_h), mode="replicate") if (pad_h or pad_w) else x
            codes = model.tokenize(padded)
            rec = model.detokenize(codes)[..., :H, :W]
            mse = ((rec.clamp(-1, 1) - x) ** 2).mean().clamp_min(1e-10)
            out.append({"reconstruction": self.to_uint8(rec[0], preprocess.settings).cpu(), "codes": codes[0].cpu(),
                        "psnr": float(10 * torch.log10(4.0 / mse))})
        return out

    def draw(self, image: Tensor, result: dict[str, Any], num_classes: int | None = None) -> Tensor:
        """The original beside its reconstruction."""
        return torch.cat([image.cpu(), result["reconstruction"]], dim=-1)

    def record(self, result: dict[str, Any], score_threshold: float | None = None,
               class_name: Callable[[int], str] = lambda i: f"class_{i}") -> dict[str, Any]:
        """The reconstruction's PSNR (dB) and the shape of its code grid."""
        return {"psnr": round(float(result["psnr"]), 3), "codes_shape": list(result["codes"].shape)}

    def describe(self, result: dict[str, Any], score_threshold: float | None = None,
                 class_name: Callable[[int], str] = lambda i: f"class_{i}") -> str:
        h, w = result["codes"].shape[-2:]
        return f"reconstruction from {h} x {w} codes: PSNR {float(result['psnr']):.2f} dB"

    def render_batch(self, pl_module: Any, batch: Any, settings: GenerationSettings,
                     class_names: Sequence[str] | None, num_images: int, score_threshold: float) -> list[Tensor]:
        x = (batch[0] if isinstance(batch, (tuple, list)) else batch)[:num_images]
        rec = pl_module.model(x).clamp(-1, 1)
        return [torch.cat([self.to_uint8(a, settings), self.to_uint8(b, settings)], dim=-1).cpu() for a, b in zip(x, rec)]

    def write_predictions(self, images: Sequence[Any], results: Sequence[dict[str, Any]], stems: Sequence[str],
                          out: Path, predictor: Any, annotations: str | Path | None = None) -> list[dict[str, Any]]:
        """``<stem>.png``: the reconstruction at the input's size."""
        records = []
        for im, r, stem in zip(images, results, stems):
            drawing.save_image(r["reconstruction"], out / f"{stem}.png")
            records.append({"file": im.source, "reconstruction": f"{stem}.png", "psnr": round(r["psnr"], 3),
                            "codes_shape": list(r["codes"].shape)})
        return records

    def default_export_size(self, model: nn.Module) -> tuple[int, int]:
        size = pretrained_cfg(model).get("input_size", (3, 256, 256))
        return int(size[-2]), int(size[-1])
