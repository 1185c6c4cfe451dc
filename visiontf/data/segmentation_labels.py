"""Label conventions of the segmentation datasets: class tables, layouts and the ignore value.

``LAYOUTS`` gives each supported on-disk layout its split folder names, class table, whether label 0
means "other" (ADE20K's reduce-zero-label), mmseg's base scale (long, short) and how evaluation
scores it (``eval_protocol``: ``"mmseg"`` scores the annotation at its original size, as mmseg's
published numbers; ``"resized"`` scores the annotation resized with the image).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from visiontf.core.errors import UserError

#: the label of unlabeled and padded pixels, left out of the loss and the metrics
IGNORE_INDEX = 255

ADE20K_CLASSES = (
    "wall", "building", "sky", "floor", "tree", "ceiling", "road", "bed", "windowpane", "grass", "cabinet",
    "sidewalk", "person", "earth", "door", "table", "mountain", "plant", "curtain", "chair", "car", "water",
    "painting", "sofa", "shelf", "house", "sea", "mirror", "rug", "field", "armchair", "seat", "fence", "desk",
    "rock", "wardrobe", "lamp", "bathtub", "railing", "cushion", "base", "box", "column", "signboard",
    "chest of drawers", "counter", "sand", "sink", "skyscraper", "fireplace", "refrigerator", "grandstand",
    "path", "stairs", "runway", "case", "pool table", "pillow", "screen door", "stairway", "river", "bridge",
    "bookcase", "blind", "coffee table", "toilet", "flower", "book", "hill", "bench", "countertop", "stove",
    "palm", "kitchen island", "computer", "swivel chair", "boat", "bar", "arcade machine", "hovel", "bus",
    "towel", "light", "truck", "tower", "chandelier", "awning", "streetlight", "booth", "television receiver",
    "airplane", "dirt track", "apparel", "pole", "land", "bannister", "escalator", "ottoman", "bottle",
    "buffet", "poster", "stage", "van", "ship", "fountain", "conveyer belt", "canopy", "washer", "plaything",
    "swimming pool", "stool", "barrel", "basket", "waterfall", "tent", "bag", "minibike", "cradle", "oven",
    "ball", "food", "step", "tank", "trade name", "microwave", "pot", "animal", "bicycle", "lake",
    "dishwasher", "screen", "blanket", "sculpture", "hood", "sconce", "vase", "traffic light", "tray",
    "ashcan", "fan", "pier", "crt screen", "plate", "monitor", "bulletin board", "shower", "radiator",
    "glass", "clock", "flag",
)
CITYSCAPES_CLASSES = (
    "road", "sidewalk", "building", "wall", "fence", "pole", "traffic light", "traffic sign", "vegetation",
    "terrain", "sky", "person", "rider", "car", "truck", "bus", "train", "motorcycle", "bicycle",
)

#: Per-layout defaults: split folder names, class table, reduce-zero-label, mmseg's base scale and eval protocol.
LAYOUTS: dict[str, dict[str, Any]] = {
    "generic": {"train_split": "train", "val_split": "val", "classes": None, "reduce_zero_label": False,
                "base_size": (2048, 512), "eval_protocol": "resized"},
    "ade20k": {"train_split": "training", "val_split": "validation", "classes": ADE20K_CLASSES,
               "reduce_zero_label": True, "base_size": (2048, 512), "eval_protocol": "mmseg"},
    "cityscapes": {"train_split": "train", "val_split": "val", "classes": CITYSCAPES_CLASSES,
                   "reduce_zero_label": False, "base_size": (2048, 1024), "eval_protocol": "mmseg"},
}
#: how evaluation scores: the annotation at its original size (mmseg) or resized with the image
EVAL_PROTOCOLS = ("mmseg", "resized")


class LabelError(UserError, ValueError):
    """A mask holds labels outside ``[0, num_classes)`` other than the ignore value (``strict=True``)."""


def reduce_zero_label(mask: np.ndarray, ignore_index: int = IGNORE_INDEX) -> np.ndarray:
    """ADE20K convention: label 0 ("other") becomes ignore, every other label moves down by one."""
    out = mask.astype(np.int32) - 1
    out[mask == 0] = ignore_index
    out[mask == ignore_index] = ignore_index
    return out.astype(np.uint8)
