"""Semantic segmentation: the task (SETR), its inference side, its data, synthetic set and mIoU.

Everything that belongs to this task alone is in this package; what several tasks share is in the layers
below (``visiontf.data``, ``visiontf.evaluation``, ``visiontf.set_prediction``, ``visiontf.models``) and in
``visiontf.tasks``'s own modules. Names resolve lazily, so importing one module of the package imports no other.
"""
from visiontf.core.lazy import lazy_getattr

_LAZY = {
    "SegmentationTask": "visiontf.tasks.segmentation.segmentation_task",
    "SegmentationAdapter": "visiontf.tasks.segmentation.segmentation_inference",
    "SegmentationDataModule": "visiontf.tasks.segmentation.segmentation_data",
    "make_segmentation_dataset": "visiontf.tasks.segmentation.segmentation_synthetic",
    "segmentation_scores": "visiontf.tasks.segmentation.segmentation_metric",
}

__all__ = sorted(_LAZY)


__getattr__ = lazy_getattr(__name__, _LAZY, globals())
