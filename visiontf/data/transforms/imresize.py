"""MATLAB's ``imresize(img, 1/s, 'bicubic')``: the resize the SR benchmarks' low-resolution images were made with.

DIV2K's ``LR_bicubic`` and the Set5/Set14/B100/Urban100 ``LR_bicubic`` / ``LRbicx{s}`` files are
MATLAB ``imresize`` of the 8-bit HR image: Keys' cubic kernel (a = -0.5), widened by the scale when
shrinking (antialiasing: kernel ``s * cubic(s * x)`` over ``4 / s`` pixels, weights normalised to sum 1),
the output pixel ``x`` (1-based) sampling the input at ``u = x / s + 0.5 (1 - 1 / s)``, symmetric
(mirror, edge repeated) padding, and 8-bit outputs rounded half away from zero.
PIL's and OpenCV's bicubic differ (no antialiasing in OpenCV, another a in both), by more than a
PSNR table's last digit, so they are not used. For x2 the 8 weights are
``[-0.01171875, -0.03515625, 0.11328125, 0.43359375, 0.43359375, 0.11328125, -0.03515625, -0.01171875]``
(``tests/data/test_restoration_data.py`` checks them and a ramp by hand).
"""
from __future__ import annotations

import math

import numpy as np


def cubic(x: np.ndarray) -> np.ndarray:
    """Keys' cubic convolution kernel with a = -0.5 (MATLAB's ``cubic``)."""
    ax = np.abs(x)
    ax2, ax3 = ax**2, ax**3
    return ((1.5 * ax3 - 2.5 * ax2 + 1) * (ax <= 1)
            + (-0.5 * ax3 + 2.5 * ax2 - 4 * ax + 2) * ((ax > 1) & (ax <= 2)))


def resize_weights(in_len: int, out_len: int, scale: float, antialias: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """MATLAB's ``contributions``: (out_len, P) weights and 0-based input indices (symmetric padding applied)."""
    kernel_width = 4.0
    if scale < 1 and antialias:
        kernel_width /= scale
    x = np.arange(1, out_len + 1, dtype=np.float64)
    u = x / scale + 0.5 * (1 - 1 / scale)
    left = np.floor(u - kernel_width / 2)
    p = int(math.ceil(kernel_width)) + 2
    indices = left[:, None] + np.arange(p)[None, :]  # 1-based
    dist = u[:, None] - indices
    weights = scale * cubic(dist * scale) if (scale < 1 and antialias) else cubic(dist)
    weights = weights / weights.sum(axis=1, keepdims=True)
    # symmetric padding: index sequence 1..n, n..1 repeated
    aux = np.concatenate([np.arange(in_len), np.arange(in_len)[::-1]])
    indices = aux[np.mod(indices.astype(np.int64) - 1, aux.size)]
    keep = np.any(weights != 0, axis=0)  # MATLAB drops all-zero columns
    return weights[:, keep], indices[:, keep]


def _resize_axis(img: np.ndarray, axis: int, out_len: int, scale: float) -> np.ndarray:
    weights, indices = resize_weights(img.shape[axis], out_len, scale)
    moved = np.moveaxis(img, axis, 0)  # (L, ...)
    gathered = moved[indices]  # (out, P, ...)
    w = weights.reshape(weights.shape + (1,) * (moved.ndim - 1))
    return np.moveaxis((gathered * w).sum(axis=1), 0, axis)


def imresize(img: np.ndarray, scale: float | None = None, output_shape: tuple[int, int] | None = None) -> np.ndarray:
    """MATLAB ``imresize(img, scale, 'bicubic')`` of an (H, W) or (H, W, C) array.

    ``scale`` < 1 shrinks; the output size is ``ceil(H * scale), ceil(W * scale)`` unless
    ``output_shape`` is given. A uint8 image gives a uint8 image (rounded half away from zero,
    clamped, as MATLAB); a float image a float64 one. The shorter relative change is applied first
    (MATLAB's order: the dimension with the smaller scale first).
    """
    if scale is None and output_shape is None:
        raise ValueError("imresize: give scale or output_shape")
    h, w = img.shape[:2]
    if output_shape is None:
        output_shape = (int(math.ceil(h * scale)), int(math.ceil(w * scale)))
    scales = (output_shape[0] / h, output_shape[1] / w) if scale is None else (float(scale), float(scale))
    out = img.astype(np.float64)
    for axis in np.argsort(scales, kind="stable"):
        out = _resize_axis(out, int(axis), output_shape[int(axis)], scales[int(axis)])
    if img.dtype == np.uint8:
        return np.clip(np.floor(out + 0.5), 0, 255).astype(np.uint8)  # >= 0 after the clip: half away from zero
    return out


def bicubic_downscale(hr: np.ndarray, scale: int) -> np.ndarray:
    """The benchmark LR image of an 8-bit HR image: ``hr`` cut to a multiple of ``scale``, then
    ``imresize(hr, 1 / scale, 'bicubic')`` (uint8)."""
    h, w = hr.shape[:2]
    hr = hr[: h - h % scale, : w - w % scale]
    return imresize(hr, output_shape=(hr.shape[0] // scale, hr.shape[1] // scale), scale=1.0 / scale)


__all__ = ["bicubic_downscale", "cubic", "imresize", "resize_weights"]
