"""Image classification: the task (ViT, DeiT), its inference side, its ImageFolder data and synthetic set.

Everything that belongs to this task alone is in this package; what several tasks share is in the layers
below (``visiontf.data``, ``visiontf.evaluation``, ``visiontf.set_prediction``, ``visiontf.models``) and in
``visiontf.tasks``'s own modules. Names resolve lazily, so importing one module of the package imports no other.
"""
from visiontf.core.lazy import lazy_getattr

_LAZY = {
    "ClassificationTask": "visiontf.tasks.classification.classification_task",
    "ClassificationAdapter": "visiontf.tasks.classification.classification_inference",
    "ClassificationDataModule": "visiontf.tasks.classification.classification_data",
    "make_classification_dataset": "visiontf.tasks.classification.classification_synthetic",
}

__all__ = sorted(_LAZY)


__getattr__ = lazy_getattr(__name__, _LAZY, globals())
