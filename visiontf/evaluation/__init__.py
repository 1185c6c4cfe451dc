"""Evaluation metrics.

Names resolve lazily: ``visiontf.evaluation.coco`` must stay importable without torch (fast
command-line evaluation of results files), while ``CocoMetric`` needs torchmetrics.
"""
from importlib import import_module

_LAZY = {
    "evaluate_coco": "visiontf.evaluation.coco",
    "CocoEvalError": "visiontf.evaluation.coco",
    "CocoStats": "visiontf.evaluation.coco",
    "STAT_NAMES": "visiontf.evaluation.coco",
    "CocoMetric": "visiontf.evaluation.coco_metric",
}

__all__ = sorted(_LAZY)


def __getattr__(name):
    if name in _LAZY:
        value = getattr(import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'visiontf.evaluation' has no attribute {name!r}")
