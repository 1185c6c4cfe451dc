"""Image-restoration scores with the protocol of IPT / EDSR (``utility.calc_psnr`` and ``utility.quantize``).

* :func:`quantize`: outputs rounded to 8 bits (``x * 255 / rgb_range``, clamped to [0, 255],
  rounded, scaled back), as the original does to every output before scoring.
* :func:`calc_psnr`: ``(sr - hr) / rgb_range``; on the luma Y by default, with EDSR's weights
  ``[65.738, 129.057, 25.064] / 256`` (no offset: it cancels in the difference); ``scale`` pixels
  cut at every border (none at scale 1); ``-10 log10(MSE)`` per image. ``y_only=False`` is PSNR
  over the RGB channels. The dataset score is the mean of the per-image values.
* :func:`calc_ssim`: the usual Y-channel SSIM of the SR literature (MATLAB's ``ssim_index`` as
  BasicSR computes it): luma ``16 + (65.481 R + 128.553 G + 24.966 B)`` in [16, 235] on the 0-255
  scale, the same border cut, an 11x11 Gaussian window with sigma 1.5, data range 255, averaged
  over the windows that lie inside the image. The IPT release scores PSNR only.
  torchmetrics' ``structural_similarity_index_measure`` is not used: it reflect-pads the image
  and averages over every pixel, border windows included, which gives another number (about
  3.5e-4 apart on a 48x45 crop); ``tests/evaluation/test_restoration_metrics.py`` checks this one against a
  BasicSR-style OpenCV implementation.

Images are (B, 3, H, W) tensors in [0, ``rgb_range``]; ``hr`` must have ``sr``'s size (cut the
high-resolution image to a multiple of the scale first, as the SR benchmarks do).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

#: EDSR's / IPT's luma weights for PSNR-Y (MATLAB's rgb2ycbcr with /256 instead of /255)
PSNR_Y_WEIGHTS = (65.738, 129.057, 25.064)
#: MATLAB rgb2ycbcr's luma for SSIM-Y: 16 + weights . RGB (RGB in [0, 1])
SSIM_Y_WEIGHTS = (65.481, 128.553, 24.966)


def quantize(img: Tensor, rgb_range: float = 1.0) -> Tensor:
    """Round to the 8-bit grid of the [0, ``rgb_range``] scale, clamping to it: what an image saved as 8-bit
    PNG holds, as IPT scores its outputs."""
    levels = 255.0 / rgb_range  # 8-bit steps per unit of the image's scale
    return torch.round(torch.clamp(img * levels, 0.0, 255.0)) / levels


def _check_pair(sr: Tensor, hr: Tensor, scale: int) -> None:
    if sr.dim() != 4 or sr.shape[1] != 3:
        raise ValueError(f"expected RGB images (B, 3, H, W), got {tuple(sr.shape)}")
    if sr.shape != hr.shape:
        raise ValueError(
            f"sr {tuple(sr.shape)} and hr {tuple(hr.shape)} differ in size; cut the high-resolution image to "
            f"a multiple of the scale (hr[..., :H - H % {scale}, :W - W % {scale}]) before upscaling its low-resolution one"
        )
    if scale < 1 or min(sr.shape[-2:]) <= 2 * scale:
        raise ValueError(f"scale {scale}: images of {tuple(sr.shape[-2:])} pixels have nothing left after the border cut")
    if not (torch.isfinite(sr).all() and torch.isfinite(hr).all()):
        raise ValueError("sr or hr contains NaN or infinite values")


def _crop(x: Tensor, scale: int) -> Tensor:
    return x if scale == 1 else x[..., scale:-scale, scale:-scale]


def calc_psnr(sr: Tensor, hr: Tensor, scale: int, rgb_range: float = 1.0, y_only: bool = True,
              quantize_sr: bool = True) -> Tensor:
    """PSNR per image (B,), in dB, as IPT's ``utility.calc_psnr`` after ``utility.quantize``.

    Args:
        sr: restored images (B, 3, H, W) in [0, ``rgb_range``] (quantized first unless ``quantize_sr=False``).
        hr: ground truth, same shape.
        scale: SR factor; as many pixels are cut at each border (1: none; denoising, deraining).
        rgb_range: the images' value range (1 for visiontf's models, 255 for the original's).
        y_only: on the luma (the papers' numbers); False: over the RGB channels.
    """
    _check_pair(sr, hr, scale)
    if quantize_sr:
        sr = quantize(sr, rgb_range)
    diff = (sr.double() - hr.double()) / rgb_range
    if y_only:
        weights = diff.new_tensor(PSNR_Y_WEIGHTS).view(1, 3, 1, 1) / 256
        diff = diff.mul(weights).sum(dim=1)
    mse = _crop(diff, scale).pow(2).flatten(1).mean(dim=1)
    return -10 * torch.log10(mse)


def rgb_to_y(img: Tensor, rgb_range: float = 1.0) -> Tensor:
    """MATLAB's ``rgb2ycbcr`` luma on the 0-255 scale: (B, 3, H, W) in [0, rgb_range] -> (B, 1, H, W) in [16, 235]."""
    weights = img.new_tensor(SSIM_Y_WEIGHTS).view(1, 3, 1, 1)
    return (img / rgb_range).mul(weights).sum(dim=1, keepdim=True) + 16.0


def calc_ssim(sr: Tensor, hr: Tensor, scale: int, rgb_range: float = 1.0, y_only: bool = True,
              quantize_sr: bool = True) -> Tensor:
    """SSIM per image (B,): Y channel (or RGB, channels averaged), ``scale`` border cut, Gaussian 11 / 1.5, data range 255."""
    _check_pair(sr, hr, scale)
    if quantize_sr:
        sr = quantize(sr, rgb_range)
    sr, hr = sr.double(), hr.double()
    if y_only:
        sr, hr = rgb_to_y(sr, rgb_range), rgb_to_y(hr, rgb_range)
    else:
        sr, hr = sr * (255 / rgb_range), hr * (255 / rgb_range)
    sr, hr = _crop(sr, scale), _crop(hr, scale)
    if min(sr.shape[-2:]) < 11:
        raise ValueError(f"SSIM needs at least 11x11 pixels after the border cut, got {tuple(sr.shape[-2:])}")
    return _ssim_valid(sr, hr, data_range=255.0)


def _ssim_valid(x: Tensor, y: Tensor, data_range: float, size: int = 11, sigma: float = 1.5) -> Tensor:
    """Mean SSIM over the Gaussian windows inside the image, per image (channels averaged)."""
    coords = torch.arange(size, dtype=x.dtype, device=x.device) - (size - 1) / 2
    g = torch.exp(-coords.pow(2) / (2 * sigma**2))
    g = g / g.sum()
    channels = x.shape[1]
    window = (g[:, None] * g[None, :]).expand(channels, 1, size, size)

    def blur(t: Tensor) -> Tensor:
        return F.conv2d(t, window, groups=channels)

    c1, c2 = (0.01 * data_range) ** 2, (0.03 * data_range) ** 2
    mx, my = blur(x), blur(y)
    vx, vy, cxy = blur(x * x) - mx * mx, blur(y * y) - my * my, blur(x * y) - mx * my
    ssim = (2 * mx * my + c1) * (2 * cxy + c2) / ((mx * mx + my * my + c1) * (vx + vy + c2))
    return ssim.flatten(1).mean(dim=1)
