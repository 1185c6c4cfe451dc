"""Pictures of the detection readouts: PR curves per class, the confusion matrix, TIDE's error bars.

matplotlib's object-oriented API (``Figure`` without pyplot), so nothing changes the caller's
backend or global state; each function returns the ``Figure`` and writes a PNG when given a path.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from visiontf.evaluation.readouts.confusion import DetectionConfusion
from visiontf.evaluation.readouts.per_class import CocoArrays
from visiontf.evaluation.readouts.tide import ERROR_TYPES, SPECIAL_TYPES, TideReport

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["plot_confusion", "plot_pr_curves", "plot_tide"]


def _figure(figsize: tuple[float, float], dpi: int = 100) -> Figure:
    try:
        from matplotlib.figure import Figure
    except ImportError as e:  # matplotlib is not a core dependency
        raise ImportError("the readout pictures need matplotlib: pip install matplotlib") from e
    return Figure(figsize=figsize, dpi=dpi)


def _save(fig: Figure, path: str | Path | None) -> Figure:
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path)
    return fig


def plot_pr_curves(arrays: CocoArrays, names: dict[int, str], iou: float = 0.5, path: str | Path | None = None,
                   max_dets: int = 100) -> Figure:
    """Small multiples, one panel per category with ground truth (the first: the mean over them): COCO's
    interpolated precision at its 101 recall points (``precision[t, :, k, all, max_dets]``, the curve
    whose mean is the class's AP at this IoU). Every panel spans recall 0..1 (right) and precision
    0..1 (up), with dotted lines at 0.5. Drawn on one canvas: a grid of one matplotlib Axes per class is many
    times slower to lay out and save (docs/record/speed.md#measurements-behind-comments-in-the-code)."""
    from matplotlib.collections import LineCollection, PolyCollection

    t = arrays.iou_index(iou)
    a, m = arrays.area_labels.index("all"), arrays.max_dets.index(max_dets)
    curves = arrays.precision[t, :, :, a, m].T  # [K, R]
    ks = [k for k in range(len(arrays.cat_ids)) if (curves[k] > -1).any()]
    panels = [("all classes (mean)", curves[ks].mean(axis=0) if ks else np.zeros_like(arrays.rec_thrs))]
    panels += [(str(names.get(arrays.cat_ids[k], arrays.cat_ids[k])), curves[k]) for k in ks]
    cols = min(8, len(panels))
    rows = math.ceil(len(panels) / cols)
    height = 1.75 * rows + 0.45
    fig = _figure((max(1.9 * cols, 7.5), height))
    ax = fig.add_axes((0.01, 0.01, 0.98, 1 - 0.45 / height))
    lines, fills, frames, guides = [], [], [], []
    x0, w, y0, h = 0.08, 0.84, 0.06, 0.66  # the plot area inside each unit cell
    for i, (title, precision) in enumerate(panels):
        row, col = divmod(i, cols)
        ox, oy = col, rows - 1 - row
        px, py = ox + x0 + w * arrays.rec_thrs, oy + y0 + h * np.clip(precision, 0, 1)
        lines.append(np.c_[px, py])
        fills.append(np.r_[np.c_[px, py], [[px[-1], oy + y0], [px[0], oy + y0]]])
        frames.append([(ox + x0, oy + y0), (ox + x0 + w, oy + y0), (ox + x0 + w, oy + y0 + h), (ox + x0, oy + y0 + h),
                       (ox + x0, oy + y0)])
        guides += [[(ox + x0 + w / 2, oy + y0), (ox + x0 + w / 2, oy + y0 + h)],
                   [(ox + x0, oy + y0 + h / 2), (ox + x0 + w, oy + y0 + h / 2)]]
        ax.text(ox + 0.5, oy + y0 + h + 0.03, f"{title[:22]}\nAP{round(iou * 100)} {precision.mean():.3f}",
                ha="center", va="bottom", fontsize=8, weight="bold" if i == 0 else "normal")
    color = "tab:blue"
    ax.add_collection(PolyCollection(fills, facecolor=color, edgecolor="none", alpha=0.18))
    ax.add_collection(LineCollection(lines, colors=color, linewidths=1.3))
    ax.add_collection(LineCollection(frames, colors="0.55", linewidths=0.6))
    ax.add_collection(LineCollection(guides, colors="0.75", linewidths=0.5, linestyles="dotted"))
    ax.set_xlim(0, max(cols, 7.5 / 1.9))
    ax.set_ylim(0, rows - 1 + y0 + h + 0.25)  # the top row's titles, no empty band above them
    ax.axis("off")
    fig.suptitle(f"Precision (up, 0..1) against recall (right, 0..1) at IoU {iou:.2f}: COCO's interpolated precision, "
                 f"maxDets {max_dets}, all areas", fontsize=10, y=1 - 0.08 / height, va="top")
    return _save(fig, path)


def plot_confusion(confusion: DetectionConfusion, normalized: bool = False, path: str | Path | None = None) -> Figure:
    """The matrix as a heat map, rows truth and columns prediction (zeros left white); counts (or row
    shares) written in the cells when there are at most 30 classes."""
    values = confusion.normalized() if normalized else confusion.matrix.astype(np.float64)
    n = len(confusion.names)
    cell = 0.42 if n <= 31 else 0.2  # inches
    fontsize = 8 if n <= 31 else 6
    margin = 0.75 + 0.6 * fontsize / 72 * max(len(name) for name in confusion.names)  # room for the labels (inches)
    # at least as wide as the title; the matrix centred. Fixed margins: tight_layout takes seconds with 160 labels
    width, height = max(margin + n * cell + 1.4, 6.8), margin + n * cell + 0.9
    left = (width - n * cell - 1.4 + margin) / 2
    fig = _figure((width, height))
    ax = fig.add_axes((left / width, margin / height, n * cell / width, n * cell / height))
    cax = fig.add_axes(((left + n * cell + 0.2) / width, margin / height, 0.2 / width, n * cell / height))
    from matplotlib.colors import LogNorm, Normalize

    shown = np.ma.masked_where(values == 0, values)
    # counts span 1 to thousands (a frequent class's diagonal): a log scale keeps single confusions visible
    norm = Normalize(-0.1, 1) if normalized else LogNorm(0.5, max(values.max(), 2))  # below 0: no entry stays white
    image = ax.imshow(shown, cmap="Blues", norm=norm, aspect="auto")
    bar = fig.colorbar(image, cax=cax)
    if normalized:
        bar.set_ticks([0, 0.2, 0.4, 0.6, 0.8, 1.0])
        cax.set_ylim(0, 1)
    ax.set_xticks(range(n), confusion.names, rotation=90, fontsize=fontsize)
    ax.set_yticks(range(n), confusion.names, fontsize=fontsize)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.axhline(n - 1.5, color="grey", lw=0.8)
    ax.axvline(n - 1.5, color="grey", lw=0.8)
    if n <= 31:
        for i, j in zip(*np.nonzero(values)):
            text = f"{values[i, j]:.2f}" if normalized else f"{int(values[i, j])}"
            dark = norm(values[i, j]) > 0.6
            ax.text(j, i, text, ha="center", va="center", fontsize=7, color="white" if dark else "black")
    what = "each row divided by its sum" if normalized else "counts, log colour scale"
    fig.suptitle(f"Confusion matrix ({what}); score > {confusion.score_threshold:g}, IoU >= {confusion.iou_threshold:g}\n"
                 "last row: false positives; last column: missed objects", fontsize=10,
                 y=1 - 0.1 / height, va="top")
    return _save(fig, path)


def plot_tide(report: TideReport, path: str | Path | None = None) -> Figure:
    """TIDE's dAP of each main error type and of perfect precision / recall, as bars."""
    fig = _figure((9, 3.6))
    left, right = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 1.3]})
    colors = ["#d62728", "#ff7f0e", "#bcbd22", "#9467bd", "#1f77b4", "#7f7f7f"]
    main = [report.main[k] for k in ERROR_TYPES]
    bars = left.bar(ERROR_TYPES, main, color=colors)
    left.bar_label(bars, labels=[f"{v:.2f}\n({report.counts[k]})" for k, v in zip(ERROR_TYPES, main)], fontsize=8)
    left.set_ylabel("dAP (AP x100 gained by fixing it)")
    left.set_title(f"TIDE main errors (count below the value); AP{round(report.pos_threshold * 100)} = {report.ap:.2f}",
                   fontsize=10)
    left.set_ylim(0, max(max(main), 1) * 1.3)
    special = [report.special[k] for k in SPECIAL_TYPES]
    bars = right.bar(SPECIAL_TYPES, special, color=["#8c564b", "#e377c2"])
    right.bar_label(bars, labels=[f"{v:.2f}" for v in special], fontsize=8)
    right.set_title("perfect precision / recall", fontsize=10)
    right.set_ylim(min(0, min(special)) * 1.3, max(max(special), 1) * 1.3)
    fig.tight_layout()
    return _save(fig, path)
