"""The DETR family's Hungarian matcher, set criterion and post-processing (torch, torchvision, scipy only)."""
from visiontf.detection.criterion import SetCriterion
from visiontf.detection.matcher import HungarianMatcher
from visiontf.detection.postprocess import DeformablePostProcess, PostProcess, build_postprocess

__all__ = ["HungarianMatcher", "SetCriterion", "PostProcess", "DeformablePostProcess", "build_postprocess"]
