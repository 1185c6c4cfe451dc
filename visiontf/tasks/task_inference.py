"""The adapter interface, the task -> adapter table and the lookup through the registry's tags.

Adding a task means writing one adapter module and adding its row to
:data:`visiontf.tasks.task_table.TASK_TABLE`. Adding a model family of an existing task means registering its names with the task's tag; a detection
family with another class-head convention also adds its entries to the tables behind
:func:`visiontf.set_prediction.build_postprocess` (which the detection adapter calls) and
:func:`visiontf.set_prediction.build_criterion` (which the detection task calls).
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from visiontf.models.contract import VisionModel
from visiontf.tasks.eval_settings import EvalSettings, PredictOption
from visiontf.tasks.task_table import TASK_TABLE, TASKS, import_class

log = logging.getLogger(__name__)

#: a task's name: one of :data:`TASKS`, the keys of :data:`~visiontf.tasks.task_table.TASK_TABLE`
Task = str

_INSTANCES: dict[str, TaskAdapter] = {}

#: eval settings given on top of others: some keys of the task's settings, or complete settings
SettingsValues = Mapping[str, Any] | EvalSettings | None


def adapter_for_task(task: str) -> TaskAdapter:
    """The adapter of ``task`` (one of :data:`TASKS`)."""
    if task not in TASK_TABLE:
        raise ValueError(f"task={task!r}; use one of {TASKS}")
    if task not in _INSTANCES:
        _INSTANCES[task] = import_class(TASK_TABLE[task].adapter)()
    return _INSTANCES[task]


def infer_task(model: nn.Module) -> Task:
    """The task of a model built by ``create_model``: the first of its registry tags that names a task."""
    model_name = model.model_name if isinstance(model, VisionModel) else None  # a module built by hand has none
    if model_name:
        from visiontf.models import get_entry

        for tag in get_entry(model_name).tags:
            if tag in TASK_TABLE:
                return tag
    raise ValueError(
        f"cannot tell the task of a {type(model).__name__} (it was not built by visiontf.create_model, or its "
        f"registry tags name no task); pass task= one of {', '.join(TASKS)}"
    )


def get_adapter(model: nn.Module, task: str | None = None) -> TaskAdapter:
    """The adapter for ``model``: ``task``'s when given, else the one its registry tags name."""
    return adapter_for_task(task or infer_task(model))


class TaskAdapter:
    """What one task's models need outside training. Subclasses fill in every method.

    ONNX graphs take already normalised images; :attr:`input_names` / :attr:`output_names` name the
    graph's tensors, :meth:`dynamic_axes` their dynamic dimensions.
    """

    task: str = ""
    #: the task's eval settings (a frozen dataclass with the task's defaults): what the preprocessing module
    #: is built from, and what checkpoints and exports store as ``preprocess``
    settings_type: type[EvalSettings] = EvalSettings
    #: the ``tools/predict.py`` options of the task (its eval settings and post-processing options)
    predict_options: tuple[PredictOption, ...] = ()
    input_names: tuple[str, ...] = ("images",)
    output_names: tuple[str, ...] = ()
    #: batch size of the example the ONNX graph is traced with
    trace_batch_size: int = 1
    #: the ONNX opset the task's graphs are written in (the lowest one every operator of its models has)
    onnx_opset: int = 17
    #: an axis along which every output is a set (a detector's queries): the export check lets rows swap
    onnx_set_axis: int | None = None

    # ------------------------------------------------------------------ preprocessing
    def eval_settings(self, model: nn.Module, *overrides: SettingsValues, where: str = "eval settings") -> EvalSettings:
        """The complete eval settings of ``model``: the task's defaults (:attr:`settings_type`), the model's
        ``pretrained_cfg`` on top, then each of ``overrides`` in order (keys of the settings, every one given
        a value; an unknown key is refused naming ``where``)."""
        settings = self.settings_type.from_pretrained(pretrained_cfg(model))
        for values in overrides:
            settings = settings.updated(values, where)
        return self.complete_settings(model, settings)

    def complete_settings(self, model: nn.Module, settings: EvalSettings) -> EvalSettings:
        """Settings whose defaults come from the model itself (restoration: its tasks); as given by default."""
        return settings

    def check_model_takes(self, model: nn.Module, settings: EvalSettings, where: str) -> None:
        """Refuse (a ``SettingsError`` naming ``where``) settings whose images ``model`` cannot take; the tasks whose
        models declare such limits say which. By default every setting within its bounds is taken."""

    def build_preprocess(self, settings: EvalSettings) -> PreprocessModule:
        """The preprocessing module of complete ``settings`` (see :meth:`eval_settings`)."""
        raise NotImplementedError

    def preprocess(self, model: nn.Module, *overrides: SettingsValues, where: str = "eval settings") -> PreprocessModule:
        return self.build_preprocess(self.eval_settings(model, *overrides, where=where))

    # ------------------------------------------------------------------ inference
    def normalize_outputs(self, outputs: Any) -> Any:
        """The model's output in its inference form (one tensor, or DETR's dict)."""
        return outputs

    def predict(self, model: nn.Module, preprocess: nn.Module, images: Sequence[Tensor], *,
                score_threshold: float | None = None, top_k: int | None = None,
                class_name: Callable[[int], str] = lambda i: f"class_{i}") -> list[dict[str, Any]]:
        """Results for float (3, H, W) images in [0, 1], mapped back to each image's original pixels."""
        raise NotImplementedError

    def set_postprocess(self, model: nn.Module, options: dict[str, Any]) -> None:
        """Replace the model's post-processing options (the tasks that have any say which)."""
        raise ValueError(f"postprocess={options}: a {self.task} model has no post-processing options")

    # ------------------------------------------------------------------ pictures
    def draw(self, image: Tensor, result: dict[str, Any], num_classes: int | None = None) -> Tensor:
        """A uint8 (3, H, W) picture of ``result`` on the uint8 (3, H, W) ``image``."""
        raise NotImplementedError

    def render_batch(self, pl_module: Any, batch: Any, settings: EvalSettings, class_names: Sequence[str] | None,
                     num_images: int, score_threshold: float) -> list[Tensor]:
        """Pictures of a validation batch (as the data module yields it, normalised as ``settings`` say) for
        TensorBoard."""
        raise NotImplementedError

    # ------------------------------------------------------------------ the web app (tools/app.py)
    #: whether a score threshold chooses which of a result's items are shown (the app's score slider)
    filters_by_score: bool = False

    def view(self, image: Tensor, result: dict[str, Any], score_threshold: float | None = None,
             num_classes: int | None = None) -> Tensor:
        """The picture the web app shows for ``result`` on the uint8 (3, H, W) ``image``: :meth:`draw`, unless
        the task shows more (the input beside a restored image) or less (detections above ``score_threshold``)."""
        return self.draw(image, result, num_classes)

    def record(self, result: dict[str, Any], score_threshold: float | None = None,
               class_name: Callable[[int], str] = lambda i: f"class_{i}") -> dict[str, Any]:
        """``result`` as JSON values: what the web app shows and downloads (detections above ``score_threshold``)."""
        raise NotImplementedError

    def describe(self, result: dict[str, Any], score_threshold: float | None = None,
                 class_name: Callable[[int], str] = lambda i: f"class_{i}") -> str:
        """One line that says what the model found (the web app's summary)."""
        raise NotImplementedError

    def top_classes(self, result: dict[str, Any]) -> dict[str, float] | None:
        """Class name -> probability, for tasks whose result is a ranking of classes; None for the others."""
        return None

    # ------------------------------------------------------------------ tools/predict.py
    def annotation_class_names(self, annotations: str | Path) -> list[str] | None:
        """Class names read from an annotation file given to ``tools/predict.py``, if the task has them."""
        return None

    def check_annotation_classes(self, annotations: str | Path, class_names: Sequence[str] | None,
                                 label_to_cat_id: dict[int, int] | None) -> None:
        """Refuse an annotation file given to ``tools/predict.py`` whose classes are not the model's, for tasks whose
        predictions name them; nothing for the others."""

    def with_category_ids(self, result: dict[str, Any], label_to_cat_id: dict[int, int] | None) -> dict[str, Any]:
        """A prediction with the dataset's category ids of its labels, for tasks that have them; as it is for others."""
        return result

    def write_predictions(self, images: Sequence[Any], results: Sequence[dict[str, Any]], stems: Sequence[str],
                          out: Path, predictor: Any, annotations: str | Path | None = None) -> list[dict[str, Any]]:
        """Write one picture per image into ``out`` and return the records of ``predictions.json``."""
        raise NotImplementedError

    def prediction_writer(self, out: Path, predictor: Any, sources: Sequence[str | None],
                          annotations: str | Path | None = None) -> PredictionWriter:
        """A writer that takes images batch by batch (``tools/predict.py`` streams them); ``sources`` are
        every input's path (or None), known before any is decoded, so that a task can check them first."""
        return PredictionWriter(self, out, predictor, annotations)

    def save_attention(self, predictor: Any, image: Any, out: Path, stem: str, score_threshold: float | None = None
                       ) -> Path | None:
        """The task's attention picture of one image, if its models have one (of the detections scoring above
        ``score_threshold`` where the picture shows detections; None: the best ones)."""
        log.warning("--attention: no attention picture for a %s model (%s)", self.task, type(predictor.model).__name__)
        return None

    # ------------------------------------------------------------------ export
    def onnx_wrapper(self, model: nn.Module) -> nn.Module:
        """A module whose ``forward(*inputs)`` takes :attr:`input_names` and returns :attr:`output_names`;
        by default ``images -> normalize_outputs(model(images))``."""
        return ImagesToTensorGraph(model, self)

    def onnx_output_names(self, model: nn.Module) -> tuple[str, ...]:
        """The graph's output names for ``model`` (:attr:`output_names` unless a model adds outputs)."""
        return self.output_names

    def dynamic_axes(self, model: nn.Module | None = None) -> dict[str, dict[int, str]]:
        """The graph's dynamic dimensions (``model``: the one exported, for adapters whose answer depends on it)."""
        return {name: {0: "batch"} for name in (*self.input_names, *self.output_names)}

    def onnx_disagreements(self, model: nn.Module, inputs: dict[str, Tensor], ref: Sequence[Tensor],
                           got: Sequence[Tensor], tolerance: Any) -> list[str]:
        """Beyond the raw outputs (compared by :func:`visiontf.inference.onnx_check.check_onnx`): what of the
        task's results, from PyTorch's outputs ``ref`` and onnxruntime's ``got`` on ``inputs``, differs more
        than ``tolerance`` (an :class:`~visiontf.inference.onnx_check.ExportTolerance`) allows; by default
        the raw outputs are what users consume, nothing more to compare."""
        return []

    def default_export_size(self, model: nn.Module) -> tuple[int, int]:
        cfg = pretrained_cfg(model)
        size = cfg.get("crop_size") or cfg.get("input_size", (3, 224, 224))
        return int(size[-2]), int(size[-1])

    def example_inputs(self, model: nn.Module, image_size: Sequence[int] | None = None, batch_size: int = 1,
                       pad: bool = False) -> dict[str, Tensor]:
        """Random normalised inputs of the graph's signature."""
        import torch

        h, w = tuple(image_size) if image_size else self.default_export_size(model)
        return {"images": torch.randn(batch_size, 3, h, w)}


class PredictionWriter:
    """Writes ``tools/predict.py``'s pictures as results come (:meth:`add`), and returns the records of
    ``predictions.json`` at the end (:meth:`finish`); by default through
    :meth:`TaskAdapter.write_predictions`."""

    def __init__(self, adapter: TaskAdapter, out: Path, predictor: Any, annotations: str | Path | None = None) -> None:
        self.adapter, self.out, self.predictor, self.annotations = adapter, Path(out), predictor, annotations
        self.records: list[dict[str, Any]] = []

    def add(self, images: Sequence[Any], results: Sequence[dict[str, Any]], stems: Sequence[str]) -> None:
        self.records.extend(self.adapter.write_predictions(images, results, stems, self.out, self.predictor,
                                                           self.annotations))

    def skip(self, count: int = 1) -> None:
        """``count`` inputs were not predicted (failed); a writer that tracks inputs by position moves on."""

    def finish(self) -> list[dict[str, Any]]:
        return self.records


def pretrained_cfg(model: nn.Module) -> dict[str, Any]:
    """The model's :class:`~visiontf.models.contract.PretrainedCfg` as ``pretrained_cfg`` keys (the set ones)."""
    return model.pretrained_cfg.to_dict()


class PreprocessModule(nn.Module):
    """Base of the eval preprocessing modules: complete ``settings`` (the task's :class:`EvalSettings`) and
    no parameters."""

    def __init__(self, settings: EvalSettings) -> None:
        super().__init__()
        self.settings = settings

    @property
    def cfg(self) -> dict[str, Any]:
        """The settings as plain data: what checkpoints (``preprocess``) and exports (``.labels.json``) store."""
        return self.settings.to_dict()

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.cfg.items())


class ImagesToTensorGraph(nn.Module):
    """ONNX graph of a one-input, one-output model: ``images`` (B, 3, H, W) normalised -> the adapter's
    normalised output (classification logits (B, K), segmentation logits (B, K, H, W))."""

    def __init__(self, model: nn.Module, adapter: TaskAdapter) -> None:
        super().__init__()
        self.model = model
        self.adapter = adapter

    def forward(self, images: Tensor) -> Tensor:
        return self.adapter.normalize_outputs(self.model(images))
