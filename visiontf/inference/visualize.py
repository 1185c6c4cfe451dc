"""Former home of the drawing functions, now :mod:`visiontf.adapters.drawing` (the task adapters
draw with them); kept so ``visiontf.inference.visualize`` imports keep working."""
from visiontf.adapters.drawing import (  # noqa: F401
    PALETTE,
    classification_caption,
    color_for,
    draw_caption,
    draw_detections,
    draw_segmentation,
    label_map_image,
    save_image,
    to_uint8_chw,
)
