"""DEIM's MixUp of a training batch (``data.init_args.mixup``: :class:`MixUp`), done by the collate.

DEIM (Huang et al., CVPR 2025; its ``BatchImageCollateFunction``) mixes a batch, with probability ``prob`` and only in
its epoch window, with itself shifted by one: image ``i`` becomes ``r * image_i + (1 - r) * image_(i-1)`` with one ratio
``r`` uniform in ``[0.45, 0.55]`` (rounded to 6 decimals) for the whole batch, and keeps the boxes and labels of both
(its own first). DEIM draws it while it draws mosaics (``mixup_epochs`` = the mosaic window).

visiontf's batches are padded (images keep their aspect ratio), so a mixed image's valid area is the union of both:
its padding mask is where both were padding, its ``size`` the larger height and width, and both images' boxes are
expressed in that size. The draw is seeded by the data module's seed, the batch's epoch and its image ids, so it is the
same in every worker process and on resume. A batch of one image is left as it is (DEIM's shift would mix an image
with itself and double its boxes).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import torch
from torch import Tensor

from visiontf.data.batching import pad_images
from visiontf.data.loading import sample_seed

__all__ = ["MixUp", "MixUpCollate", "mix_batch"]

#: keeps the MixUp draw's seed apart from the samples' own (seed, epoch, index) seeds
_MIXUP_DRAW = 0x31C0


@dataclass(frozen=True)
class MixUp:
    """DEIM's MixUp, a data-module config section (``mixup: {prob: 0.5, epochs: [4, 64]}``).

    Args:
        prob: the probability that a training batch is mixed (DEIM: 0.5).
        epochs: ``(start, stop)``: mix only in epochs ``start <= epoch < stop`` (DEIM: its mosaic window); None: always.
        ratio: the range the mixing ratio is drawn from (DEIM: 0.45 to 0.55).
    """

    prob: float
    epochs: tuple[int, int] | None = None
    ratio: tuple[float, float] = (0.45, 0.55)

    def __post_init__(self) -> None:
        if not 0.0 <= self.prob <= 1.0:
            raise ValueError(f"mixup.prob must be in [0, 1], got {self.prob}")
        if self.epochs is not None:
            e = tuple(self.epochs)
            if len(e) != 2 or any(isinstance(v, bool) or int(v) != v for v in e) or not 0 <= e[0] <= e[1]:
                raise ValueError(f"mixup.epochs must be (start, stop) epochs with 0 <= start <= stop, got {self.epochs}")
            object.__setattr__(self, "epochs", (int(e[0]), int(e[1])))
        r = tuple(float(v) for v in self.ratio)
        if len(r) != 2 or not 0.0 <= r[0] <= r[1] <= 1.0:
            raise ValueError(f"mixup.ratio must be (low, high) with 0 <= low <= high <= 1, got {self.ratio}")
        object.__setattr__(self, "ratio", r)

    @classmethod
    def of(cls, value: MixUp | Mapping[str, Any]) -> MixUp:
        if isinstance(value, MixUp):
            return value
        if not isinstance(value, Mapping):
            raise TypeError(f"mixup: a mapping of {[f.name for f in fields(cls)]}, got {value!r}")
        unknown = sorted(set(value) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"mixup: unknown field(s) {unknown}; it has {[f.name for f in fields(cls)]}")
        return cls(**value)

    def as_dict(self) -> dict[str, Any]:
        return {"prob": self.prob, "epochs": None if self.epochs is None else list(self.epochs), "ratio": list(self.ratio)}

    def active(self, epoch: int | None) -> bool:
        """Whether ``epoch`` is in the window (a batch without an epoch is)."""
        return self.prob > 0 and (epoch is None or self.epochs is None or self.epochs[0] <= epoch < self.epochs[1])


def mix_batch(images: Tensor, mask: Tensor, targets: list[dict[str, Any]], ratio: float) -> tuple[Tensor, Tensor, list[dict]]:
    """Image ``i`` mixed with image ``i - 1`` (the batch shifted by one) at ``ratio``; both images' boxes and labels kept
    (its own first), in the union of the two valid areas (see the module's docstring)."""
    partner = torch.roll(torch.arange(len(targets)), 1).tolist()
    mixed = images * ratio + images[partner] * (1.0 - ratio)
    new_mask = mask & mask[partner]
    out = []
    for i, j in enumerate(partner):
        a, b = targets[i], targets[j]
        (ha, wa), (hb, wb) = a["size"].tolist(), b["size"].tolist()
        h, w = max(ha, hb), max(wa, wb)
        scale_a = torch.tensor([wa / w, ha / h, wa / w, ha / h], dtype=a["boxes"].dtype)
        scale_b = torch.tensor([wb / w, hb / h, wb / w, hb / h], dtype=b["boxes"].dtype)
        t = dict(a)
        # cxcywh normalised by each image's own size -> by the union's (both images start at the top left)
        t["boxes"] = torch.cat([a["boxes"] * scale_a, b["boxes"] * scale_b])
        t["labels"] = torch.cat([a["labels"], b["labels"]])
        t["size"] = torch.tensor([h, w], dtype=a["size"].dtype)
        if "masks" in a:
            t["masks"] = torch.cat([_pad_to(a["masks"], h, w), _pad_to(b["masks"], h, w)])
        out.append(t)
    return mixed, new_mask, out


def _pad_to(masks: Tensor, h: int, w: int) -> Tensor:
    out = masks.new_zeros((masks.shape[0], h, w))
    out[:, : masks.shape[1], : masks.shape[2]] = masks
    return out


class MixUpCollate:
    """The detection collate (:func:`visiontf.tasks.detection.coco_dataset.collate_detection`'s padding) with :class:`MixUp`.

    Each target carries its sample's ``epoch`` (the data module's epoch-tagged training dataset), which is removed here.
    """

    def __init__(self, mixup: MixUp, seed: int = 0, size_divisibility: int = 0) -> None:
        self.mixup, self.seed, self.size_divisibility = mixup, int(seed), int(size_divisibility)

    def __call__(self, batch: Sequence[tuple[Tensor, dict[str, Any]]]) -> tuple[Tensor, Tensor, list[dict[str, Any]]]:
        images, mask = pad_images([b[0] for b in batch], self.size_divisibility)
        targets = [dict(b[1]) for b in batch]
        epochs = {t.pop("epoch", None) for t in targets}
        epoch = max((e for e in epochs if e is not None), default=None)
        if len(targets) < 2 or not self.mixup.active(epoch):
            return images, mask, targets
        ids = [int(t.get("image_id", 0)) for t in targets]
        rng = np.random.default_rng(sample_seed(self.seed, _MIXUP_DRAW, -1 if epoch is None else epoch, *ids))
        if rng.random() >= self.mixup.prob:
            return images, mask, targets
        ratio = round(float(rng.uniform(*self.mixup.ratio)), 6)
        return mix_batch(images, mask, targets, ratio)
