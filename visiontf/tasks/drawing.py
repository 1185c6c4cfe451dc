"""Drawing predictions on images with torchvision's drawing utilities, and saving them (used by the adapters)."""
from __future__ import annotations

import functools
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torchvision.utils import draw_bounding_boxes, draw_segmentation_masks

log = logging.getLogger(__name__)

#: a fixed, high-contrast palette (matplotlib's tab20 order), so a class keeps its colour everywhere
PALETTE: tuple[tuple[int, int, int], ...] = (
    (31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189),
    (140, 86, 75), (227, 119, 194), (127, 127, 127), (188, 189, 34), (23, 190, 207),
    (174, 199, 232), (255, 187, 120), (152, 223, 138), (255, 152, 150), (197, 176, 213),
    (196, 156, 148), (247, 182, 210), (199, 199, 199), (219, 219, 141), (158, 218, 229),
)


def color_for(label: int) -> tuple[int, int, int]:
    """The palette colour of a class label."""
    return PALETTE[int(label) % len(PALETTE)]


def to_uint8_chw(image: Any) -> Tensor:
    """A uint8 (3, H, W) tensor from a CHW/HWC tensor or array (uint8, or float in [0, 1]) or a PIL image."""
    from PIL import Image

    if isinstance(image, Image.Image):
        image = np.asarray(image.convert("RGB"))
    t = torch.as_tensor(np.ascontiguousarray(image)) if isinstance(image, np.ndarray) else image.detach().cpu()
    if t.dim() == 2:
        t = t[None]
    if t.dim() != 3:
        raise ValueError(f"expected one image (C, H, W) or (H, W, C), got shape {tuple(t.shape)}")
    if t.shape[0] not in (1, 3) and t.shape[-1] in (1, 3, 4):
        t = t[..., :3].permute(2, 0, 1)
    if t.shape[0] == 1:
        t = t.expand(3, -1, -1)
    if t.shape[0] != 3:
        raise ValueError(f"expected 1 or 3 channels, got shape {tuple(t.shape)}")
    if t.dtype != torch.uint8:
        if not t.is_floating_point():
            raise ValueError(f"integer images must be uint8, got {t.dtype}")
        t = (t.float() * 255.0).round().clamp(0, 255).to(torch.uint8)
    return t.contiguous()


@functools.lru_cache(maxsize=1)
def _font_path() -> str | None:
    """A TrueType font (matplotlib's DejaVu Sans), so label text can be sized; None falls back to PIL's bitmap font."""
    try:
        from matplotlib import font_manager

        return font_manager.findfont("DejaVu Sans", fallback_to_default=True)
    except Exception:  # noqa: BLE001 - drawing works without it, only smaller
        return None


def _font_size(h: int, w: int) -> int:
    return max(10, min(h, w) // 30)


def draw_detections(
    image: Any,
    result: Mapping[str, Any],
    class_names: Sequence[str] | None = None,
    score_threshold: float | None = None,
    width: int | None = None,
    font_size: int | None = None,
) -> Tensor:
    """Boxes labelled ``"name 0.87"`` in each class's palette colour; returns uint8 (3, H, W).

    ``result`` holds ``boxes`` (N, 4) xyxy in this image's pixels, ``labels`` and optionally
    ``scores`` and ``class_names`` (used when ``class_names`` is not given).
    """
    img = to_uint8_chw(image)
    boxes = torch.as_tensor(result["boxes"], dtype=torch.float32).reshape(-1, 4).cpu()
    labels = torch.as_tensor(result["labels"]).reshape(-1).cpu()
    scores = result.get("scores")
    scores = torch.as_tensor(scores, dtype=torch.float32).reshape(-1).cpu() if scores is not None else None
    if score_threshold is not None and scores is not None:
        keep = scores > score_threshold
        boxes, labels, scores = boxes[keep], labels[keep], scores[keep]
    if len(boxes) == 0:
        return img
    own_names = result.get("class_names")
    texts = []
    for i, lab in enumerate(labels.tolist()):
        if class_names is not None and 0 <= lab < len(class_names):
            name = str(class_names[lab])
        elif own_names is not None and i < len(own_names) and class_names is None:
            name = str(own_names[i])
        else:
            name = f"class_{lab}"
        texts.append(f"{name} {float(scores[i]):.2f}" if scores is not None else name)
    H, W = img.shape[-2:]
    return draw_bounding_boxes(
        img, boxes, labels=texts, colors=[color_for(l) for l in labels.tolist()],
        width=width or max(1, min(H, W) // 150), font=_font_path(), font_size=font_size or _font_size(H, W),
        label_background_colors=[color_for(l) for l in labels.tolist()], label_colors="white",
        fill_labels=True,  # white text on the class colour: readable on any background
    )


def upscale(image: Any, min_side: int = 384) -> tuple[Tensor, float]:
    """The image enlarged (Lanczos) so that its shorter side is at least ``min_side``; uint8 (3, H, W)
    and the factor. Images already that large are returned as they are (factor 1)."""
    from PIL import Image

    img = to_uint8_chw(image)
    h, w = img.shape[-2:]
    scale = max(1.0, min_side / max(1, min(h, w)))
    if scale == 1.0:
        return img, 1.0
    size = (round(w * scale), round(h * scale))
    pil = Image.fromarray(img.permute(1, 2, 0).numpy()).resize(size, Image.LANCZOS)
    return torch.from_numpy(np.asarray(pil).copy()).permute(2, 0, 1), scale


def titled(image: Any, title: str, font_size: int | None = None) -> Tensor:
    """The image below a white band with ``title`` in black; uint8 (3, H + band, W)."""
    from PIL import Image, ImageDraw, ImageFont

    img = to_uint8_chw(image)
    h, w = img.shape[-2:]
    size = font_size or _font_size(h, w) + 4
    path = _font_path()
    font = ImageFont.truetype(path, size) if path else ImageFont.load_default()
    band = int(size * 1.6)
    canvas = Image.new("RGB", (w, h + band), (255, 255, 255))
    canvas.paste(Image.fromarray(img.permute(1, 2, 0).numpy()), (0, band))
    ImageDraw.Draw(canvas).text((4, (band - size) // 2), title, fill=(0, 0, 0), font=font)
    return torch.from_numpy(np.asarray(canvas).copy()).permute(2, 0, 1)


def side_by_side(images: Sequence[Any], gap: int = 8, vertical: bool = False) -> Tensor:
    """Images in a row (or a column) on white, aligned top-left, ``gap`` pixels apart; uint8 (3, H, W)."""
    imgs = [to_uint8_chw(i) for i in images]
    if vertical:
        h, w = sum(i.shape[1] for i in imgs) + gap * (len(imgs) - 1), max(i.shape[2] for i in imgs)
    else:
        h, w = max(i.shape[1] for i in imgs), sum(i.shape[2] for i in imgs) + gap * (len(imgs) - 1)
    out = torch.full((3, h, w), 255, dtype=torch.uint8)
    pos = 0
    for i in imgs:
        ih, iw = i.shape[1:]
        if vertical:
            out[:, pos : pos + ih, :iw] = i
            pos += ih + gap
        else:
            out[:, :ih, pos : pos + iw] = i
            pos += iw + gap
    return out


def compare_detections(image: Any, truth: Mapping[str, Any], prediction: Mapping[str, Any],
                       class_names: Sequence[str] | None = None, min_side: int = 384,
                       titles: tuple[str, str] = ("ground truth", "prediction")) -> Tensor:
    """Ground truth beside the prediction on one image, enlarged to ``min_side`` so that labels read.

    ``truth`` and ``prediction`` hold ``boxes`` (N, 4) xyxy in the image's pixels and ``labels``
    (``prediction`` also ``scores``); the boxes are drawn after enlarging, so lines and text stay sharp.
    """
    big, scale = upscale(image, min_side)
    short = min(big.shape[-2:])
    panels = []
    for result, title in zip((truth, prediction), titles):
        scaled = {**result, "boxes": torch.as_tensor(result["boxes"], dtype=torch.float32).reshape(-1, 4) * scale}
        drawn = draw_detections(big, scaled, class_names, width=max(2, short // 128), font_size=max(14, short // 24))
        panels.append(titled(drawn, title, font_size=max(16, short // 20)))
    return side_by_side(panels)


def draw_segmentation(
    image: Any,
    label_map: Tensor | np.ndarray,
    num_classes: int | None = None,
    alpha: float = 0.5,
    ignore_index: int = 255,
) -> Tensor:
    """Each class's pixels tinted with its palette colour (``ignore_index`` left as is); uint8 (3, H, W)."""
    img = to_uint8_chw(image)
    lm = torch.as_tensor(np.asarray(label_map) if isinstance(label_map, np.ndarray) else label_map).cpu().to(torch.int64)
    if lm.shape != img.shape[-2:]:
        raise ValueError(f"label map {tuple(lm.shape)} does not match the image {tuple(img.shape[-2:])}")
    present = [int(c) for c in torch.unique(lm).tolist() if c != ignore_index and (num_classes is None or 0 <= c < num_classes)]
    if not present:
        return img
    masks = torch.stack([lm == c for c in present])
    return draw_segmentation_masks(img, masks, alpha=alpha, colors=[color_for(c) for c in present])


def draw_caption(image: Any, text: str | Sequence[str], font_size: int | None = None) -> Tensor:
    """Text lines on a dark band at the top of the image (classification results); uint8 (3, H, W)."""
    from PIL import Image, ImageDraw, ImageFont

    img = to_uint8_chw(image)
    lines = [text] if isinstance(text, str) else list(text)
    pil = Image.fromarray(img.permute(1, 2, 0).numpy())
    size = font_size or _font_size(*img.shape[-2:])
    try:
        font = ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1 has no sized default font
        font = ImageFont.load_default()
    draw = ImageDraw.Draw(pil)
    band = int(len(lines) * size * 1.3 + 4)
    draw.rectangle([0, 0, pil.width, band], fill=(0, 0, 0))
    for i, line in enumerate(lines):
        draw.text((4, 2 + i * size * 1.3), line, fill=(255, 255, 255), font=font)
    return torch.from_numpy(np.asarray(pil).copy()).permute(2, 0, 1)


def classification_caption(result: Mapping[str, Any], k: int = 3) -> list[str]:
    """``"name 0.87"`` lines for the top ``k`` classes of a classification result."""
    names = result.get("class_names") or [f"class_{int(l)}" for l in result["labels"]]
    return [f"{n} {float(s):.2f}" for n, s in list(zip(names, result["scores"]))[:k]]


def save_image(image: Any, path: str | Path) -> Path:
    """Write an image (see :func:`to_uint8_chw` for accepted forms) as PNG/JPEG by the suffix."""
    from PIL import Image

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(to_uint8_chw(image).permute(1, 2, 0).numpy()).save(path)
    return path


def label_map_image(label_map: Tensor | np.ndarray) -> Any:
    """A palette PNG (PIL ``P`` mode) whose pixel values are the labels, coloured by :data:`PALETTE`."""
    from PIL import Image

    arr = np.asarray(label_map.cpu() if isinstance(label_map, Tensor) else label_map)
    if arr.size and (arr.min() < 0 or arr.max() > 255):
        raise ValueError(f"labels must be in 0..255 for a PNG label map, got {arr.min()}..{arr.max()}")
    arr = np.ascontiguousarray(arr.astype(np.uint8))
    img = Image.frombytes("P", (arr.shape[1], arr.shape[0]), arr.tobytes())
    flat = [c for i in range(256) for c in color_for(i)]
    img.putpalette(flat)
    return img


def denormalize(image: Tensor, mean: Sequence[float], std: Sequence[float]) -> Tensor:
    """A normalised float (3, H, W) network input back to a uint8 (3, H, W) picture, on the CPU."""
    m = torch.tensor(mean, device=image.device, dtype=torch.float32)[:, None, None]
    s = torch.tensor(std, device=image.device, dtype=torch.float32)[:, None, None]
    return ((image.float() * s + m).clamp(0, 1) * 255).round().to(torch.uint8).cpu()
