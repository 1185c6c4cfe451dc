"""IPT's tiled inference (``forward_chop``) and x8 self-ensemble (``forward_x8``), batched.

The maths are those of the original ``model/__init__.py`` (huawei-noah/Pretrained-IPT), rewritten
for a batch of images and with each tile computed once:

* tiles of ``tile`` pixels (the original ``--patch_size``, 48) start every ``stride = tile // 4``
  pixels (12; the original's ``shave = tile // 2`` and ``int(shave / 2)``) from the top-left
  corner; the grid covers ``h - h_cut`` x ``w - w_cut`` pixels, ``h_cut = (h - tile) % stride``;
* the bottom and right borders come from one extra row / column of tiles flush with the image's
  edge (the original's ``cut_h`` / ``cut_w`` strips) and the corner tile;
* in the output, every tile keeps its central part (a margin of ``stride * scale`` cut on each
  side) and overlapping central parts are averaged (a fold-of-ones divisor); the outer margin of
  the image comes from the first / last tiles, in the order the original writes them: the top
  strip, then the left strip, then the averaged interior, then the bottom strip, the right strip
  and the corner spliced in at ``(tile - cut) / 2 * scale`` from the edge.

The original computes the tiles of the top and left strips twice (they are the grid's first row
and column) and runs one image at a time; here every distinct tile of every image of the batch
goes through the model once, ``crop_batch_size`` tiles per call. The result equals
what Pretrained-IPT's own ``forward_chop`` computed, image by image (``tests/models/ipt/test_ipt_tiling.py``, on
fixtures ``scripts/fixtures/make_ipt.py`` recorded).
"""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from visiontf.core.progress import progress

TileFn = Callable[[Tensor], Tensor]


def chop_geometry(h: int, w: int, tile: int) -> dict[str, int]:
    """The numbers ``forward_chop`` uses for an ``h`` x ``w`` input (for documentation and tests)."""
    if tile % 4:
        raise ValueError(f"tile must be a multiple of 4 (the stride is tile // 4), got {tile}")
    stride = tile // 4
    if h < tile or w < tile:
        raise ValueError(f"forward_chop needs an image of at least {tile}x{tile} pixels, got {h}x{w}")
    return {"stride": stride, "shave": tile // 2, "h_cut": (h - tile) % stride, "w_cut": (w - tile) % stride,
            "rows": (h - tile) // stride + 1, "cols": (w - tile) // stride + 1}


def _as_blocks(t: Tensor) -> Tensor:
    """(B, L, C, kh, kw) tiles -> (B, C*kh*kw, L), the layout F.fold takes."""
    return t.flatten(2).transpose(1, 2)


def _fold_sum(t: Tensor, rows: int, cols: int, step: int) -> Tensor:
    """Overlapping tiles (B, rows*cols, C, P, P), row-major, ``step`` apart: their sum on one canvas."""
    P = t.shape[-1]
    size = ((rows - 1) * step + P, (cols - 1) * step + P)
    return F.fold(_as_blocks(t), size, P, stride=step)


def _average_inner(t: Tensor, rows: int, cols: int, step: int, crop_rows: bool, crop_cols: bool) -> Tensor:
    """The tiles' central parts (a ``step`` margin cut along the cropped axes), overlaps averaged."""
    P = t.shape[-1]
    mr, mc = (step if crop_rows else 0), (step if crop_cols else 0)
    t = t[..., mr:P - mr, mc:P - mc]
    kernel = (P - 2 * mr, P - 2 * mc)
    size = ((rows - 1) * step + kernel[0], (cols - 1) * step + kernel[1])
    total = F.fold(_as_blocks(t), size, kernel, stride=step)
    ones = torch.ones((1, 1, *size), dtype=t.dtype, device=t.device)
    count = F.fold(F.unfold(ones, kernel, stride=step), size, kernel, stride=step)
    return total / count


def _strip(t: Tensor, rows: int, cols: int, step: int) -> Tensor:
    """One row (``rows == 1``) or column of tiles: summed, then averaged across the strip's length."""
    y = _fold_sum(t, rows, cols, step)
    if rows == 1:
        y[..., :, step:y.shape[-1] - step] = _average_inner(t, 1, cols, step, False, True)
    else:
        y[..., step:y.shape[-2] - step, :] = _average_inner(t, rows, 1, step, True, False)
    return y


def forward_chop(fn: TileFn, x: Tensor, tile: int = 48, scale: int = 1, crop_batch_size: int = 64) -> Tensor:
    """Run ``fn`` over overlapping ``tile`` x ``tile`` windows of ``x`` and blend them as the original.

    Args:
        fn: (N, C, tile, tile) -> (N, C', tile * scale, tile * scale), e.g. IPT on one window.
        x: (B, C, h, w) with h, w >= ``tile``.
        tile: window size (the original ``--patch_size``, 48).
        scale: ``fn``'s upscaling factor.
        crop_batch_size: windows per call of ``fn`` (the original ``--crop_batch_size``, 64).

    Returns:
        (B, C', h * scale, w * scale).
    """
    B, _, h, w = x.shape
    g = chop_geometry(h, w, tile)
    stride, rows, cols = g["stride"], g["rows"], g["cols"]
    origins: dict[tuple[int, int], int] = {}

    def index(r: int, c: int) -> int:
        return origins.setdefault((r, c), len(origins))

    grid = [index(i * stride, j * stride) for i in range(rows) for j in range(cols)]
    bottom = [index(h - tile, j * stride) for j in range(cols)]
    right = [index(i * stride, w - tile) for i in range(rows)]
    corner = index(h - tile, w - tile)

    windows = torch.stack([x[:, :, r:r + tile, c:c + tile] for r, c in origins], dim=1).flatten(0, 1)
    n = windows.shape[0]
    # a 2000x1500 photo is 20,000 tiles of 48 px, minutes on a CPU: said as it goes, with an estimate
    parts = []
    with progress(total=n, desc=f"{n} tiles of {tile}x{tile}", unit="tile") as bar:
        for i in range(0, n, crop_batch_size):
            parts.append(fn(windows[i:i + crop_batch_size]))
            bar.update(min(crop_batch_size, n - i))
    out = torch.cat(parts)
    out = out.unflatten(0, (B, len(origins)))  # (B, K, C', P, P)
    P = out.shape[-1]
    if P != tile * scale:
        raise ValueError(f"the tile function returned {P}x{P} windows for {tile}x{tile} inputs at scale {scale}")
    step = stride * scale

    def pick(idx: list[int]) -> Tensor:
        return out[:, idx]

    y = _fold_sum(pick(grid), rows, cols, step)
    H, W = y.shape[-2:]
    y[..., :P, :] = _strip(pick(grid[:cols]), 1, cols, step)  # top strip
    y[..., :, :P] = _strip(pick(grid[::cols]), rows, 1, step)  # left strip
    y[..., step:H - step, step:W - step] = _average_inner(pick(grid), rows, cols, step, True, True)

    y_bottom = _strip(pick(bottom), 1, cols, step)  # (B, C', P, W)
    y_right = _strip(pick(right), rows, 1, step)  # (B, C', H, P)
    y_corner = out[:, corner]
    dh = (tile - g["h_cut"]) / 2 * scale
    dw = (tile - g["w_cut"]) / 2 * scale
    y = torch.cat([y[..., :H - int(dh), :], y_bottom[..., int(dh + 0.5):, :]], dim=2)
    y_right = torch.cat([y_right[..., :H - int(dh), :], y_corner[..., int(dh + 0.5):, :]], dim=2)
    return torch.cat([y[..., :, :W - int(dw)], y_right[..., :, int(dw + 0.5):]], dim=3)


def forward_x8(fn: Callable[[Tensor], Tensor], x: Tensor) -> Tensor:
    """The original x8 self-ensemble: ``fn`` on the 8 flips/transposes of ``x`` (B, C, H, W), undone, averaged."""
    xs = [x]
    for op in (lambda v: v.flip(-1), lambda v: v.flip(-2), lambda v: v.transpose(-2, -1)):
        xs.extend([op(v) for v in xs])
    ys = []
    for i, v in enumerate(xs):
        y = fn(v)
        if i > 3:
            y = y.transpose(-2, -1)
        if i % 4 > 1:
            y = y.flip(-2)
        if i % 2 == 1:
            y = y.flip(-1)
        ys.append(y)
    return torch.stack(ys).mean(dim=0)
