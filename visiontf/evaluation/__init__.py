"""Evaluation metrics of every task: COCO box mAP (detection) with its per-class numbers, confusion matrix and
TIDE breakdown, mIoU (segmentation), PSNR/SSIM (restoration).

Names resolve lazily: ``visiontf.evaluation.coco`` must stay importable without torch (fast
command-line evaluation of results files), while ``CocoMetric`` needs torchmetrics.
"""
from visiontf.core.lazy import lazy_getattr

_LAZY = {
    "evaluate_coco": "visiontf.evaluation.coco",
    "CocoEvalError": "visiontf.evaluation.coco",
    "CocoStats": "visiontf.evaluation.coco",
    "STAT_NAMES": "visiontf.evaluation.coco",
    "METRIC_NAMES": "visiontf.evaluation.coco",
    "COCO_STATS": "visiontf.evaluation.coco",
    "per_class_rows": "visiontf.evaluation.readouts.per_class",
    "detection_confusion_matrix": "visiontf.evaluation.readouts.confusion",
    "tide_errors": "visiontf.evaluation.readouts.tide",
}

__all__ = sorted(_LAZY)


__getattr__ = lazy_getattr(__name__, _LAZY, globals())
