"""Monocular depth, the worked example of adding a task: the task, its inference side, its data and synthetic set.

Everything that belongs to this task alone is in this package; what several tasks share is in the layers
below (``visiontf.data``, ``visiontf.evaluation``, ``visiontf.set_prediction``, ``visiontf.models``) and in
``visiontf.tasks``'s own modules. Names resolve lazily, so importing one module of the package imports no other.
"""
from visiontf.core.lazy import lazy_getattr

_LAZY = {
    "DepthTask": "visiontf.tasks.depth.depth_task",
    "DepthAdapter": "visiontf.tasks.depth.depth_inference",
    "DepthDataModule": "visiontf.tasks.depth.depth_data",
    "make_depth_dataset": "visiontf.tasks.depth.depth_synthetic",
}

__all__ = sorted(_LAZY)


__getattr__ = lazy_getattr(__name__, _LAZY, globals())
