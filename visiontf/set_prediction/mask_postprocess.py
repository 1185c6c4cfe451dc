"""DETR's mask post-processing (facebookresearch/detr ``PostProcessSegm`` and ``PostProcessPanoptic``).

* Instance masks (:func:`instance_masks`, :class:`PostProcessSegm`): a query's mask logits are
  upsampled (bilinear) to the largest processed image of the batch, thresholded after a sigmoid,
  cropped to the image's processed size and resized (nearest) to its original size.
* Panoptic segments (:func:`panoptic_segments`, :class:`PostProcessPanoptic`): the queries whose class
  score is above a threshold (and not "no object") compete for each pixel (softmax over their mask
  logits at the processed size, argmax); the queries of one stuff class merge into one segment; ids
  are resized (nearest, through the PNG colours as the original) to the target size; segments of at
  most ``min_area`` pixels are dropped and the rest recomputed (without merging again), until none is.

The arithmetic is the original's (``tests/set_prediction/test_detr_segm_postprocess.py`` compares with its results, recorded
in ``tests/fixtures/detr/postprocess.safetensors``); the work is per image and, for
instance masks, in chunks of queries, so that a COCO-sized batch of 100 queries does not hold
100 full-size float masks at once.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import Tensor, nn

from visiontf.io.panoptic_ids import id2rgb, png_bytes, rgb2id

__all__ = ["PostProcessPanoptic", "PostProcessSegm", "add_instance_masks", "instance_masks", "panoptic_segments"]

#: queries upsampled to full size at once (memory: chunk x H x W floats)
_CHUNK = 16


def _sizes(sizes: Tensor | Sequence[Sequence[int]]) -> list[tuple[int, int]]:
    return [(int(h), int(w)) for h, w in torch.as_tensor(sizes).reshape(-1, 2).tolist()]


def instance_masks(masks: Tensor, processed_size: tuple[int, int], padded_size: tuple[int, int],
                   orig_size: tuple[int, int], threshold: float = 0.5) -> Tensor:
    """(n, h4, w4) mask logits of one image -> (n, H, W) bool masks at its original size.

    ``padded_size`` is what the original upsamples to: the largest processed (h, w) of the batch.
    """
    out = torch.zeros((len(masks), *orig_size), dtype=torch.bool, device=masks.device)
    h, w = processed_size
    for start in range(0, len(masks), _CHUNK):
        m = F.interpolate(masks[start:start + _CHUNK, None].float(), size=padded_size, mode="bilinear", align_corners=False)
        m = (m.sigmoid() > threshold)[:, :, :h, :w]
        out[start:start + _CHUNK] = F.interpolate(m.float(), size=orig_size, mode="nearest")[:, 0] > 0.5
    return out


def add_instance_masks(preds: list[dict[str, Any]], outputs: Mapping[str, Tensor], processed_sizes: Any, orig_sizes: Any,
                       threshold: float = 0.5) -> list[dict[str, Any]]:
    """Set ``masks`` (n, H, W) bool on each image's detections (:func:`~visiontf.set_prediction.build_postprocess`'s
    results, whose ``queries`` say which query each is), at the original sizes."""
    processed, orig = _sizes(processed_sizes), _sizes(orig_sizes)
    padded = (max(h for h, _ in processed), max(w for _, w in processed))
    for i, p in enumerate(preds):
        queries = p["queries"].to(outputs["pred_masks"].device)
        p["masks"] = instance_masks(outputs["pred_masks"][i, queries], processed[i], padded, orig[i], threshold)
    return preds


class PostProcessSegm(nn.Module):
    """The original's ``PostProcessSegm``: ``forward(results, outputs, orig_target_sizes, max_target_sizes)``
    sets ``results[i]["masks"]`` (Q, 1, H, W) uint8 for every query."""

    def __init__(self, threshold: float = 0.5) -> None:
        super().__init__()
        self.threshold = threshold

    @torch.no_grad()
    def forward(self, results: list[dict], outputs: Mapping[str, Tensor], orig_target_sizes: Tensor,
                max_target_sizes: Tensor) -> list[dict]:
        processed, orig = _sizes(max_target_sizes), _sizes(orig_target_sizes)
        padded = (max(h for h, _ in processed), max(w for _, w in processed))
        for i, masks in enumerate(outputs["pred_masks"]):
            results[i]["masks"] = instance_masks(masks, processed[i], padded, orig[i], self.threshold)[:, None].to(torch.uint8).cpu()
        return results


def _segment_ids(masks: Tensor, hw: tuple[int, int], target: tuple[int, int], merge: Tensor | None) -> tuple[np.ndarray, np.ndarray]:
    """Each pixel's segment (argmax of the softmax over the masks), merged by ``merge`` (segment -> the one it
    joins), resized (nearest, as a PNG image) to ``target``; and each segment's area there."""
    h, w = hw
    n = masks.shape[0]
    if n == 0:
        ids = torch.zeros((h, w), dtype=torch.long)
    else:
        ids = masks.transpose(0, 1).softmax(-1).argmax(-1).view(h, w).cpu()
        if merge is not None:
            ids = merge.cpu()[ids]
    # PIL's nearest resize of the colours, as the original does (torch's nearest picks other pixels)
    img = Image.fromarray(id2rgb(ids.numpy())).resize((target[1], target[0]), Image.NEAREST)
    ids_np = rgb2id(np.asarray(img))
    return ids_np, np.bincount(ids_np.ravel(), minlength=n)[:n]


def panoptic_segments(logits: Tensor, masks: Tensor, processed_size: tuple[int, int], target_size: tuple[int, int],
                      is_thing: Sequence[bool] | Mapping[int, bool], threshold: float = 0.85,
                      min_area: int = 4, class_head: str = "softmax") -> tuple[np.ndarray, list[dict[str, Any]]]:
    """One image's panoptic segmentation: ``(ids (H, W) int64, segments_info)``.

    Args:
        logits: (Q, K + 1) class logits, the last "no object" (``class_head`` "softmax", DETR's); or (Q, K)
            sigmoid logits (``"sigmoid"``, the Deformable DETR family: a query's score is its best class's).
        masks: (Q, h4, w4) mask logits.
        processed_size: the (h, w) the image had in the model (before padding).
        target_size: the (H, W) of the result.
        is_thing: per class index, whether it is a thing (the original's ``is_thing_map``).

    ``segments_info``: ``{"id", "isthing", "category_id" (the class index), "area"}`` per segment, ids
    0..n-1 as the original (0 is a segment, not "void").
    """
    if class_head == "sigmoid":
        scores, labels = logits.sigmoid().max(-1)
        keep = scores > threshold
    else:
        scores, labels = logits.softmax(-1).max(-1)
        keep = labels.ne(logits.shape[-1] - 1) & (scores > threshold)
    labels, masks = labels[keep], masks[keep]
    masks = F.interpolate(masks[:, None], size=processed_size, mode="bilinear", align_corners=False)[:, 0].flatten(1)
    classes = labels.tolist()
    # the queries of one stuff class become one segment: the first of them
    merge = torch.arange(len(classes))
    first_of: dict[int, int] = {}
    for k, c in enumerate(classes):
        if not is_thing[c]:
            merge[k] = first_of.setdefault(c, k)
    ids, area = _segment_ids(masks, processed_size, target_size, merge)
    while len(classes):
        small = torch.as_tensor(area <= min_area)
        if not small.any():
            break
        masks = masks[~small]
        classes = [c for c, s in zip(classes, small.tolist()) if not s]
        ids, area = _segment_ids(masks, processed_size, target_size, None)  # the original merges only once
    info = [{"id": i, "isthing": bool(is_thing[c]), "category_id": int(c), "area": int(a)}
            for i, (c, a) in enumerate(zip(classes, area.tolist()))]
    return ids, info


class PostProcessPanoptic(nn.Module):
    """The original's ``PostProcessPanoptic(is_thing_map, threshold)``: ``forward(outputs, processed_sizes,
    target_sizes=None)`` gives ``{"png_string", "segments_info"}`` per image (the COCO panoptic format)."""

    def __init__(self, is_thing_map: Mapping[int, bool], threshold: float = 0.85, min_area: int = 4) -> None:
        super().__init__()
        self.is_thing_map = is_thing_map
        self.threshold = threshold
        self.min_area = min_area

    @torch.no_grad()
    def forward(self, outputs: Mapping[str, Tensor], processed_sizes: Any, target_sizes: Any = None) -> list[dict[str, Any]]:
        processed = _sizes(processed_sizes)
        targets = processed if target_sizes is None else _sizes(target_sizes)
        preds = []
        for logits, masks, size, target in zip(outputs["pred_logits"], outputs["pred_masks"], processed, targets):
            ids, info = panoptic_segments(logits, masks, size, target, self.is_thing_map, self.threshold, self.min_area)
            preds.append({"png_string": png_bytes(ids), "segments_info": info})
        return preds
