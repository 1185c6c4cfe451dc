"""The memory layout a convolutional backbone runs its images in.

oneDNN's CPU convolutions read channels-last maps without reordering them: in inference at 640 x 640 on one thread,
RT-DETR-R18's and D-FINE-N's backbones (the convolutions after them follow their input's layout) took 5-11% less time
than in PyTorch's default layout (``benchmarks/realtime_detr.py``). The values are the same up to float32 rounding.
Training keeps the layout the backbone was built with: in float32 the other rounding, carried through the BatchNorms'
batch statistics of a network of random weights, moved RT-DETR's training outputs by up to 3e-4, over the 1e-4 its
parity tests against the originals allow.
"""
from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["conv_layout"]


def conv_layout(images: Tensor, channels_last: bool, training: bool) -> Tensor:
    """``images`` in the layout the backbone runs: channels-last when built so (``channels_last``), and in inference on
    the CPU (not ``training``, no gradients); otherwise as given."""
    if channels_last or (not training and images.device.type == "cpu" and not torch.is_grad_enabled()):
        return images.contiguous(memory_format=torch.channels_last)
    return images
