"""How a mask-predicting detector's masks become instance masks and panoptic segments.

The settings live with the model (its constructor arguments, so checkpoints carry them), as
:class:`~visiontf.models.postprocess_options.PostprocessOptions` do for boxes; a detector without a mask
head has none (``Detector.mask_options`` is None).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MaskOptions:
    """Post-processing settings of DETR's mask head (facebookresearch/detr ``PostProcessSegm`` /
    ``PostProcessPanoptic``).

    Args:
        mask_threshold: an instance mask is the pixels whose sigmoid is above this (the original 0.5).
        panoptic_threshold: panoptic segments come from the queries whose class score is above this
            (the original 0.85).
        thing_classes: the class indices that are things (countable objects); the others are stuff,
            and a stuff class's segments merge into one. None: every class is a thing (instance
            segmentation only; no panoptic output). The published panoptic models: 0..90.
        min_area: a panoptic segment of at most this many pixels is dropped and the rest recomputed
            (the original 4).
    """

    mask_threshold: float = 0.5
    panoptic_threshold: float = 0.85
    thing_classes: tuple[int, ...] | None = None
    min_area: int = 4

    def __post_init__(self) -> None:
        for name in ("mask_threshold", "panoptic_threshold"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {value}")
        if self.min_area < 0:
            raise ValueError(f"min_area must be >= 0, got {self.min_area}")
        if self.thing_classes is not None:
            things = tuple(int(c) for c in self.thing_classes)
            if any(c < 0 for c in things) or len(set(things)) != len(things):
                raise ValueError(f"thing_classes must be distinct class indices >= 0, got {list(things)[:10]}")
            object.__setattr__(self, "thing_classes", tuple(sorted(things)))

    @property
    def panoptic(self) -> bool:
        """Whether things and stuff are known, so that panoptic segments can be made."""
        return self.thing_classes is not None

    def is_thing_map(self, num_classes: int) -> dict[int, bool]:
        """``{class index: is a thing}`` for ``num_classes`` classes, the original's ``is_thing_map``."""
        things = set(self.thing_classes or range(num_classes))
        return {i: i in things for i in range(num_classes)}
