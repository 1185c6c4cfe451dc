"""The detection adapter (DETR and every family with its output convention): DETR's eval resize,
padded batches, post-processing to original pixels, boxes, COCO results files and the detector export.

A detection model takes ``(images (B, 3, H, W), mask (B, H, W) bool, True on padding, or None)`` and
returns ``pred_logits`` and ``pred_boxes`` (normalised cxcywh relative to each unpadded image). How
logits become scores is the model's ``class_head``; :func:`visiontf.set_prediction.build_postprocess`
picks the matching post-processing, so a new family plugs in without changes here.
"""
from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from torch import Tensor, nn
from torchvision.transforms.v2 import InterpolationMode
from torchvision.transforms.v2 import functional as TF

from visiontf.core.errors import UsageError
from visiontf.data.batching import PaddedBatch, pad_images, size_buckets
from visiontf.data.transforms.detection import resized_hw
from visiontf.set_prediction import build_postprocess, set_postprocess
from visiontf.set_prediction.agreement import detections_disagreement
from visiontf.tasks import attention_pictures as attention
from visiontf.tasks import drawing
from visiontf.tasks.detection import deformable_attention
from visiontf.tasks.detection import mask_drawing as masks
from visiontf.tasks.eval_settings import EvalSettings, PredictOption, at_least, boolean
from visiontf.tasks.task_inference import PredictionWriter, PreprocessModule, TaskAdapter, pretrained_cfg

log = logging.getLogger(__name__)


def detection_resize(image: Tensor, min_size: int, max_size: int | None) -> Tensor:
    """DETR's eval resize of a float (3, H, W) image: shorter side ``min_size``, longer at most ``max_size``."""
    h, w = image.shape[-2:]
    out = resized_hw(int(h), int(w), int(min_size), None if max_size is None else int(max_size))
    if tuple(out) == (h, w):
        return image
    return TF.resize(image, list(out), interpolation=InterpolationMode.BILINEAR, antialias=True).clamp(0.0, 1.0)


#: attention picture by a model's ``attention_picture`` attribute (DETR has none: ``"maps"``):
#: (module, function of (predictor, image) giving the data, function saving it as a PNG)
ATTENTION_PICTURES: dict[str, tuple[Callable, Callable]] = {
    "maps": (attention.detr_attention_maps, attention.save_detr_attention_figure),
    "sampling_points": (deformable_attention.deformable_sampling_points, deformable_attention.save_sampling_points_figure),
}


@dataclass(frozen=True)
class DetectionSettings(EvalSettings):
    """DETR's eval transform: the shorter side resized to ``min_size``, the longer one at most ``max_size``
    (None: no cap), normalised with ``mean``/``std``."""

    pixel_fields = ("min_size", "max_size")

    min_size: int = 800
    max_size: int | None = 1333
    mean: tuple[float, ...] = tuple(IMAGENET_DEFAULT_MEAN)
    std: tuple[float, ...] = tuple(IMAGENET_DEFAULT_STD)

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "min_size", int(self.min_size))
        object.__setattr__(self, "max_size", None if self.max_size is None else int(self.max_size))


class DetectionPreprocess(PreprocessModule):
    """DETR's eval preprocessing (:class:`DetectionSettings`), then zero-padding to a common size.

    ``forward(images)``: float (3, H_i, W_i) images in [0, 1] -> (:class:`PaddedBatch` with images
    (B, 3, H, W) and mask (B, H, W), the resized (h_i, w_i) of each image).
    """

    settings: DetectionSettings

    def forward(self, images: Sequence[Tensor]) -> tuple[PaddedBatch, list[tuple[int, int]]]:
        s = self.settings
        resized = [detection_resize(im, s.min_size, s.max_size) for im in images]
        sizes = [(int(r.shape[-2]), int(r.shape[-1])) for r in resized]
        return pad_images([TF.normalize(r, list(s.mean), list(s.std)) for r in resized]), sizes


class DetectionAdapter(TaskAdapter):
    """Object detection: ``(images, mask) -> pred_logits (B, Q, C), pred_boxes (B, Q, 4)``."""

    task = "detection"
    input_names = ("images", "mask")
    output_names = ("pred_logits", "pred_boxes")
    trace_batch_size = 2  # the second example image is padded, so the padded path is traced
    onnx_set_axis = 1  # queries: two-stage selection may order exactly tied ones either way
    settings_type = DetectionSettings
    predict_options = (
        PredictOption("--min_size", "min_size", "shorter side (default: the checkpoint's)", type=at_least(1)),
        PredictOption("--max_size", "max_size", "longer side cap (default: the checkpoint's)", type=at_least(1)),
        PredictOption("--postprocess.nms_iou_threshold", "nms_iou_threshold", "NMS IoU (0 or -1: no NMS; default: the "
                      "checkpoint's)", section="postprocess", type=float),
        PredictOption("--postprocess.nms_class_agnostic", "nms_class_agnostic", "NMS over all labels or within each "
                      "label (default: the checkpoint's)", section="postprocess", type=boolean, metavar="{true,false}"),
        PredictOption("--postprocess.num_top", "num_top", "detections kept per image before NMS (default: the "
                      "checkpoint's)", section="postprocess", type=at_least(1)),
    )

    def build_preprocess(self, settings: DetectionSettings) -> DetectionPreprocess:
        return DetectionPreprocess(settings)

    def predict(self, model: nn.Module, preprocess: nn.Module, images: Sequence[Tensor], *,
                score_threshold: float | None = None, top_k: int | None = None,
                class_name: Callable[[int], str] = lambda i: f"class_{i}") -> list[dict[str, Any]]:
        """``boxes`` (N, 4) xyxy in original pixels, ``scores``, ``labels``, ``class_names``: detections
        with ``score > score_threshold`` (None keeps all), at most ``top_k``, sorted by score.

        Images of one size go through the model together, each size apart: a padded batch would change
        the detections (:mod:`visiontf.data.batching`), so they do not depend on the batch size."""
        results: list[dict[str, Any]] = [{} for _ in images]
        for group in size_buckets([tuple(im.shape[-2:]) for im in images]):
            same_size = self._predict_batch(model, preprocess, [images[i] for i in group], score_threshold, top_k, class_name)
            for i, r in zip(group, same_size):
                results[i] = r
        return results

    def _predict_batch(self, model: nn.Module, preprocess: nn.Module, images: Sequence[Tensor],
                       score_threshold: float | None, top_k: int | None, class_name: Callable[[int], str]
                       ) -> list[dict[str, Any]]:
        batch, resized = preprocess(images)
        # no mask when nothing is padded: the model then takes its fused attention path
        outputs = model(batch.images, batch.mask if batch.padded else None)
        # boxes are relative to each image's unpadded extent, so the original (h, w) maps them straight
        # back to original pixels, whatever the resize and padding were
        orig = torch.tensor([tuple(im.shape[-2:]) for im in images], device=batch.images.device)
        preds = build_postprocess(model)(outputs, orig, score_threshold=score_threshold,
                                         top_k=None if top_k is None else int(top_k))
        if model.mask_options is not None:  # instance masks (and panoptic segments) at the original sizes
            masks.add_mask_results(model, preds, outputs, resized, orig)
        results, dropped = [], 0
        for p, (h, w) in zip(preds, orig.tolist()):
            # a diverged model's NaN/infinite outputs are no detections (they would be invalid JSON)
            finite = torch.isfinite(p["boxes"]).all(dim=1) & torch.isfinite(p["scores"])
            dropped += int((~finite).sum())
            # inside the image: a box the model extends past the border is clipped to it (x0 = -15 before)
            p["boxes"][:, 0::2] = p["boxes"][:, 0::2].clamp(0, w)
            p["boxes"][:, 1::2] = p["boxes"][:, 1::2].clamp(0, h)
            labels = p["labels"][finite].cpu()
            results.append({"boxes": p["boxes"][finite].cpu(), "scores": p["scores"][finite].cpu(), "labels": labels,
                            "class_names": [class_name(int(i)) for i in labels]})
            if "masks" in p:
                results[-1]["masks"] = p["masks"][finite].cpu()
            if "panoptic" in p:
                results[-1]["panoptic"] = p["panoptic"]
        if dropped:
            log.warning("dropped %d detection(s) with NaN or infinite boxes or scores in a batch of %d image(s): the model's "
                        "outputs are not finite (a diverged run?)", dropped, len(images))
        return results

    def set_postprocess(self, model: nn.Module, options: dict[str, Any]) -> None:
        """NMS IoU, NMS over all labels or per label, detections kept (:func:`visiontf.set_prediction.set_postprocess`)."""
        set_postprocess(model, **options)

    def draw(self, image: Tensor, result: dict[str, Any], num_classes: int | None = None) -> Tensor:
        """Boxes, over the instance masks as a coloured overlay when the result has them."""
        return drawing.draw_detections(masks.draw_masks(image, result), result)

    filters_by_score = True

    def view(self, image: Tensor, result: dict[str, Any], score_threshold: float | None = None,
             num_classes: int | None = None) -> Tensor:
        """Boxes above ``score_threshold`` on the image, enlarged to a shorter side of 384 pixels when it is
        smaller (so that labels stay legible on small images)."""
        if result.get("masks") is not None and score_threshold is not None:
            keep = result["scores"] > score_threshold
            result = {**result, **{k: result[k][keep] for k in ("boxes", "scores", "labels", "masks")}}
        big, scale = drawing.upscale(masks.draw_masks(image, result), min_side=384)
        return drawing.draw_detections(big, {**result, "boxes": result["boxes"] * scale}, score_threshold=score_threshold)

    def record(self, result: dict[str, Any], score_threshold: float | None = None,
               class_name: Callable[[int], str] = lambda i: f"class_{i}") -> dict[str, Any]:
        """Detections scoring more than ``score_threshold``, best first: label, class name, score, box xyxy in
        the image's pixels."""
        scores = result["scores"].float()
        keep = [i for i in scores.argsort(descending=True).tolist() if score_threshold is None or scores[i] > score_threshold]
        names = result.get("class_names") or [class_name(int(label)) for label in result["labels"]]
        return {"score_threshold": score_threshold, "detections": [
            {"label": int(result["labels"][i]), "class_name": str(names[i]), "score": round(float(scores[i]), 4),
             "box_xyxy": [round(float(v), 2) for v in result["boxes"][i]]} for i in keep]}

    def describe(self, result: dict[str, Any], score_threshold: float | None = None,
                 class_name: Callable[[int], str] = lambda i: f"class_{i}") -> str:
        found = self.record(result, score_threshold, class_name)["detections"]
        above = f" with score > {score_threshold:.2f}" if score_threshold is not None else ""
        return f"{len(found)} detection{'s' if len(found) != 1 else ''}{above}" + (
            ": " + ", ".join(f"{d['class_name']} {d['score']:.2f}" for d in found[:8]) + (" ..." if len(found) > 8 else "")
            if found else "")

    def render_batch(self, pl_module: Any, batch: Any, settings: DetectionSettings,
                     class_names: Sequence[str] | None, num_images: int, score_threshold: float) -> list[Tensor]:
        """Boxes with ``score > score_threshold`` on the augmented (unpadded) images of the batch."""
        model = pl_module.model
        images, mask, targets = batch
        images, mask, targets = images[:num_images], mask[:num_images], targets[:num_images]
        outputs = model(images, mask)
        # boxes on the augmented (unpadded) image that is drawn, not on the original file
        sizes = torch.stack([t["size"] for t in targets]).to(images.device)
        preds = build_postprocess(model)(outputs, sizes, score_threshold=score_threshold)
        if model.mask_options is not None:
            masks.add_instance_masks(preds, outputs, sizes, sizes, model.mask_options.mask_threshold)
        out = []
        for img, p, t in zip(images, preds, targets):
            h, w = (int(v) for v in t["size"])
            picture = masks.draw_masks(drawing.denormalize(img[:, :h, :w], settings.mean, settings.std), p)
            out.append(drawing.draw_detections(picture, p, class_names))
        return out

    def annotation_class_names(self, annotations: str | Path) -> list[str] | None:
        from visiontf.tasks.detection.coco_annotations import load_coco_json, parse_categories

        return parse_categories(load_coco_json(annotations), Path(annotations))[1]

    def check_annotation_classes(self, annotations: str | Path, class_names: Sequence[str] | None,
                                 label_to_cat_id: dict[int, int] | None) -> None:
        """predictions.json names each detection by the model's category id: an annotation file without those ids, or
        with other classes under them, would get results for categories it does not have."""
        from visiontf.tasks.detection.coco_annotations import load_coco_json, parse_categories

        if not label_to_cat_id:
            return
        in_file = dict(zip(*parse_categories(load_coco_json(annotations), Path(annotations))))
        names = list(class_names or [])
        wrong = [(cat, names[label] if label < len(names) else None) for label, cat in sorted(label_to_cat_id.items())
                 if cat not in in_file or (label < len(names) and in_file[cat] != names[label])]
        if wrong:
            shown = ", ".join(f"{name}={cat}" if name else str(cat) for cat, name in wrong[:6])
            listed = ", ".join(f"{name}={cat}" for cat, name in list(in_file.items())[:6])
            raise UsageError(f"--annotations {annotations}: the model predicts categories the file does not list as such "
                             f"({shown}; the file has {listed}{', ...' if len(in_file) > 6 else ''}); give the annotation "
                             "file of the data the model was trained on, or predict without --annotations")

    def with_category_ids(self, result: dict[str, Any], label_to_cat_id: dict[int, int] | None) -> dict[str, Any]:
        """``category_ids``: the labels as the dataset's category ids (-1 for a label no category has)."""
        if label_to_cat_id is not None and "labels" in result:
            result["category_ids"] = torch.tensor([label_to_cat_id.get(int(label), -1) for label in result["labels"]],
                                                  dtype=torch.int64)
        return result

    def write_predictions(self, images: Sequence[Any], results: Sequence[dict[str, Any]], stems: Sequence[str],
                          out: Path, predictor: Any, annotations: str | Path | None = None) -> list[dict[str, Any]]:
        """Pictures with boxes, and COCO results-format detections (image ids from ``annotations`` by file
        name, else the numeric file stem, else the input index)."""
        writer = self.prediction_writer(out, predictor, [im.source for im in images], annotations)
        writer.add(images, results, stems)
        return writer.finish()

    def prediction_writer(self, out: Path, predictor: Any, sources: Sequence[str | None],
                          annotations: str | Path | None = None) -> _DetectionWriter:
        """Image ids for every input are matched before any inference (:func:`image_ids`), so an
        ambiguous match stops the run before it starts."""
        ids, ann_l2c = image_ids(list(sources), annotations)
        return _DetectionWriter(self, out, predictor, annotations, ids, ann_l2c)

    def save_attention(self, predictor: Any, image: Any, out: Path, stem: str, score_threshold: float | None = None
                       ) -> Path | None:
        """The attention picture of the model's kind (:data:`ATTENTION_PICTURES`): DETR's decoder and
        encoder attention maps, Deformable DETR's sampling points (the papers' figures), for the
        detections scoring above ``score_threshold`` (None: the best ones, as for the results)."""
        kind = predictor.model.attention_picture
        if kind not in ATTENTION_PICTURES:
            raise ValueError(f"{type(predictor.model).__name__}.attention_picture = {kind!r}; known: {sorted(ATTENTION_PICTURES)}")
        compute, save = ATTENTION_PICTURES[kind]
        threshold = 0.0 if score_threshold is None else float(score_threshold)
        return save(compute(predictor, [image.tensor], score_threshold=threshold), out / f"{stem}_attention.png")

    def onnx_wrapper(self, model: nn.Module) -> nn.Module:
        return _DetectorGraph(model)

    def onnx_output_names(self, model: nn.Module) -> tuple[str, ...]:
        """``pred_logits``, ``pred_boxes``, and ``pred_masks`` for a model with a mask head."""
        return self.output_names + (("pred_masks",) if model.mask_options is not None else ())

    def dynamic_axes(self, model: nn.Module | None = None) -> dict[str, dict[int, str]]:
        """Batch, height and width dynamic, for every detector (Deformable DETR's and DINO's level shapes,
        valid ratios, reference points and proposals are computed in the graph from the input's size)."""
        axes = {"images": {0: "batch", 2: "height", 3: "width"}, "mask": {0: "batch", 1: "height", 2: "width"},
                "pred_logits": {0: "batch"}, "pred_boxes": {0: "batch"}}
        if model is not None and model.mask_options is not None:
            axes["pred_masks"] = {0: "batch", 2: "mask_height", 3: "mask_width"}
        return axes

    def onnx_disagreements(self, model: nn.Module, inputs: dict[str, Tensor], ref: Sequence[Tensor],
                           got: Sequence[Tensor], tolerance: Any) -> list[str]:
        """The model's post-processed detections of both (boxes in pixels of each image's unpadded size,
        scores, labels), compared allowing near ties to swap (:func:`detections_disagreement`)."""
        # the unpadded extent of each image: its unmasked rows and columns
        valid = ~inputs["mask"].bool()
        sizes = torch.stack([valid.any(2).sum(1), valid.any(1).sum(1)], 1)
        post = build_postprocess(model)
        names = self.onnx_output_names(model)
        dets_ref, dets_got = (post(dict(zip(names, outs)), sizes) for outs in (ref, got))
        problems = []
        for i, (r, g, hw) in enumerate(zip(dets_ref, dets_got, sizes.tolist())):
            why = detections_disagreement(r, g, tolerance.score_atol, tolerance.box_rtol * max(hw))
            if why:
                problems.append(f"detections of image {i} ({hw[0]}x{hw[1]}): {why}")
        return problems

    def default_export_size(self, model: nn.Module) -> tuple[int, int]:
        """``min_size`` square (the graph takes any size; this is only the traced example's)."""
        s = int(pretrained_cfg(model).get("min_size", 800))
        return s, s

    def example_inputs(self, model: nn.Module, image_size: Sequence[int] | None = None, batch_size: int = 1,
                       pad: bool = False) -> dict[str, Tensor]:
        """Random normalised images and an all-False mask; with ``pad`` the images after the first are padded."""
        h, w = tuple(image_size) if image_size else self.default_export_size(model)
        images = torch.randn(batch_size, 3, h, w)
        mask = torch.zeros(batch_size, h, w, dtype=torch.bool)
        if pad and batch_size > 1:
            mask[1:, h * 3 // 4 :, :] = True
            mask[1:, :, w * 2 // 3 :] = True
            images[1:] = images[1:].masked_fill(mask[1:, None], 0.0)
        return {"images": images, "mask": mask}


class _DetectionWriter(PredictionWriter):
    """Pictures with boxes as results come, COCO results-format records with the ids matched up front."""

    def __init__(self, adapter: DetectionAdapter, out: Path, predictor: Any, annotations: str | Path | None,
                 ids: Sequence[int | None], ann_l2c: dict[int, int] | None) -> None:
        super().__init__(adapter, out, predictor, annotations)
        self.ids, self.ann_l2c = list(ids), ann_l2c
        self.position = 0
        self.missing: list[str | None] = []
        self.images: list[dict[str, Any]] = []  # without annotations: which file each image id is
        options = predictor.model.mask_options
        # a panoptic model's PNG per image and panoptic.json (COCO panoptic results), besides predictions.json
        self.panoptic = None if options is None or not options.panoptic else masks.PanopticFiles(
            self.out, predictor.label_to_cat_id or ann_l2c, predictor.class_name,
            lambda label: label in set(options.thing_classes))

    def add(self, images: Sequence[Any], results: Sequence[dict[str, Any]], stems: Sequence[str]) -> None:
        ids = self.ids[self.position : self.position + len(images)]
        self.position += len(images)
        for im, r, stem, i in zip(images, results, stems, ids):
            drawing.save_image(self.adapter.draw(im.uint8(), r), self.out / f"{stem}.png")
            if self.panoptic is not None and "panoptic" in r:
                self.panoptic.add(r["panoptic"], stem, None if i is None else int(i))
                drawing.save_image(masks.panoptic_picture(im.uint8(), r["panoptic"]), self.out / f"{stem}_segments.png")
            if i is None:
                self.missing.append(im.source)
            else:
                self.images.append({"id": int(i), "file_name": im.source or f"{stem}.png", "height": im.size[0],
                                    "width": im.size[1]})
        self.records.extend(coco_results(results, ids, self.predictor.label_to_cat_id or self.ann_l2c))

    def skip(self, count: int = 1) -> None:
        """Inputs that were not predicted (failed): their ids are passed over."""
        self.position += count

    def finish(self) -> list[dict[str, Any]]:
        if self.missing and self.annotations:
            log.warning("%d images are not in %s and are left out of predictions.json (e.g. %s)",
                        len(self.missing), self.annotations, self.missing[:3])
        if not self.annotations:
            # the image ids of predictions.json were numbered here: images.json says which file each is
            (self.out / "images.json").write_text(json.dumps(self.images, indent=1) + "\n")
        if self.panoptic is not None:
            self.panoptic.finish()
        return self.records


class _DetectorGraph(nn.Module):
    """ONNX: ``images`` (B, 3, H, W) normalised, ``mask`` (B, H, W) bool -> ``pred_logits``, ``pred_boxes``
    (and ``pred_masks`` (B, Q, H/4, W/4) mask logits for a model with a mask head)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, images: Tensor, mask: Tensor) -> tuple[Tensor, ...]:
        out = self.model(images, mask)
        if "pred_masks" in out:
            return out["pred_logits"], out["pred_boxes"], out["pred_masks"]
        return out["pred_logits"], out["pred_boxes"]


def image_ids(files: Sequence[str | None], annotations: str | Path | None) -> tuple[list[int | None], dict[int, int] | None]:
    """COCO image ids from an annotation file, matched by its relative ``file_name``
    (:func:`visiontf.tasks.detection.image_ids.match_image_ids`: an ambiguous match is an error listing the clashes),
    else the numeric file names when all are numbers and distinct, else 1..N in input order; with an
    annotation file also its label -> category id table."""
    if annotations:
        from visiontf.tasks.detection.coco_annotations import load_coco_json, parse_categories
        from visiontf.tasks.detection.image_ids import match_image_ids

        data = load_coco_json(annotations)
        ids = match_image_ids(files, data.get("images", []), annotations)
        cat_ids, _ = parse_categories(data, Path(annotations))
        return ids, dict(enumerate(cat_ids))
    # COCO-style numeric names (000000000139.jpg) keep their numbers when every name has a distinct one;
    # otherwise 1..N in input order, since camA/0001.jpg and camB/0001.jpg, or 1.jpg and a.jpg, would share one
    stems = [Path(f).stem if f else "" for f in files]
    numbers = [int(s) if s.isdigit() else None for s in stems]
    if None not in numbers and len(set(numbers)) == len(numbers):
        return list(numbers), None
    return list(range(1, len(files) + 1)), None


def coco_results(results: Sequence[dict[str, Any]], image_ids: Sequence[int | None],
                 label_to_cat_id: dict[int, int] | None) -> list[dict[str, Any]]:
    """COCO results-format detections ``{"image_id", "category_id", "bbox" [x, y, w, h], "score"}``, with
    ``"segmentation"`` (compressed RLE at the original size) where the result has ``masks``."""
    out = []
    for r, image_id in zip(results, image_ids):
        if image_id is None:
            continue
        rles = masks.mask_records(r) if "masks" in r else None
        for k, (box, score, label) in enumerate(zip(r["boxes"].tolist(), r["scores"].tolist(), r["labels"].tolist())):
            x0, y0, x1, y1 = box
            cat = label_to_cat_id.get(int(label), int(label)) if label_to_cat_id else int(label)
            out.append({"image_id": int(image_id), "category_id": int(cat),
                        "bbox": [round(x0, 2), round(y0, 2), round(x1 - x0, 2), round(y1 - y0, 2)], "score": round(float(score), 5)})
            if rles is not None:
                out[-1]["segmentation"] = rles[k]
    return out
