"""The level shapes and per-position tables of Deformable DETR's multi-scale features, eager or traced.

Eager, the shapes are Python ints and :func:`~visiontf.models.deformable_detr.deformable_transformer.level_layout`
builds the tables once per set of shapes (cached). While a graph is traced for ONNX
(:func:`~visiontf.nn.ms_deform_tables.tracing_shapes`), the shapes stay the traced sizes of the
feature maps and :func:`traced_level_layout` computes the same tables with tensor operations on
them, so the exported graph follows the input's height and width instead of holding the export
size as constants.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from visiontf.models.deformable_detr.deformable_transformer import LevelLayout, level_layout
from visiontf.nn.ms_deform_tables import size_table, tracing_shapes

__all__ = ["feature_levels", "traced_level_layout"]


def feature_levels(maps: Sequence[Tensor], device: torch.device) -> tuple[list[tuple], LevelLayout]:
    """``(shapes, layout)`` of the (B, C, H_l, W_l) feature ``maps``: Python ints and the cached tables
    eagerly; traced sizes and tables computed from them while tracing."""
    if tracing_shapes():
        shapes = [(m.shape[-2], m.shape[-1]) for m in maps]
        return shapes, traced_level_layout(shapes, device)
    shapes = [(int(m.shape[-2]), int(m.shape[-1])) for m in maps]
    return shapes, level_layout(tuple(shapes), device)


def traced_level_layout(shapes: Sequence[tuple], device: torch.device) -> LevelLayout:
    """:func:`~visiontf.models.deformable_detr.deformable_transformer.level_layout`'s tables (the same values, dtypes
    and order) from sizes that may be traced 0-dim tensors: one arange pair per level, no Python
    int of a size, no cache."""
    levels, xys, first_cols, first_rows = [], [], [], []
    start = 0  # first flattened position of the level
    for lvl, (h, w) in enumerate(shapes):
        ys, xs = torch.arange(h, device=device), torch.arange(w, device=device)
        # row-major positions of an h x w map, by broadcasting (an expand to a traced size would not export)
        y = (ys[:, None] + 0 * xs[None, :]).flatten()
        x = (xs[None, :] + 0 * ys[:, None]).flatten()
        xys.append(torch.stack((x, y), -1))
        levels.append(torch.full_like(x, lvl))
        first_cols.append(start + ys * w)
        first_rows.append(start + xs)
        start = start + h * w
    return LevelLayout(
        shapes=tuple(shapes),
        level=torch.cat(levels),
        xy=torch.cat(xys).float(),
        size=size_table(shapes, torch.float32, device),
        first_col=torch.cat(first_cols),
        first_row=torch.cat(first_rows),
    )
