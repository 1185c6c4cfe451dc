"""A detector's post-processing settings, as torchvision keeps ``score_thresh``/``nms_thresh`` on the model.

They live with the model (saved in its constructor arguments, so a checkpoint carries them) and can be
replaced at evaluation or prediction without touching a weight: :func:`visiontf.set_prediction.set_postprocess`.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PostprocessOptions:
    """How raw detector outputs become detections.

    Args:
        num_top: detections kept per image before NMS (Deformable DETR 100, DINO 300); None keeps one
            per query (DETR's softmax post-processing).
        nms_iou_threshold: suppress a detection overlapping a higher-scoring kept one by more than this
            IoU; None (the default of every published model) keeps every detection.
        nms_class_agnostic: NMS over all labels (DINO's) or within each label.
    """

    num_top: int | None = None
    nms_iou_threshold: float | None = None
    nms_class_agnostic: bool = True

    def __post_init__(self) -> None:
        if self.num_top is not None and self.num_top < 1:
            raise ValueError(f"num_top must be >= 1 or None, got {self.num_top}")
        if self.nms_iou_threshold is not None and not 0.0 < self.nms_iou_threshold <= 1.0:
            raise ValueError(f"nms_iou_threshold must be in (0, 1] or None (no NMS), got {self.nms_iou_threshold} "
                             "(DINO's -1 for 'off' is None here)")
