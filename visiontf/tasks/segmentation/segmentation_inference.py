"""The segmentation adapter (SETR): mmseg's keep-ratio resize, whole or sliding-window inference,
label maps at the original resolution, mask overlays and the logits export."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from torch import Tensor, nn
from torchvision.transforms.v2 import functional as TF

from visiontf.data.transforms.segmentation import keep_ratio_size, resize_image_like_mmcv
from visiontf.tasks import drawing
from visiontf.tasks.eval_settings import EvalSettings, PredictOption, SettingsError
from visiontf.tasks.task_inference import PreprocessModule, TaskAdapter


@dataclass(frozen=True)
class SegmentationSettings(EvalSettings):
    """mmseg's test pipeline: an optional keep-ratio resize to ``resize`` (long, short; None keeps the
    original size), normalisation with ``mean``/``std``, then ``test_mode`` inference: ``"whole"`` images
    or ``"slide"`` windows of ``crop_size`` every ``stride`` ((h, w), an int, or None: the model's own)."""

    pixel_fields = ("resize", "crop_size", "stride")

    mean: tuple[float, ...] = tuple(IMAGENET_DEFAULT_MEAN)
    std: tuple[float, ...] = tuple(IMAGENET_DEFAULT_STD)
    resize: tuple[int, int] | None = None
    test_mode: str = "whole"
    crop_size: int | tuple[int, int] | None = None
    stride: int | tuple[int, int] | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.test_mode not in ("whole", "slide"):
            raise SettingsError(f"test_mode={self.test_mode!r}: use 'whole' or 'slide'")


class SegmentationPreprocess(PreprocessModule):
    """mmseg's test pipeline before the model (:class:`SegmentationSettings`: resize, normalise).

    The resize is mmseg's: mmcv's ``rescale_size`` rule and cv2 bilinear (``INTER_LINEAR``, no
    antialiasing) on the uint8 image, so a validation image and a predicted one are the same tensor.

    ``forward(image)``: one float (3, H, W) image in [0, 1] -> (1, 3, h, w) normalised.
    """

    settings: SegmentationSettings

    def forward(self, image: Tensor) -> Tensor:
        s = self.settings
        x = image
        if s.resize is not None:
            H, W = image.shape[-2:]
            x = resize_image_like_mmcv(x, keep_ratio_size(int(H), int(W), s.resize))
        return TF.normalize(x, list(s.mean), list(s.std))[None]


class SegmentationAdapter(TaskAdapter):
    """Semantic segmentation: ``(B, 3, H, W) -> logits (B, K, H, W)`` (SETR's training dict unwrapped)."""

    task = "segmentation"
    output_names = ("logits",)
    settings_type = SegmentationSettings
    predict_options = (
        PredictOption("--seg_mode", "test_mode", "segmentation inference: whole images or sliding windows "
                      "(default: the checkpoint's)", choices=("whole", "slide")),
    )

    def build_preprocess(self, settings: SegmentationSettings) -> SegmentationPreprocess:
        return SegmentationPreprocess(settings)

    def normalize_outputs(self, outputs: Tensor | dict[str, Any]) -> Tensor:
        """Main-head logits: SETR in training mode returns ``{"out": logits, "aux": [...]}``."""
        return outputs["out"] if isinstance(outputs, dict) else outputs

    def logits(self, model: nn.Module, preprocess: SegmentationPreprocess, image: Tensor) -> Tensor:
        """Logits (1, K, H, W) at the original size of one float (3, H, W) image in [0, 1]."""
        H, W = image.shape[-2:]
        x = preprocess(image)
        s = preprocess.settings
        logits = self.normalize_outputs(model.inference(x, s.test_mode, crop=s.crop_size, stride=s.stride))
        if logits.shape[-2:] != (H, W):
            logits = F.interpolate(logits.float(), size=(int(H), int(W)), mode="bilinear", align_corners=False)
        return logits

    def predict(self, model: nn.Module, preprocess: nn.Module, images: Sequence[Tensor], *,
                score_threshold: float | None = None, top_k: int | None = None,
                class_name: Callable[[int], str] = lambda i: f"class_{i}") -> list[dict[str, Any]]:
        """``label_map`` (H, W) int64 at each image's original resolution."""
        # one image per pass: sizes differ and whole/slide inference pads each image itself
        return [{"label_map": self.logits(model, preprocess, im).argmax(dim=1)[0].to(torch.int64).cpu()} for im in images]

    def draw(self, image: Tensor, result: dict[str, Any], num_classes: int | None = None) -> Tensor:
        return drawing.draw_segmentation(image, result["label_map"], num_classes)

    def record(self, result: dict[str, Any], score_threshold: float | None = None,
               class_name: Callable[[int], str] = lambda i: f"class_{i}") -> dict[str, Any]:
        """Each class present: its pixel count and its mask as COCO's run-length encoding (pycocotools)."""
        import numpy as np
        from pycocotools import mask as mask_utils

        label_map = result["label_map"]
        labels, counts = torch.unique(label_map, return_counts=True)
        classes = []
        for label, count in zip(labels.tolist(), counts.tolist()):
            rle = mask_utils.encode(np.asfortranarray((label_map == label).numpy().astype(np.uint8)))
            classes.append({"label": int(label), "class_name": class_name(int(label)), "pixels": int(count),
                            "mask_rle": {"size": [int(v) for v in rle["size"]], "counts": rle["counts"].decode("ascii")}})
        classes.sort(key=lambda c: -c["pixels"])
        return {"size": [int(v) for v in label_map.shape], "classes": classes}

    def describe(self, result: dict[str, Any], score_threshold: float | None = None,
                 class_name: Callable[[int], str] = lambda i: f"class_{i}") -> str:
        classes = self.record(result, class_name=class_name)
        total = max(1, classes["size"][0] * classes["size"][1])
        return f"{len(classes['classes'])} classes: " + ", ".join(
            f"{c['class_name']} {100 * c['pixels'] / total:.1f}%" for c in classes["classes"][:8])

    def render_batch(self, pl_module: Any, batch: Any, settings: SegmentationSettings,
                     class_names: Sequence[str] | None, num_images: int, score_threshold: float) -> list[Tensor]:
        """Ground truth | prediction overlays, side by side.

        Batches of mmseg's protocol (``(images, masks, sizes)``, masks at their original size) are drawn
        at the image's size: the padding cropped, the annotation resized (nearest) to the image.
        """
        model = pl_module.model
        images, masks = batch[0][:num_images], batch[1][:num_images]
        logits = pl_module.predict_logits(images) if hasattr(pl_module, "predict_logits") else model(images)
        pred = self.normalize_outputs(logits).argmax(dim=1)
        k = model.num_classes
        ignore = int((getattr(pl_module, "hparams", None) or {}).get("ignore_index", 255))
        sizes = batch[2][:num_images].tolist() if len(batch) > 2 else [None] * len(images)
        out = []
        for img, p, gt, size in zip(images, pred, masks, sizes):
            if size is not None:
                h, w, H0, W0 = size
                img, p = img[:, :h, :w], p[:h, :w]
                gt = F.interpolate(gt[None, None, :H0, :W0].float(), size=(h, w), mode="nearest")[0, 0].long()
            base = drawing.denormalize(img, settings.mean, settings.std)
            gt_img = drawing.draw_segmentation(base, gt.cpu(), k, ignore_index=ignore)
            pred_img = drawing.draw_segmentation(base, p.cpu(), k, ignore_index=ignore)
            out.append(torch.cat([gt_img, pred_img], dim=-1))
        return out

    def write_predictions(self, images: Sequence[Any], results: Sequence[dict[str, Any]], stems: Sequence[str],
                          out: Path, predictor: Any, annotations: str | Path | None = None) -> list[dict[str, Any]]:
        """Overlays, and the label maps as palette PNGs (pixel value = class) named in the records."""
        records = []
        for im, r, stem in zip(images, results, stems):
            drawing.save_image(self.draw(im.uint8(), r, predictor.num_classes), out / f"{stem}.png")
            drawing.label_map_image(r["label_map"]).save(out / f"{stem}_labels.png")
            records.append({"file": im.source, "label_map": f"{stem}_labels.png"})
        return records
