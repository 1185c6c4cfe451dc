"""COCO mask AP (COCOeval ``segm``) of instance masks as a torchmetrics Metric that is exact under DDP.

Masks are RLE-encoded with pycocotools at the original image size as they come (compressed bytes
are what crosses ranks), repeated images are kept once by image id as in
:class:`~visiontf.tasks.detection.coco_metric.CocoMetric`, and COCOeval scores them against the original
annotation file (its polygons and crowd RLE) with :func:`~visiontf.evaluation.coco.evaluate_coco`.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pycocotools import mask as mask_utils
from torchmetrics import Metric
from torchmetrics.utilities import dim_zero_cat

from visiontf.core.distributed import get_rank
from visiontf.evaluation.coco import METRIC_NAMES, CocoEvalError, evaluate_coco

__all__ = ["CocoMaskMetric", "encode_masks"]

log = logging.getLogger(__name__)
_RANK_STRIDE = 1 << 40


def _cat(state: list[torch.Tensor] | torch.Tensor) -> np.ndarray | None:
    """A list state as one array (after a DDP sync it is already one tensor); None when empty."""
    if isinstance(state, list) and not state:
        return None
    return dim_zero_cat(state).cpu().numpy()


def encode_masks(masks: torch.Tensor) -> list[dict[str, Any]]:
    """(n, H, W) bool masks -> COCO compressed RLEs ``{"size": [H, W], "counts": str}`` (JSON-ready)."""
    if len(masks) == 0:
        return []
    array = np.asfortranarray(masks.detach().to("cpu", torch.uint8).permute(1, 2, 0).numpy())
    return [{"size": [int(s) for s in r["size"]], "counts": r["counts"].decode("ascii")} for r in mask_utils.encode(array)]


class CocoMaskMetric(Metric):
    """The 12 COCOeval ``segm`` stats of postprocessed instance masks.

    Args: as :class:`~visiontf.tasks.detection.coco_metric.CocoMetric` (``ann_file`` needs each annotation's
    ``segmentation``).

    ``update(preds, image_ids)``: ``preds`` one dict per image with ``masks`` (n, H, W) bool at the
    ORIGINAL size, ``scores`` and ``labels`` (n,). ``compute()`` returns :data:`METRIC_NAMES` (``map``...)
    and sets ``last_table``.
    """

    is_differentiable = False
    higher_is_better = True
    full_state_update = False

    def __init__(self, ann_file: str | Path, label_to_cat_id: Mapping[int, int] | Sequence[int], backend: str = "auto",
                 num_classes: int | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.ann_file = Path(ann_file)
        if not self.ann_file.is_file():
            raise FileNotFoundError(f"{self.ann_file}: annotation file for CocoMaskMetric not found")
        items = label_to_cat_id.items() if isinstance(label_to_cat_id, Mapping) else enumerate(label_to_cat_id)
        self.label_to_cat_id = {int(k): int(v) for k, v in items}
        self.backend, self.num_classes = backend, num_classes
        self.last_table: str | None = None
        self._counter = 0
        for name in ("det_scores", "det_labels", "det_keys", "rle_bytes", "rle_lengths", "rle_sizes", "img_ids", "img_keys"):
            self.add_state(name, default=[], dist_reduce_fx="cat")

    def update(self, preds: Sequence[Mapping[str, torch.Tensor]], image_ids: Sequence[int] | torch.Tensor) -> None:
        image_ids = torch.as_tensor(image_ids, dtype=torch.int64).reshape(-1).tolist()
        if len(preds) != len(image_ids):
            raise ValueError(f"CocoMaskMetric.update: {len(preds)} predictions but {len(image_ids)} image ids")
        d = self.device
        for pred, image_id in zip(preds, image_ids):
            key = get_rank() * _RANK_STRIDE + self._counter
            self._counter += 1
            rles = encode_masks(pred["masks"])
            counts = [r["counts"].encode("ascii") for r in rles]
            self.det_scores.append(torch.as_tensor(pred["scores"], device=d).reshape(-1).float())
            self.det_labels.append(torch.as_tensor(pred["labels"], device=d).reshape(-1).long())
            self.det_keys.append(torch.full((len(rles),), key, dtype=torch.int64, device=d))
            self.rle_bytes.append(torch.from_numpy(np.frombuffer(b"".join(counts), dtype=np.uint8).copy()).to(d))
            self.rle_lengths.append(torch.tensor([len(c) for c in counts], dtype=torch.int64, device=d))
            self.rle_sizes.append(torch.tensor([r["size"] for r in rles], dtype=torch.int64, device=d).reshape(-1, 2))
            self.img_ids.append(torch.tensor([image_id], dtype=torch.int64, device=d))
            self.img_keys.append(torch.tensor([key], dtype=torch.int64, device=d))

    def results(self) -> tuple[list[dict], list[int]]:
        """De-duplicated COCO ``segm`` results (one copy per image id) and the evaluated image ids."""
        img_ids, img_keys = _cat(self.img_ids), _cat(self.img_keys)
        if img_ids is None or not len(img_ids):
            return [], []
        first: dict[int, int] = {}
        for i, k in sorted(zip(img_ids.tolist(), img_keys.tolist())):
            first.setdefault(i, k)
        key_to_image = {k: i for i, k in first.items()}
        keys = _cat(self.det_keys)
        if keys is None or not len(keys):
            return [], sorted(first)
        scores = _cat(self.det_scores).astype(np.float64)
        labels = _cat(self.det_labels)
        lengths = _cat(self.rle_lengths)
        sizes = _cat(self.rle_sizes).reshape(-1, 2)
        blob = _cat(self.rle_bytes).tobytes()
        ends = np.cumsum(lengths)
        results, unmapped = [], 0
        for j, (key, score, label) in enumerate(zip(keys.tolist(), scores.tolist(), labels.tolist())):
            if key not in key_to_image or not np.isfinite(score):
                continue
            cat = self.label_to_cat_id.get(int(label))
            if cat is None:
                if self.num_classes is not None and 0 <= label < self.num_classes:
                    unmapped += 1  # a class with no category: COCOeval would not score it either
                    continue
                raise CocoEvalError(f"CocoMaskMetric: predicted label {label} has no category id in label_to_cat_id "
                                    f"(labels 0..{len(self.label_to_cat_id) - 1}); check the model's num_classes against "
                                    f"{self.ann_file}")
            counts = blob[ends[j] - lengths[j]: ends[j]].decode("ascii")
            results.append({"image_id": key_to_image[key], "category_id": cat, "score": score,
                            "segmentation": {"size": sizes[j].tolist(), "counts": counts}})
        if unmapped:
            log.info("CocoMaskMetric: %d mask(s) of class indices with no category not scored", unmapped)
        return results, sorted(first)

    def compute(self) -> dict[str, torch.Tensor]:
        results, img_ids = self.results()
        if not img_ids:
            return {name: torch.tensor(-1.0) for name in METRIC_NAMES}
        stats = evaluate_coco(self.ann_file, results, backend=self.backend, iou_type="segm", img_ids=img_ids)
        self.last_table = stats.table
        return {name: torch.tensor(value, dtype=torch.float32) for name, value in zip(METRIC_NAMES, stats.values())}
