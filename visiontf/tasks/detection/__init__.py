"""Detection, with instance and panoptic masks: the task, its inference side (post-processing to original pixels,
drawing, attention pictures, predictions files, ONNX graph), its COCO and YOLO data, synthetic sets and metrics.

Everything that belongs to this task alone is in this package; what several tasks share is in the layers
below (``visiontf.data``, ``visiontf.evaluation``, ``visiontf.set_prediction``, ``visiontf.models``) and in
``visiontf.tasks``'s own modules. Names resolve lazily, so importing one module of the package imports no other.
"""
from visiontf.core.lazy import lazy_getattr

_LAZY = {
    "DetectionTask": "visiontf.tasks.detection.detection_task",
    "DetectionAdapter": "visiontf.tasks.detection.detection_inference",
    "CocoDataModule": "visiontf.tasks.detection.coco_data",
    "CocoPanopticDataModule": "visiontf.tasks.detection.coco_panoptic_data",
    "make_detection_dataset": "visiontf.tasks.detection.detection_synthetic",
    "make_panoptic_dataset": "visiontf.tasks.detection.panoptic_synthetic",
    "CocoMetric": "visiontf.tasks.detection.coco_metric",
}

__all__ = sorted(_LAZY)


__getattr__ = lazy_getattr(__name__, _LAZY, globals())
