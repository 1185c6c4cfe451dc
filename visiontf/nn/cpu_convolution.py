"""Faster convolutions for inference on the CPU: the layout of a backbone's images, and oneDNN for every convolution.

Both change how a result is computed, not what: the values equal PyTorch's default path up to float32 rounding.
Training keeps the default path: in float32 the other rounding, carried through the BatchNorms' batch statistics of a
network of random weights, moved RT-DETR's training outputs past the 1e-4 its parity tests against the originals allow.

* :func:`conv_layout`: oneDNN's convolutions read channels-last maps without reordering them. The convolutions after
  a backbone's first one follow their input's layout, so converting the images is enough.
* :class:`OneDNNConv2d`: with one thread and fewer than 16 images, PyTorch computes a 1 x 1 convolution of stride 1 as
  a BLAS matrix product rather than with oneDNN, which is several times slower where the BLAS is not tuned for the CPU
  (torch's MKL on AMD processors), and 1 x 1 convolutions are half of D-FINE-S's work. In inference the class sends
  every float32 convolution to ``torch.mkldnn_convolution``, which PyTorch itself calls for the others.
  :func:`use_onednn_convolutions` gives it to a model's plain convolutions (their class changes; their parameters,
  state dict and hooks do not). The measurements: docs/record/speed.md.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["OneDNNConv2d", "conv_layout", "use_onednn_convolutions"]


def _cpu_inference(x: Tensor) -> bool:
    """No gradients, on the CPU, eager (a traced or exported graph keeps PyTorch's convolution node)."""
    return (x.device.type == "cpu" and not torch.is_grad_enabled() and not torch.jit.is_tracing()
            and not torch.onnx.is_in_onnx_export() and not torch.compiler.is_compiling())


def conv_layout(images: Tensor, channels_last: bool, training: bool) -> Tensor:
    """``images`` in the layout a backbone runs: channels-last when built so (``channels_last``), and in inference on
    the CPU (not ``training``, no gradients); otherwise as given."""
    if channels_last or (not training and _cpu_inference(images)):
        return images.contiguous(memory_format=torch.channels_last)
    return images


class OneDNNConv2d(nn.Conv2d):
    """``nn.Conv2d`` whose float32 inference on the CPU is oneDNN's convolution whatever its shape and thread count
    (see the module docstring); training, other dtypes, autocast and other devices run ``nn.Conv2d``'s path."""

    def _conv_forward(self, input: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        if (input.dtype == torch.float32 and weight.dtype == torch.float32 and self.padding_mode == "zeros"
                and isinstance(self.padding, tuple) and torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled
                and _cpu_inference(input) and not torch.is_autocast_enabled("cpu")):
            return torch.mkldnn_convolution(input, weight, bias, self.padding, self.stride, self.dilation, self.groups)
        return super()._conv_forward(input, weight, bias)


def use_onednn_convolutions(root: nn.Module) -> int:
    """Give every plain ``nn.Conv2d`` under ``root`` :class:`OneDNNConv2d`'s inference path, in place; returns how many
    changed (subclasses with their own forward are left as they are; running it again changes nothing)."""
    changed = 0
    for module in root.modules():
        if type(module) is nn.Conv2d:
            module.__class__ = OneDNNConv2d
            changed += 1
    return changed
