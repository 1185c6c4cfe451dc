"""Attention pictures: DETR's decoder/encoder attention maps (the paper's figures) and ViT rollout.

* DETR: for a detection (a query), the last decoder layer's cross-attention over the feature map,
  and for an image point, the last encoder layer's self-attention from that point's feature cell;
  both upsampled to the original image.
* ViT: attention rollout (Abnar & Zuidema, 2020): per block ``(A + I)`` with rows re-normalised,
  multiplied across blocks; the CLS token's row over the patches is the map.
"""
from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from visiontf.adapters.drawing import color_for, to_uint8_chw
from visiontf.inference.predictor import Predictor, load_inputs

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------- helpers
def heatmap_overlay(image: Any, heat: Tensor | np.ndarray, alpha: float = 0.5, cmap: str = "jet") -> np.ndarray:
    """Blend a heat map (any size; min-max normalised, resized bilinearly) over an image: uint8 (H, W, 3)."""
    import matplotlib

    img = to_uint8_chw(image)
    H, W = img.shape[-2:]
    h = torch.as_tensor(np.asarray(heat), dtype=torch.float32)
    if h.shape != (H, W):
        h = F.interpolate(h[None, None], size=(int(H), int(W)), mode="bilinear", align_corners=False)[0, 0]
    lo, hi = float(h.min()), float(h.max())
    h = (h - lo) / (hi - lo) if hi > lo else torch.zeros_like(h)
    colored = matplotlib.colormaps[cmap](h.numpy())[..., :3] * 255.0
    base = img.permute(1, 2, 0).numpy().astype(np.float32)
    return np.clip((1 - alpha) * base + alpha * colored, 0, 255).astype(np.uint8)


def _grid_to_image(maps: Tensor, stride: int, resized: tuple[int, int], original: tuple[int, int]) -> Tensor:
    """(n, h, w) feature-cell maps -> (n, H, W) on the original image.

    The feature grid covers ``h * stride`` rows of the (resized) network input, a little more than the
    image when its size is not a multiple of the stride; that overhang is cut before the final resize.
    """
    n, h, w = maps.shape
    x = F.interpolate(maps[:, None].float(), size=(h * stride, w * stride), mode="bilinear", align_corners=False)
    x = x[..., : resized[0], : resized[1]]
    return F.interpolate(x, size=original, mode="bilinear", align_corners=False)[:, 0]


# ---------------------------------------------------------------------------------------- DETR
@torch.inference_mode()
def detr_attention_maps(
    model: nn.Module | Predictor,
    image: Any,
    query_indices: Sequence[int] | None = None,
    points: Sequence[tuple[float, float]] | None = None,
    score_threshold: float = 0.7,
    max_queries: int = 4,
    **predictor_kwargs: Any,
) -> dict[str, Any]:
    """Attention maps of one image for chosen detections and points.

    Args:
        model: a DETR (or a detection :class:`Predictor`, whose preprocessing is used).
        image: one image in any form :func:`~visiontf.inference.predictor.load_inputs` accepts.
        query_indices: queries to show; default the ``max_queries`` best with ``score > score_threshold``
            (the best one if none passes).
        points: ``(x, y)`` in original image pixels for encoder self-attention; default the centres of
            the chosen detections' boxes.
        predictor_kwargs: preprocessing overrides (``min_size=256``, ...) when ``model`` is a module.

    Returns:
        numpy arrays: ``image`` (H, W, 3) uint8, ``query_indices`` (n,), ``scores``, ``labels``,
        ``boxes`` (n, 4) xyxy original pixels, ``dec_attn`` (n, H, W) and ``dec_attn_grid`` (n, h, w),
        ``points`` (m, 2), ``enc_attn`` (m, H, W) and ``enc_attn_grid`` (m, h, w), ``feature_size``
        (h, w), and ``class_names`` (list).
    """
    from visiontf.detection import build_postprocess

    pred = model if isinstance(model, Predictor) else Predictor(model, task="detection", **predictor_kwargs)
    images = load_inputs(image)
    if len(images) != 1:
        raise ValueError(f"detr_attention_maps takes one image, got {len(images)}")
    im = images[0]
    H, W = im.size
    batch, sizes = pred.preprocess([im.tensor.to(pred.device)])
    out = pred.model(batch.images, None, need_weights=True)
    if "dec_attn" not in out or out["dec_attn"] is None:
        raise ValueError(f"{type(pred.model).__name__} returned no attention maps; it needs forward(..., need_weights=True)")
    h, w = out["feature_size"]
    stride = 2 ** round(math.log2(batch.images.shape[-2] / h))
    det = build_postprocess(pred.model)({"pred_logits": out["pred_logits"], "pred_boxes": out["pred_boxes"]}, [(H, W)])[0]
    scores, labels, boxes = det["scores"].cpu(), det["labels"].cpu(), det["boxes"].cpu()
    if query_indices is None:
        order = scores.argsort(descending=True)
        chosen = [int(q) for q in order if scores[q] > score_threshold][:max_queries]
        if not chosen:
            log.info("no query scores above %.2f; showing the best one (%.3f)", score_threshold, float(scores[order[0]]))
            chosen = [int(order[0])]
    else:
        chosen = [int(q) for q in query_indices]
        bad = [q for q in chosen if not 0 <= q < len(scores)]
        if bad:
            raise ValueError(f"query indices {bad} out of range: the model has {len(scores)} queries")
    q = torch.tensor(chosen, dtype=torch.long)
    dec_grid = out["dec_attn"][0].float().cpu()[q].reshape(len(chosen), h, w)
    default_points = points is None
    if default_points:
        points = [((float(b[0]) + float(b[2])) / 2, (float(b[1]) + float(b[3])) / 2) for b in boxes[q]]
        points = [(min(max(x, 0.0), W - 1.0), min(max(y, 0.0), H - 1.0)) for x, y in points]
    enc = out["enc_attn"][0].float().cpu()
    hr, wr = sizes[0]
    cells, kept = [], []
    for x, y in np.asarray(points, dtype=np.float32).reshape(-1, 2):
        if not (0 <= x < W and 0 <= y < H):
            raise ValueError(f"point ({x}, {y}) lies outside the {W}x{H} image; points are (x, y) in original pixels")
        fy = min(int(y * hr / H) // stride, h - 1)
        fx = min(int(x * wr / W) // stride, w - 1)
        if default_points and fy * w + fx in cells:
            continue  # box centres in the same feature cell would repeat the same map
        cells.append(fy * w + fx)
        kept.append((float(x), float(y)))
    pts = np.asarray(kept, dtype=np.float32).reshape(-1, 2)
    enc_grid = enc[torch.tensor(cells, dtype=torch.long)].reshape(len(cells), h, w) if cells else torch.zeros(0, h, w)
    return {
        "image": im.uint8().permute(1, 2, 0).numpy(),
        "query_indices": np.asarray(chosen),
        "scores": scores[q].numpy(),
        "labels": labels[q].numpy(),
        "class_names": [pred.class_name(int(l)) for l in labels[q]],
        "boxes": boxes[q].numpy(),
        "dec_attn": _grid_to_image(dec_grid, stride, (hr, wr), (H, W)).numpy(),
        "dec_attn_grid": dec_grid.numpy(),
        "points": pts,
        "enc_attn": _grid_to_image(enc_grid, stride, (hr, wr), (H, W)).numpy() if cells else np.zeros((0, H, W), np.float32),
        "enc_attn_grid": enc_grid.numpy(),
        "feature_size": (int(h), int(w)),
    }


def save_detr_attention_figure(maps: dict[str, Any], path: str | Path, dpi: int = 100) -> Path:
    """A PNG like the DETR paper's figures from :func:`detr_attention_maps`' output.

    Row 1: each chosen query's decoder attention; row 2: the image with that query's box; row 3
    (with points): the image with the points, then each point's encoder self-attention overlay.
    """
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    image = maps["image"]
    n, m = len(maps["query_indices"]), len(maps["points"])
    cols = max(n, m + 1, 1)
    rows = 2 + (1 if m else 0)
    H, W = image.shape[:2]
    cell = 3.0
    fig = Figure(figsize=(cols * cell, rows * cell * H / max(W, 1) + 0.6 * rows), dpi=dpi)
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for i in range(n):
        lab = int(maps["labels"][i])
        title = f"query {int(maps['query_indices'][i])}: {maps['class_names'][i]} {float(maps['scores'][i]):.2f}"
        axes[0, i].imshow(maps["dec_attn_grid"][i], cmap="viridis")
        axes[0, i].set_title(title, fontsize=8)
        axes[1, i].imshow(image)
        x0, y0, x1, y1 = (float(v) for v in maps["boxes"][i])
        axes[1, i].add_patch(Rectangle((x0, y0), x1 - x0, y1 - y0, fill=False, linewidth=2,
                                       edgecolor=np.asarray(color_for(lab)) / 255.0))
    if m:
        axes[2, 0].imshow(image)
        axes[2, 0].scatter(maps["points"][:, 0], maps["points"][:, 1], c="red", s=30, marker="o")
        axes[2, 0].set_title("encoder points", fontsize=8)
        for j in range(m):
            axes[2, j + 1].imshow(heatmap_overlay(image, maps["enc_attn"][j], alpha=0.6))
            x, y = maps["points"][j]
            axes[2, j + 1].scatter([x], [y], c="red", s=20)
            axes[2, j + 1].set_title(f"self-attention at ({x:.0f}, {y:.0f})", fontsize=8)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return path


# ---------------------------------------------------------------------------------------- ViT
def attention_rollout(maps: Sequence[Tensor], add_residual: bool = True) -> Tensor:
    """Roll (B, N, N) head-averaged attention maps through the blocks: (B, N, N), rows summing to 1."""
    if not maps:
        raise ValueError("attention_rollout needs at least one attention map")
    B, N, _ = maps[0].shape
    eye = torch.eye(N, device=maps[0].device, dtype=torch.float32)
    result = eye.expand(B, N, N)
    for a in maps:
        a = a.float()
        if add_residual:
            # the residual stream carries each token through unchanged: half identity, as the paper
            a = a + eye
        a = a / a.sum(dim=-1, keepdim=True)
        result = a @ result
    return result


@torch.inference_mode()
def vit_attention_rollout(model: nn.Module, images: Any, preprocess: bool = True, **predictor_kwargs: Any) -> Tensor:
    """CLS-token attention rollout over the patch grid: (B, gh, gw), each map's sum <= 1.

    ``images``: any :class:`Predictor` input, centre-cropped and normalised as the model's eval
    transform; with ``preprocess=False``, an already normalised (B, 3, H, W) tensor.
    """
    if not hasattr(model, "forward_attention"):
        raise ValueError(f"{type(model).__name__} has no forward_attention(x); attention rollout needs a visiontf ViT")
    if preprocess:
        pred = Predictor(model, task="classification", **predictor_kwargs)
        x = pred.preprocess([im.tensor.to(pred.device) for im in load_inputs(images)])
    else:
        x = images.to(next(model.parameters()).device)
    model.eval()
    maps = model.forward_attention(x)
    rolled = attention_rollout(maps)
    prefix = int(getattr(model, "num_prefix_tokens", 1))
    ph, pw = model.patch_embed.patch_size
    gh, gw = x.shape[-2] // ph, x.shape[-1] // pw
    return rolled[:, 0, prefix:].reshape(x.shape[0], gh, gw).cpu()


def save_rollout_overlay(image: Any, rollout: Tensor | np.ndarray, path: str | Path, alpha: float = 0.5, cmap: str = "jet") -> Path:
    """Save a rollout map (gh, gw) blended over ``image`` (the crop the model saw) as a PNG."""
    from visiontf.adapters.drawing import save_image

    return save_image(heatmap_overlay(image, rollout, alpha=alpha, cmap=cmap), path)
