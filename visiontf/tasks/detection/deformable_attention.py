"""Deformable DETR's attention picture (Zhu et al., 2021, the appendix figure of sampling points).

For a detection (a query) the last decoder layer's cross-attention reads a few bilinear samples per
head on every feature level. The picture marks each sample as a filled circle coloured by its
attention weight, all levels together (a marker shape per level), with the detection's box and its
reference point (a green cross), as the paper draws it.

The real-time DETRs (RT-DETRv2, D-FINE, DEIM) may sample a different number of points on each level
(``n_points=(P_0, ..., P_{L-1})``: D-FINE's (3, 6, 3)); their points come as one axis of J = sum of the
counts per head, ordered level then point, with each point's level beside them, and are drawn the same
way. With discrete sampling (RT-DETRv2's ``sampling="discrete"``) each point is drawn at the centre of the
one cell it reads.

Points are drawn where the model reads them. A level whose map size is not a multiple of its stride
covers a little more than the image (the last row and column of cells overhang it) and the model
scales reference points to the whole map, so on coarse levels the samples sit slightly right of and
below the reference point drawn at (x W, y H).
"""
from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from visiontf.tasks.attention_pictures import choose_queries, forward_one_image
from visiontf.tasks.drawing import color_for
from visiontf.tasks.task_inference import SettingsValues

log = logging.getLogger(__name__)

#: marker of each feature level (finest first), so levels stay apart where points overlap
LEVEL_MARKERS = ("o", "s", "^", "D", "v", "p")


def _level_strides(shapes: Sequence[tuple[int, int]], input_hw: tuple[int, int]) -> list[int]:
    """Each level's stride in input pixels: the smallest power of two at which the map covers the input
    (a map of a size that is not a multiple of the stride has one more, partly outside, cell; RT-DETR's
    maps cover the input padded to a multiple of 32, up to 31 more pixels)."""
    strides = []
    for h, w in shapes:
        stride = 2 ** max(0, math.floor(math.log2(max(input_hw[1] / w, input_hw[0] / h))))
        while w * stride < input_hw[1] or h * stride < input_hw[0]:
            stride *= 2
        strides.append(stride)
    return strides


def _sample_layout(out: dict[str, Any], levels: int) -> tuple[tuple[int, ...], bool]:
    """(the count of points of each level, whether the locations have one (L, P) pair of axes or one J axis)."""
    loc = out["dec_sampling_locations"]
    if loc.dim() == 6:  # (B, Q, M, L, P, 2): the same count on every level
        if loc.shape[3] != levels:
            raise ValueError(f"dec_sampling_locations has {loc.shape[3]} levels, spatial_shapes {levels}")
        return (int(loc.shape[4]),) * levels, True
    points = out.get("dec_sampling_points")
    if points is None or len(points) != levels or sum(points) != loc.shape[3]:
        raise ValueError(
            f"dec_sampling_locations of shape {tuple(loc.shape)} (B, Q, heads, J, 2) need dec_sampling_points, the count of "
            f"each of the {levels} levels summing to J; got {points}"
        )
    return tuple(int(p) for p in points), False


@torch.inference_mode()
def deformable_sampling_points(
    model: Any,
    image: Any,
    query_indices: Sequence[int] | None = None,
    score_threshold: float = 0.5,
    max_queries: int = 3,
    preprocess: SettingsValues = None,
) -> dict[str, Any]:
    """Where the last decoder layer sampled for chosen detections of one image.

    Args:
        model: a Deformable DETR, DINO, RT-DETR, D-FINE or DEIM (any model whose
            ``forward(..., need_weights=True)`` returns ``dec_sampling_locations``), or a detection
            :class:`Predictor` (its preprocessing is used).
        image: one image in any form :func:`~visiontf.data.inputs.load_inputs` accepts.
        query_indices: queries to show; default the ``max_queries`` best whose best class scores
            ``> score_threshold`` (the best one if none does).
        preprocess: eval settings over the model's (``{"min_size": 256}``, ...) when ``model`` is a module.

    Returns:
        numpy arrays in original image pixels: ``image`` (H, W, 3) uint8, ``query_indices`` (n,),
        ``scores``, ``labels`` (each query's best class), ``class_names`` (list), ``boxes`` (n, 4)
        xyxy, ``reference`` (n, 2) the reference point (x, y), ``points`` (n, heads, L, P, 2) every
        sampling location (x, y), ``weights`` (n, heads, L, P) their attention weights (summing to
        1 per head), ``spatial_shapes`` and ``strides`` of the levels, ``points_per_level`` (the
        count of each level) and ``point_levels`` (J,) the level of each point of a head in order.
        A model with a count per level (RT-DETRv2, D-FINE, DEIM: ``dec_sampling_points``) gives
        ``points`` (n, heads, J, 2) and ``weights`` (n, heads, J), J = sum of the counts, ordered
        level then point; with discrete sampling each point is the centre of the cell it reads.
    """
    net, class_name, im, batch, sizes, out = forward_one_image(model, image, preprocess, "deformable_sampling_points")
    H, W = im.size
    if out.get("dec_sampling_locations") is None:
        raise ValueError(
            f"{type(net).__name__} returned no sampling locations; the picture needs a model whose "
            "forward(images, mask, need_weights=True) returns dec_sampling_locations (Deformable DETR, DINO, the real-time DETRs)"
        )
    prob = out["pred_logits"][0].float().sigmoid()
    scores, labels = prob.max(-1)
    scores, labels = scores.cpu(), labels.cpu()
    chosen = choose_queries(scores, score_threshold, max_queries, query_indices)
    q = torch.tensor(chosen, dtype=torch.long)
    hr, wr = sizes[0]
    to_original = torch.tensor([W / wr, H / hr])
    shapes = [tuple(int(v) for v in s) for s in out["spatial_shapes"]]
    strides = _level_strides(shapes, (hr, wr))
    # a normalised location x on a map of w cells of `stride` pixels is input pixel x * w * stride
    # (grid_sample, align_corners=False); then back to original pixels
    cells = torch.tensor([(w * s, h * s) for (h, w), s in zip(shapes, strides)], dtype=torch.float32)  # (L, 2)
    per_level, grid = _sample_layout(out, len(shapes))
    levels = torch.repeat_interleave(torch.arange(len(shapes)), torch.tensor(per_level))  # (J,) each point's level
    loc = out["dec_sampling_locations"][0].float().cpu()[q]  # (n, M, L, P, 2) or (n, M, J, 2)
    weights = out["dec_attention_weights"][0].float().cpu()[q]
    flat = loc.flatten(2, 3) if grid else loc  # (n, M, J, 2)
    if out.get("dec_sampling_mode", "bilinear") == "discrete":
        # the cell read, floor(x * W_l + 0.5) clamped into the map, drawn at its centre
        size = torch.tensor([(w, h) for h, w in shapes], dtype=torch.float32)[levels]
        flat = (torch.minimum(torch.floor(flat * size + 0.5).clamp_min(0), size - 1) + 0.5) / size
    points = flat * cells[levels] * to_original
    if grid:
        points = points.unflatten(2, (len(shapes), per_level[0]))
    reference = out["dec_reference_points"][0].float().cpu()[q, :2] * torch.tensor([W, H], dtype=torch.float32)
    boxes = out["pred_boxes"][0].float().cpu()[q]
    cx, cy, bw, bh = boxes.unbind(-1)
    xyxy = torch.stack([cx - bw / 2, cy - bh / 2, cx + bw / 2, cy + bh / 2], -1) * torch.tensor([W, H, W, H], dtype=torch.float32)
    return {
        "image": im.uint8().permute(1, 2, 0).numpy(),
        "query_indices": np.asarray(chosen),
        "scores": scores[q].numpy(),
        "labels": labels[q].numpy(),
        "class_names": [class_name(int(l)) for l in labels[q]],
        "boxes": xyxy.numpy(),
        "reference": reference.numpy(),
        "points": points.numpy(),
        "weights": weights.numpy(),
        "spatial_shapes": shapes,
        "strides": strides,
        "points_per_level": per_level,
        "point_levels": levels.numpy(),
    }


def save_sampling_points_figure(data: dict[str, Any], path: str | Path, dpi: int = 100, cmap: str = "jet") -> Path:
    """A PNG from :func:`deformable_sampling_points`' output: one panel per detection with its box,
    its reference point (green cross) and every sampling point of every level and head, coloured by
    attention weight (one colour scale for the figure; stronger samples larger and drawn on top), with its
    level's marker (the legend names each level's stride, and its count of points where the counts differ)."""
    from matplotlib import colors
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Rectangle

    image = data["image"]
    H, W = image.shape[:2]
    n = len(data["query_indices"])
    weights = data["weights"]
    norm = colors.Normalize(vmin=0.0, vmax=float(weights.max()) if weights.size else 1.0)
    cols = max(n, 1)
    panel = 4.0
    L = len(data["spatial_shapes"])
    per_level = tuple(data.get("points_per_level") or (data["points"].shape[3],) * L)
    point_levels = np.repeat(np.arange(L), per_level)  # (J,) the level of each point of a head
    counts = [f", {p} points" if len(set(per_level)) > 1 else "" for p in per_level]
    labels = [f"level {l} (stride {s}{counts[l]})" for l, s in enumerate(data["strides"])] + ["reference point"]
    # at least 7 inches wide, so that the legend's row fits under a single panel; wider for the longer labels of
    # uneven counts (about 0.07 inch a character at 8 points, 0.5 inch a marker and gap)
    least = 7.0 if not counts[0] else max(7.0, sum(0.07 * len(t) + 0.5 for t in labels))
    fig = Figure(figsize=(max(cols * panel + 0.8, least), panel * H / max(W, 1) + 0.9), dpi=dpi)
    axes = fig.subplots(1, cols, squeeze=False)[0]
    scatter = None
    for i in range(n):
        ax = axes[i]
        ax.imshow(image)
        ax.set_xlim(-0.5, W - 0.5)
        ax.set_ylim(H - 0.5, -0.5)
        ax.axis("off")
        x0, y0, x1, y1 = (float(v) for v in data["boxes"][i])
        ax.add_patch(Rectangle((x0, y0), x1 - x0, y1 - y0, fill=False, linewidth=2,
                               edgecolor=np.asarray(color_for(int(data["labels"][i]))) / 255.0))
        # (heads, L, P | J, ·) -> one row per sample (head-major, then level, then point), drawn weakest first so
        # the strongest of any level is on top; larger for a larger weight, since samples of different heads and
        # levels often coincide
        pts = data["points"][i].reshape(-1, 2)
        w = data["weights"][i].reshape(-1)
        level = np.tile(point_levels, len(w) // len(point_levels))
        size = 14.0 + 70.0 * w / max(float(norm.vmax), 1e-12)
        for k in np.argsort(w, kind="stable"):
            scatter = ax.scatter(pts[k, 0], pts[k, 1], c=w[k:k + 1], cmap=cmap, norm=norm, s=size[k],
                                 marker=LEVEL_MARKERS[level[k] % len(LEVEL_MARKERS)], edgecolors="black", linewidths=0.3)
        rx, ry = (float(v) for v in data["reference"][i])
        ax.scatter([rx], [ry], marker="+", s=180, c="lime", linewidths=2.5)
        ax.set_title(f"query {int(data['query_indices'][i])}: {data['class_names'][i]} {float(data['scores'][i]):.2f}", fontsize=9)
    handles = [Line2D([], [], linestyle="", marker=LEVEL_MARKERS[l % len(LEVEL_MARKERS)], color="gray", label=labels[l])
               for l in range(len(data["strides"]))]
    handles.append(Line2D([], [], linestyle="", marker="+", color="lime", markersize=10, label=labels[-1]))
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=8, frameon=False)
    width = fig.get_figwidth()  # inches: the colour bar and its label keep ~1 inch on the right
    fig.subplots_adjust(left=0.01, right=1 - 1.15 / width, top=0.9, bottom=0.12, wspace=0.05)
    if scatter is not None:
        fig.colorbar(scatter, cax=fig.add_axes((1 - 0.95 / width, 0.15, 0.12 / width, 0.72)), label="attention weight")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return path
