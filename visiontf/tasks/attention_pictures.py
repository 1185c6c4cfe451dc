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
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from visiontf.data.inputs import load_inputs
from visiontf.models.contract import AttentionRollout
from visiontf.tasks.drawing import color_for, to_uint8_chw
from visiontf.tasks.task_inference import SettingsValues, get_adapter

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------- helpers
def forward_one_image(model: Any, image: Any, settings: SettingsValues, picture: str) -> tuple:
    """What both detector attention pictures start from: the model's view (:func:`model_view`), the one
    image (loaded as a Predictor would), its preprocessed batch and sizes, and the forward with the
    attention recorded: ``(net, class_name, image, batch, sizes, outputs)``."""
    net, preprocess, class_name = model_view(model, "detection", settings)
    images = load_inputs(image)
    if len(images) != 1:
        raise ValueError(f"{picture} takes one image, got {len(images)}")
    batch, sizes = preprocess([images[0].tensor.to(next(net.parameters()).device)])
    return net, class_name, images[0], batch, sizes, net(batch.images, None, need_weights=True)


def model_view(model: Any, task: str, settings: SettingsValues) -> tuple[nn.Module, nn.Module, Callable[[int], str]]:
    """(network, its eval preprocessing, class naming) of a model with ``settings`` over its own (the task's
    eval settings, as a Predictor's ``preprocess=`` takes them), or those of a Predictor given in its place."""
    if all(hasattr(model, a) for a in ("model", "preprocess", "class_name")):  # a Predictor: its own settings
        return model.model, model.preprocess, model.class_name
    device = next(model.parameters()).device
    preprocess = get_adapter(model, task).preprocess(model, settings, where="preprocess=").to(device)
    return model.eval(), preprocess, lambda label: f"class_{label}"


def choose_queries(scores, score_threshold: float, max_queries: int, query_indices=None) -> list[int]:
    """The queries a picture shows: ``query_indices`` as given (checked against the query count), or
    the best-scoring ones above ``score_threshold`` (at most ``max_queries``; the best one if none is)."""
    if query_indices is not None:
        chosen = [int(q) for q in query_indices]
        bad = [q for q in chosen if not 0 <= q < len(scores)]
        if bad:
            raise ValueError(f"query indices {bad} out of range: the model has {len(scores)} queries")
        return chosen
    order = scores.argsort(descending=True)
    chosen = [int(q) for q in order if scores[q] > score_threshold][:max_queries]
    if not chosen:
        log.info("no query scores above %.2f; showing the best one (%.3f)", score_threshold, float(scores[order[0]]))
        chosen = [int(order[0])]
    return chosen


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
    model: Any,
    image: Any,
    query_indices: Sequence[int] | None = None,
    points: Sequence[tuple[float, float]] | None = None,
    score_threshold: float = 0.7,
    max_queries: int = 4,
    preprocess: SettingsValues = None,
) -> dict[str, Any]:
    """Attention maps of one image for chosen detections and points.

    Args:
        model: a DETR (or a detection :class:`Predictor`, whose preprocessing is used).
        image: one image in any form :func:`~visiontf.data.inputs.load_inputs` accepts.
        query_indices: queries to show; default the ``max_queries`` best with ``score > score_threshold``
            (the best one if none passes).
        points: ``(x, y)`` in original image pixels for encoder self-attention; default the centres of
            the chosen detections' boxes.
        preprocess: eval settings over the model's (``{"min_size": 256}``, ...) when ``model`` is a module.

    Returns:
        numpy arrays: ``image`` (H, W, 3) uint8, ``query_indices`` (n,), ``scores``, ``labels``,
        ``boxes`` (n, 4) xyxy original pixels, ``dec_attn`` (n, H, W) and ``dec_attn_grid`` (n, h, w),
        ``points`` (m, 2), ``enc_attn`` (m, H, W) and ``enc_attn_grid`` (m, h, w), ``feature_size``
        (h, w), and ``class_names`` (list).
    """
    from visiontf.set_prediction import build_postprocess

    net, class_name, im, batch, sizes, out = forward_one_image(model, image, preprocess, "detr_attention_maps")
    H, W = im.size
    if "dec_attn" not in out or out["dec_attn"] is None:
        raise ValueError(f"{type(net).__name__} returned no attention maps; it needs forward(..., need_weights=True)")
    h, w = out["feature_size"]
    stride = 2 ** round(math.log2(batch.images.shape[-2] / h))
    det = build_postprocess(net)({"pred_logits": out["pred_logits"], "pred_boxes": out["pred_boxes"]}, [(H, W)])[0]
    scores, labels, boxes = det["scores"].cpu(), det["labels"].cpu(), det["boxes"].cpu()
    chosen = choose_queries(scores, score_threshold, max_queries, query_indices)
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
        "class_names": [class_name(int(l)) for l in labels[q]],
        "boxes": boxes[q].numpy(),
        "dec_attn": _grid_to_image(dec_grid, stride, (hr, wr), (H, W)).numpy(),
        "dec_attn_grid": dec_grid.numpy(),
        "points": pts,
        "enc_attn": _grid_to_image(enc_grid, stride, (hr, wr), (H, W)).numpy() if cells else np.zeros((0, H, W), np.float32),
        "enc_attn_grid": enc_grid.numpy(),
        "feature_size": (int(h), int(w)),
    }


#: the attention figure's longest side in pixels, whatever the image's size and aspect ratio
MAX_FIGURE_SIDE_PX = 1600


def _panel_grid(n: int, aspect: float, target: float = 1.5) -> tuple[int, int]:
    """(rows, cols) for ``n`` panels of width/height ``aspect`` whose whole is closest to ``target``
    (tall thin images go side by side, wide flat ones one above the other)."""
    def badness(cols: int) -> float:
        rows = math.ceil(n / cols)
        return abs(math.log(cols * aspect / rows / target)) + 0.05 * (rows * cols - n)  # few empty cells

    cols = min(range(1, n + 1), key=badness)
    return math.ceil(n / cols), cols


def save_detr_attention_figure(maps: dict[str, Any], path: str | Path, dpi: int = 100,
                               max_side_px: int = MAX_FIGURE_SIDE_PX) -> Path:
    """A PNG like the DETR paper's figures from :func:`detr_attention_maps`' output.

    One panel per chosen query: its decoder attention overlaid on the image, with its box; with
    points, one panel of the image with the points, then one per point: its encoder self-attention
    overlaid, the point marked. Panels keep the image's aspect ratio and are laid out in the grid
    whose whole is closest to 3:2 (a tall thin image gives a row, a wide flat one a column); the
    figure's longest side is at most ``max_side_px``.
    """
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    image = maps["image"]
    H, W = image.shape[:2]
    n, m = len(maps["query_indices"]), len(maps["points"])
    panels: list[tuple[np.ndarray, str, Any]] = []
    for i in range(n):
        title = f"query {int(maps['query_indices'][i])}: {maps['class_names'][i]} {float(maps['scores'][i]):.2f}"
        x0, y0, x1, y1 = (float(v) for v in maps["boxes"][i])
        colour = np.asarray(color_for(int(maps["labels"][i]))) / 255.0
        box = lambda ax, x0=x0, y0=y0, x1=x1, y1=y1, c=colour: ax.add_patch(  # noqa: E731
            Rectangle((x0, y0), x1 - x0, y1 - y0, fill=False, linewidth=2, edgecolor=c))
        panels.append((heatmap_overlay(image, maps["dec_attn"][i], alpha=0.55), title, box))
    if m:
        pts = maps["points"]
        panels.append((image, "encoder points", lambda ax: ax.scatter(pts[:, 0], pts[:, 1], c="red", s=24)))
        for j in range(m):
            x, y = (float(v) for v in pts[j])
            panels.append((heatmap_overlay(image, maps["enc_attn"][j], alpha=0.55), f"self-attention at ({x:.0f}, {y:.0f})",
                           lambda ax, x=x, y=y: ax.scatter([x], [y], c="red", s=20)))

    aspect = W / max(H, 1)
    rows, cols = _panel_grid(len(panels), aspect)
    # panel size in inches: the long side 3.5 in, longer for extreme aspect ratios (so that the short
    # side stays visible), then everything shrunk to fit max_side_px
    long_side = 3.5 * min(4.0, math.sqrt(max(aspect, 1.0 / aspect)))
    ph = long_side / max(aspect, 1.0)
    pw = ph * aspect
    title_h, min_col_w, gap, margin = 0.3, 1.6, 0.12, 0.1  # titles need width even above a thin panel
    scale = min(1.0, (max_side_px / dpi - 2 * margin) / (cols * max(pw + gap, min_col_w)),
                (max_side_px / dpi - 2 * margin) / (rows * (ph + title_h)))
    ph, pw = ph * scale, pw * scale
    cw, ch = max(pw + gap, min_col_w * min(1.0, scale * 2)), ph + title_h
    fig_w, fig_h = cols * cw + 2 * margin, rows * ch + 2 * margin
    fig = Figure(figsize=(fig_w, fig_h), dpi=dpi)
    fontsize = max(5.0, min(8.0, 8.0 * cw / min_col_w))
    for k, (picture, title, mark) in enumerate(panels):
        r, c = divmod(k, cols)
        left = margin + c * cw + (cw - pw) / 2
        bottom = fig_h - margin - (r + 1) * ch
        ax = fig.add_axes((left / fig_w, bottom / fig_h, pw / fig_w, ph / fig_h))
        ax.imshow(picture, interpolation="bilinear" if max(H, W) < 512 else "antialiased")
        ax.set_xlim(-0.5, W - 0.5)
        ax.set_ylim(H - 0.5, -0.5)
        mark(ax)
        ax.set_title(title, fontsize=fontsize)
        ax.axis("off")
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
def vit_attention_rollout(model: nn.Module, images: Any, preprocess: bool = True, settings: SettingsValues = None
                          ) -> Tensor:
    """CLS-token attention rollout over the patch grid: (B, gh, gw), each map's sum <= 1.

    ``images``: any Predictor input, centre-cropped and normalised as the model's eval
    transform (``settings`` over the model's own); with ``preprocess=False``, an already normalised
    (B, 3, H, W) tensor.
    """
    if not isinstance(model, AttentionRollout):
        raise ValueError(f"{type(model).__name__} has no forward_attention(x); attention rollout needs a visiontf ViT")
    if preprocess:
        net, transform, _ = model_view(model, "classification", settings)
        x = transform([im.tensor.to(next(net.parameters()).device) for im in load_inputs(images)])
    else:
        x = images.to(next(model.parameters()).device)
    model.eval()
    maps = model.forward_attention(x)
    rolled = attention_rollout(maps)
    prefix = int(model.num_prefix_tokens)
    ph, pw = model.patch_embed.patch_size
    gh, gw = x.shape[-2] // ph, x.shape[-1] // pw
    return rolled[:, 0, prefix:].reshape(x.shape[0], gh, gw).cpu()


def save_rollout_overlay(image: Any, rollout: Tensor | np.ndarray, path: str | Path, alpha: float = 0.5, cmap: str = "jet") -> Path:
    """Save a rollout map (gh, gw) blended over ``image`` (the crop the model saw) as a PNG."""
    from visiontf.tasks.drawing import save_image

    return save_image(heatmap_overlay(image, rollout, alpha=alpha, cmap=cmap), path)
