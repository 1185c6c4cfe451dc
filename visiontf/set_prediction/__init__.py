"""The DETR family's Hungarian matcher, set criterion and post-processing (torch, torchvision, scipy only)."""
from visiontf.set_prediction.criterion import SetCriterion
from visiontf.set_prediction.matcher import HungarianMatcher
from visiontf.set_prediction.postprocess import DeformablePostProcess, PostProcess, build_postprocess, set_postprocess
from visiontf.set_prediction.set_loss import SET_LOSS_BY_CLASS_HEAD, build_criterion

__all__ = [
    "HungarianMatcher", "SetCriterion", "PostProcess", "DeformablePostProcess", "build_postprocess", "set_postprocess",
    "build_criterion", "SET_LOSS_BY_CLASS_HEAD",
]
