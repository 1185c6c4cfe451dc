"""The restoration adapter (IPT): images in [0, 1] in, restored 8-bit images out, written as PNG."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from visiontf.adapters import drawing
from visiontf.adapters.base import PreprocessModule, TaskAdapter, canonical_cfg, pretrained_cfg


class RestorationPreprocess(PreprocessModule):
    """Nothing but a batch axis: restoration models take [0, 1] RGB and normalise inside (IPT's mean shift).

    ``cfg``: ``tasks`` (the model's task names), ``restore_task`` (which one to run: a name or index;
    default the first), ``self_ensemble`` (the x8 flips/transposes, IPT's ``--self_ensemble``).
    ``forward(image)``: float (3, H, W) in [0, 1] -> (1, 3, H, W).
    """

    def forward(self, image: Tensor) -> Tensor:
        return image[None].float()


class RestorationAdapter(TaskAdapter):
    """Restoration: ``(B, 3, H, W)`` in [0, 1] -> ``(B, 3, H*s, W*s)``; results ``{"image": uint8 (3, H*s, W*s)}``."""

    task = "restoration"
    output_names = ("restored",)

    def eval_cfg(self, model: nn.Module, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
        cfg = {**pretrained_cfg(model), **canonical_cfg(overrides)}
        tasks = tuple(cfg.get("tasks") or model.tasks)
        return {"tasks": tasks, "restore_task": cfg.get("restore_task", tasks[0]),
                "self_ensemble": bool(cfg.get("self_ensemble", False))}

    def build_preprocess(self, cfg: dict[str, Any]) -> RestorationPreprocess:
        return RestorationPreprocess(cfg)

    def restore(self, model: nn.Module, preprocess: nn.Module, image: Tensor) -> Tensor:
        """The restored float (1, 3, H*s, W*s) of one float (3, H, W) image in [0, 1], clamped to [0, 1]."""
        c = preprocess.cfg
        task = c["restore_task"]
        if isinstance(task, str) and task.isdigit():
            task = int(task)
        if isinstance(task, str) and task not in model.tasks:
            raise ValueError(f"restore_task {task!r}: this model's tasks are {list(model.tasks)}")
        ensemble, model.self_ensemble = model.self_ensemble, bool(c["self_ensemble"])
        try:
            out = model(preprocess(image), task=task)
        finally:
            model.self_ensemble = ensemble
        return out.float().clamp(0, 1)

    def predict(self, model: nn.Module, preprocess: nn.Module, images: Sequence[Tensor], *,
                score_threshold: float | None = None, top_k: int | None = None,
                class_name: Callable[[int], str] = lambda i: f"class_{i}") -> list[dict[str, Any]]:
        """``image``: the restored uint8 (3, H*s, W*s) on the CPU (8-bit rounded, IPT's ``quantize``); ``task``."""
        out = []
        for im in images:  # one at a time: sizes differ and the model tiles each image itself
            y = self.restore(model, preprocess, im)[0]
            out.append({"image": (y * 255).round().to(torch.uint8).cpu(), "task": str(preprocess.cfg["restore_task"])})
        return out

    def draw(self, image: Tensor, result: dict[str, Any], num_classes: int | None = None) -> Tensor:
        return result["image"]

    def view(self, image: Tensor, result: dict[str, Any], score_threshold: float | None = None,
             num_classes: int | None = None) -> Tensor:
        """The input (enlarged to the output's size, nearest, so its pixels stay visible) beside the output."""
        out = result["image"]
        inp = F.interpolate(image[None].float(), size=out.shape[-2:], mode="nearest")[0].round().to(torch.uint8)
        return drawing.side_by_side([drawing.titled(inp.cpu(), "input"), drawing.titled(out, "restored")])

    def record(self, result: dict[str, Any], score_threshold: float | None = None,
               class_name: Callable[[int], str] = lambda i: f"class_{i}") -> dict[str, Any]:
        return {"task": result["task"], "output_size": [int(v) for v in result["image"].shape[-2:]]}

    def describe(self, result: dict[str, Any], score_threshold: float | None = None,
                 class_name: Callable[[int], str] = lambda i: f"class_{i}") -> str:
        h, w = (int(v) for v in result["image"].shape[-2:])
        return f"restored ({result['task']}): {w} x {h} pixels"

    def render_batch(self, pl_module: Any, batch: Any, mean: Sequence[float], std: Sequence[float],
                     class_names: Sequence[str] | None, num_images: int, score_threshold: float) -> list[Tensor]:
        """Input (nearest-upscaled) | output | ground truth, side by side."""
        lq, hr, task = batch[0][:num_images], batch[1][:num_images], batch[2]
        sr = pl_module.restore(lq, int(task[0])).clamp(0, 1)
        up = F.interpolate(lq, size=hr.shape[-2:], mode="nearest")
        to8 = lambda x: (x.float().clamp(0, 1) * 255).round().to(torch.uint8).cpu()  # noqa: E731
        return [torch.cat([to8(a), to8(b), to8(c)], dim=-1) for a, b, c in zip(up, sr, hr)]

    def write_predictions(self, images: Sequence[Any], results: Sequence[dict[str, Any]], stems: Sequence[str],
                          out: Path, predictor: Any, annotations: str | Path | None = None) -> list[dict[str, Any]]:
        """``<stem>.png``: the restored image, lossless, under the input's name."""
        records = []
        for im, r, stem in zip(images, results, stems):
            drawing.save_image(r["image"], out / f"{stem}.png")
            records.append({"file": im.source, "output": f"{stem}.png", "task": r["task"],
                            "size": [int(r["image"].shape[-2]), int(r["image"].shape[-1])]})
        return records

    def default_export_size(self, model: nn.Module) -> tuple[int, int]:
        t = int(model.tile_size)
        return t, t


__all__ = ["RestorationAdapter", "RestorationPreprocess"]
