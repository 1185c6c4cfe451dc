"""The restoration adapter (IPT): images in [0, 1] in, restored 8-bit images out, written as PNG."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from visiontf.core.errors import UsageError
from visiontf.tasks import drawing
from visiontf.tasks.eval_settings import EvalSettings, PredictOption
from visiontf.tasks.task_inference import PreprocessModule, TaskAdapter


@dataclass(frozen=True)
class RestorationSettings(EvalSettings):
    """``tasks``: the model's task names (empty: the model's own); ``restore_task``: which one runs, a name or an
    index (None: the first); ``self_ensemble``: average the x8 flips and transposes (IPT's ``--self_ensemble``)."""

    tasks: tuple[str, ...] = ()
    restore_task: str | int | None = None
    self_ensemble: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "self_ensemble", bool(self.self_ensemble))


def _check_restore_task(task: str | int, model: nn.Module) -> None:
    """Refuse a task the model has no head for (an x3 run of an x2 model), naming the option and the model's tasks."""
    tasks = list(model.tasks)
    index = int(task) if isinstance(task, int) or str(task).isdigit() else None
    if (index is None and task not in tasks) or (index is not None and not 0 <= index < len(tasks)):
        raise UsageError(f"restore_task {task!r} (tools/predict.py --restore_task): this model restores {', '.join(tasks)} (its heads; a model of another "
                         f"scale or task needs its own checkpoint); give one of them, or an index 0..{len(tasks) - 1}")


class RestorationPreprocess(PreprocessModule):
    """Nothing but a batch axis: restoration models take [0, 1] RGB and normalise inside (IPT's mean shift).

    ``forward(image)``: float (3, H, W) in [0, 1] -> (1, 3, H, W).
    """

    settings: RestorationSettings

    def forward(self, image: Tensor) -> Tensor:
        return image[None].float()


class RestorationAdapter(TaskAdapter):
    """Restoration: ``(B, 3, H, W)`` in [0, 1] -> ``(B, 3, H*s, W*s)``; results ``{"image": uint8 (3, H*s, W*s)}``."""

    task = "restoration"
    output_names = ("restored",)
    settings_type = RestorationSettings
    # IPT folds its patch tokens back into an image (F.fold): ONNX Col2Im, opset 18
    onnx_opset = 18
    predict_options = (
        PredictOption("--restore_task", "restore_task", "the task of a multi-task model to run (a name such as "
                      "denoise_sigma30, or an index; default the first)"),
    )

    def complete_settings(self, model: nn.Module, settings: RestorationSettings) -> RestorationSettings:
        """The model's tasks when none are given, the first of them when no ``restore_task`` is."""
        tasks = settings.tasks or tuple(model.tasks)
        task = tasks[0] if settings.restore_task is None else settings.restore_task
        _check_restore_task(task, model)
        return replace(settings, tasks=tasks, restore_task=task)

    def build_preprocess(self, settings: RestorationSettings) -> RestorationPreprocess:
        return RestorationPreprocess(settings)

    def restore(self, model: nn.Module, preprocess: nn.Module, image: Tensor) -> Tensor:
        """The restored float (1, 3, H*s, W*s) of one float (3, H, W) image in [0, 1], clamped to [0, 1]."""
        s = preprocess.settings
        task = s.restore_task
        if isinstance(task, str) and task.isdigit():
            task = int(task)
        _check_restore_task(task, model)
        ensemble, model.self_ensemble = model.self_ensemble, s.self_ensemble
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
            out.append({"image": (y * 255).round().to(torch.uint8).cpu(), "task": str(preprocess.settings.restore_task)})
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

    def render_batch(self, pl_module: Any, batch: Any, settings: RestorationSettings,
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

    def onnx_wrapper(self, model: nn.Module) -> nn.Module:
        """``images -> restored``; a multi-task model (IPT's pretrained, six heads) runs its first task in the graph,
        as prediction does when no ``restore_task`` is given (one graph per task: export a model of that task)."""
        return _FirstTaskGraph(model, self) if len(model.tasks) > 1 else super().onnx_wrapper(model)


class _FirstTaskGraph(nn.Module):
    def __init__(self, model: nn.Module, adapter: TaskAdapter) -> None:
        super().__init__()
        self.model, self.adapter = model, adapter

    def forward(self, images: Tensor) -> Tensor:
        return self.adapter.normalize_outputs(self.model(images, task=0))


__all__ = ["RestorationAdapter", "RestorationPreprocess", "RestorationSettings"]
