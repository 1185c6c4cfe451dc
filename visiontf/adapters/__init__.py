"""One adapter per task: everything visiontf does with a model outside training, in one place.

An adapter (:class:`~visiontf.adapters.base.TaskAdapter`) owns, for its task, the eval
preprocessing (an ``nn.Module`` built from the model's ``pretrained_cfg``), the normalisation of
model outputs, post-processing back to original pixels, drawing, the ONNX wrapper and its graph
signature, and what ``tools/predict.py`` writes. The Predictor, ``LogPredictionImages``, the export
and predict tools and the attention pictures ask :func:`get_adapter` instead of branching on the task.

Adapters are found through the registry's tags (``create_model`` records the model's name; its
entry's tags name the task); :data:`~visiontf.adapters.task_table.TASK_TABLE` maps each task to its
adapter. Names resolve lazily; each adapter class is in its task's module
(``visiontf.adapters.<task>``).
"""
from visiontf.core.lazy import lazy_getattr

_LAZY = {
    "TASKS": "visiontf.adapters.task_table",
    "TASK_TABLE": "visiontf.adapters.task_table",
    "TaskAdapter": "visiontf.adapters.base",
    "adapter_for_task": "visiontf.adapters.base",
    "get_adapter": "visiontf.adapters.base",
    "infer_task": "visiontf.adapters.base",
    "EvalSettings": "visiontf.adapters.settings",
    "PredictOption": "visiontf.adapters.settings",
}

__all__ = sorted(_LAZY)


__getattr__ = lazy_getattr(__name__, _LAZY, globals())
