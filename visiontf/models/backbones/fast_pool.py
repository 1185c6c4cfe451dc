"""A max-pool whose inference path is the maximum of shifted, strided views of the input.

On the CPU, ``F.max_pool2d`` of a dense tensor runs ``max_pool2d_with_indices``, which also computes the argmax
indices and is slow: at 640 x 640 on one thread the ResNet-vd stem's 3 x 3 / 2 pool took about 12% of RT-DETR-R18's
inference, and HGNetv2's 2 x 2 / 1 stem pool 13% of D-FINE-N's. The maximum over a window taken as ``k`` row shifts
then ``k`` column shifts is the same value bit for bit (the maximum is exact) at a fraction of the time. Training
keeps the pool itself: where a window holds a tie, its gradient goes to one element, ``torch.maximum``'s is split.
An ONNX export keeps it too (one ``MaxPool`` node: onnxruntime's pool is fast, its slices of shifted views are not).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["ShiftedMaxPool", "replace_max_pool"]


class ShiftedMaxPool(nn.Module):
    """``nn.MaxPool2d(kernel_size, stride, padding)`` (floor mode; dilation 1) with a faster inference path."""

    def __init__(self, kernel_size: int, stride: int, padding: int = 0) -> None:
        super().__init__()
        self.kernel_size, self.stride, self.padding = int(kernel_size), int(stride), int(padding)

    def forward(self, x: Tensor) -> Tensor:
        k, s, p = self.kernel_size, self.stride, self.padding
        # an ONNX graph keeps the pool: one MaxPool node, which onnxruntime runs faster than the shifted views' slices
        if self.training and torch.is_grad_enabled() or torch.onnx.is_in_onnx_export():
            return F.max_pool2d(x, k, s, p)
        if p:
            x = F.pad(x, (p, p, p, p), value=float("-inf"))
        out_h, out_w = (x.shape[-2] - k) // s + 1, (x.shape[-1] - k) // s + 1
        rows = x[..., 0: s * (out_h - 1) + 1: s, :]
        for i in range(1, k):
            rows = torch.maximum(rows, x[..., i: i + s * (out_h - 1) + 1: s, :])
        out = rows[..., 0: s * (out_w - 1) + 1: s]
        for j in range(1, k):
            out = torch.maximum(out, rows[..., j: j + s * (out_w - 1) + 1: s])
        return out

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


def _as_int(v) -> int | None:
    if isinstance(v, tuple):
        return int(v[0]) if len(set(v)) == 1 else None
    return int(v)


def replace_max_pool(parent: nn.Module, name: str) -> bool:
    """Put a :class:`ShiftedMaxPool` in place of ``parent.<name>`` when it is an ``nn.MaxPool2d`` of square window,
    stride and padding, dilation 1, and floor mode or stride 1 (where ceil mode gives the same size); whether it did."""
    pool = getattr(parent, name, None)
    if not isinstance(pool, nn.MaxPool2d) or pool.return_indices:
        return False
    k, s, p, d = (_as_int(v) for v in (pool.kernel_size, pool.stride, pool.padding, pool.dilation))
    if None in (k, s, p) or d != 1 or (pool.ceil_mode and s != 1):
        return False
    setattr(parent, name, ShiftedMaxPool(k, s, p))
    return True
