"""A mask-predicting detector's results at inference: instance masks and panoptic segments, their pictures,
and the files ``tools/predict.py`` writes.

* :func:`add_mask_results`: each image's ``masks`` (n, H, W) bool at its original size, one per detection
  (DETR's ``PostProcessSegm``), and with thing classes its ``panoptic`` segmentation: ``{"ids"`` (H, W)
  int64 segment ids, ``"segments_info"``} (DETR's ``PostProcessPanoptic``; ``category_id`` a class index).
* :func:`draw_masks`: the masks as a coloured overlay in each class's colour (boxes are drawn on top).
* :class:`PanopticFiles`: ``<stem>_panoptic.png`` (the COCO panoptic PNG, ids as colours, 0 unlabelled:
  :func:`coco_panoptic`) per image and
  ``panoptic.json`` (``annotations`` with ``segments_info`` in the dataset's category ids, and
  ``categories`` with ``isthing``): the COCO panoptic results format that
  :func:`visiontf.evaluation.panoptic.pq_compute` and panopticapi score.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch import Tensor
from torchvision.utils import draw_segmentation_masks

from visiontf.io.panoptic_ids import id2rgb
from visiontf.set_prediction.mask_postprocess import add_instance_masks, panoptic_segments
from visiontf.tasks.drawing import color_for, to_uint8_chw

__all__ = ["PanopticFiles", "add_mask_results", "coco_panoptic", "draw_masks", "mask_records"]


def add_mask_results(model: Any, preds: list[dict[str, Any]], outputs: dict, processed: Sequence[tuple[int, int]],
                     orig: Tensor) -> None:
    """Set ``masks`` on every image's detections, and ``panoptic`` when the model knows its thing classes."""
    options = model.mask_options
    add_instance_masks(preds, outputs, processed, orig, options.mask_threshold)
    if not options.panoptic:
        return
    is_thing = options.is_thing_map(model.num_classes + 1)
    for i, (p, size, target) in enumerate(zip(preds, processed, orig.tolist())):
        ids, info = panoptic_segments(outputs["pred_logits"][i].float(), outputs["pred_masks"][i].float(), tuple(size),
                                      tuple(target), is_thing, options.panoptic_threshold, options.min_area, model.class_head)
        p["panoptic"] = {"ids": ids, "segments_info": info}


def draw_masks(image: Any, result: dict[str, Any], alpha: float = 0.45) -> Tensor:
    """The result's ``masks`` over the image in each detection's class colour (uint8 (3, H, W))."""
    img = to_uint8_chw(image)
    masks = result.get("masks")
    if masks is None or len(masks) == 0:
        return img
    labels = torch.as_tensor(result["labels"]).reshape(-1).tolist()
    return draw_segmentation_masks(img, torch.as_tensor(masks).bool().cpu(), alpha=alpha,
                                   colors=[color_for(l) for l in labels])


def panoptic_picture(image: Any, panoptic: dict[str, Any], alpha: float = 0.55) -> Tensor:
    """Every panoptic segment over the image: things in their class colour, stuff in a lighter one."""
    img = to_uint8_chw(image)
    ids = torch.as_tensor(panoptic["ids"])
    segments = panoptic["segments_info"]
    if not segments:
        return img
    masks = torch.stack([ids == s["id"] for s in segments])
    colours = [color_for(s["category_id"]) if s["isthing"] else tuple(min(255, c // 2 + 128) for c in color_for(s["category_id"]))
               for s in segments]
    return draw_segmentation_masks(img, masks, alpha=alpha, colors=colours)


def mask_records(result: dict[str, Any]) -> list[dict[str, Any]]:
    """COCO compressed RLEs (``{"size": [H, W], "counts": str}``) of the result's masks, in detection order."""
    from visiontf.tasks.detection.coco_mask_metric import encode_masks

    return encode_masks(torch.as_tensor(result["masks"]))


def coco_panoptic(panoptic: dict[str, Any]) -> tuple[np.ndarray, list[dict[str, Any]]]:
    """A result's ``panoptic`` (DETR's ids, numbered from 0) as a COCO panoptic pair: ``(ids (H, W) int64,
    segments_info)`` where 0 is unlabelled (COCO reserves it), each listed segment is its id + 1, a pixel of
    no listed segment is 0, and only segments with pixels are listed, with their pixel count as ``area``.

    So every pair passes :func:`visiontf.evaluation.panoptic.pq_compute`'s checks (each id of the PNG is
    listed, each listed id is in the PNG); an image without segments is all 0 with an empty list (the
    ids + 1 written before made it all 1, an id that no segment lists)."""
    ids = np.asarray(panoptic["ids"]).astype(np.int64)
    top = int(ids.max(initial=0))
    listed = [s for s in panoptic["segments_info"] if 0 <= int(s["id"]) <= top]
    table = np.zeros(top + 1, dtype=np.int64)  # DETR's id -> the file's: listed ids + 1, anything else 0
    for s in listed:
        table[int(s["id"])] = int(s["id"]) + 1
    out = np.where(ids >= 0, table[np.clip(ids, 0, top)], 0)
    area = np.bincount(out.ravel(), minlength=top + 2)
    segments = [{**s, "id": int(s["id"]) + 1, "area": int(area[int(s["id"]) + 1])} for s in listed
                if area[int(s["id"]) + 1] > 0]
    return out, segments


class PanopticFiles:
    """``tools/predict.py``'s panoptic output: one PNG per image and ``panoptic.json`` at :meth:`finish`."""

    def __init__(self, out: Path, label_to_cat_id: dict[int, int] | None, class_name: Callable[[int], str],
                 is_thing: Callable[[int], bool]) -> None:
        self.out, self.label_to_cat_id, self.class_name, self.is_thing = Path(out), label_to_cat_id, class_name, is_thing
        self.annotations: list[dict[str, Any]] = []
        self.labels: set[int] = set()

    def add(self, panoptic: dict[str, Any], stem: str, image_id: int | None) -> None:
        """Write ``<stem>_panoptic.png`` and keep its ``segments_info``: always a valid COCO panoptic pair."""
        name = f"{stem}_panoptic.png"
        ids, segments = coco_panoptic(panoptic)
        Image.fromarray(id2rgb(ids)).save(self.out / name)
        for s in segments:
            self.labels.add(int(s["category_id"]))
            s["category_id"] = self._cat(int(s["category_id"]))
        self.annotations.append({"image_id": image_id, "file_name": name, "segments_info": segments})

    def _cat(self, label: int) -> int:
        return self.label_to_cat_id.get(label, label) if self.label_to_cat_id else label

    def finish(self) -> Path:
        categories = [{"id": self._cat(label), "name": self.class_name(label), "isthing": int(self.is_thing(label))}
                      for label in sorted(self.labels)]
        path = self.out / "panoptic.json"
        path.write_text(json.dumps({"annotations": self.annotations, "categories": categories}, indent=1) + "\n")
        return path
