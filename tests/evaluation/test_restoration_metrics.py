"""PSNR / SSIM with IPT's scoring protocol.

``tests/fixtures/ipt/psnr.safetensors`` holds what the original's ``utility.quantize`` and ``utility.calc_psnr``
returned (``scripts/fixtures/make_ipt.py``), for Y and RGB PSNR at scales 1 to 4, in float32 and float64.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from reference.fixtures import load_fixture

from visiontf.tasks.restoration.restoration_measures import calc_psnr, calc_ssim, quantize, rgb_to_y


def _pair(h=40, w=52, seed=0, noise=0.05):
    g = torch.Generator().manual_seed(seed)
    hr = torch.randint(0, 256, (1, 3, h, w), generator=g).double() / 255
    sr = hr + noise * torch.randn(hr.shape, generator=g, dtype=torch.float64)
    return sr, hr


@pytest.mark.parametrize("scale", [1, 2, 3, 4])
@pytest.mark.parametrize("y_only", [True, False])
def test_psnr_is_the_originals(scale, y_only):
    """The original protocol: quantize the output, then utility.calc_psnr, in 0-255 or in [0, 1], per image."""
    fx = load_fixture("ipt", "psnr")
    key = f"psnr_{'y' if y_only else 'rgb'}_x{scale}"
    sr, hr = fx.inputs["sr"].double(), fx.inputs["hr"].double()
    expected = fx.outputs["float64"][key]
    assert calc_psnr(sr, hr, scale, y_only=y_only) == pytest.approx(expected.tolist(), abs=1e-9)
    assert calc_psnr(sr * 255, hr * 255, scale, rgb_range=255, y_only=y_only) == pytest.approx(expected.tolist(), abs=1e-9)
    # float32 inputs, as the original scores them: the same to well under the 0.01 dB reported
    expected32 = fx.outputs["float32"][key]
    assert calc_psnr(fx.inputs["sr"], fx.inputs["hr"], scale, y_only=y_only) == pytest.approx(expected32.tolist(), abs=1e-4)


def test_psnr_per_image_and_quantization():
    sr, hr = _pair()
    sr2, hr2 = _pair(seed=5, noise=0.1)
    both = calc_psnr(torch.cat([sr, sr2]), torch.cat([hr, hr2]), 2)
    assert both.shape == (2,)
    assert both[1].item() == pytest.approx(calc_psnr(sr2, hr2, 2).item())
    fx = load_fixture("ipt", "psnr")  # the original's utility.quantize(sr * 255, 255), in 0-255
    for dtype in ("float32", "float64"):
        x = fx.inputs["sr"].to(getattr(torch, dtype))
        assert torch.equal(quantize(x * 255, rgb_range=255), fx.outputs[dtype]["quantized"])
        assert torch.equal(quantize(x), quantize(x * 255, rgb_range=255) / 255)
    # quantization: values off the 8-bit grid and out of range are rounded and clamped first
    assert calc_psnr(hr + 0.4 / 255, hr, 1).item() == math.inf
    assert calc_psnr(hr + 0.4 / 255, hr, 1, quantize_sr=False).item() < 100


def test_psnr_bad_inputs():
    sr, hr = _pair(40, 52)
    with pytest.raises(ValueError, match="multiple of the scale"):
        calc_psnr(sr, hr[..., :51], 2)
    with pytest.raises(ValueError, match="NaN"):
        calc_psnr(torch.full_like(sr, float("nan")), hr, 2)
    with pytest.raises(ValueError, match="nothing left"):
        calc_psnr(sr[..., :8, :8], hr[..., :8, :8], 4)
    with pytest.raises(ValueError, match=r"\(B, 3, H, W\)"):
        calc_psnr(sr[:, :1], hr[:, :1], 2)


def _basicsr_ssim(x: torch.Tensor, y: torch.Tensor) -> float:
    """BasicSR's ``_ssim`` (MATLAB's ssim_index) on one 0-255 channel, with OpenCV: valid windows only."""
    cv2 = pytest.importorskip("cv2")
    a, b = x.numpy().astype(np.float64), y.numpy().astype(np.float64)
    k = cv2.getGaussianKernel(11, 1.5)
    window = np.outer(k, k.transpose())
    c1, c2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2
    mu1, mu2 = cv2.filter2D(a, -1, window)[5:-5, 5:-5], cv2.filter2D(b, -1, window)[5:-5, 5:-5]
    s11 = cv2.filter2D(a**2, -1, window)[5:-5, 5:-5] - mu1**2
    s22 = cv2.filter2D(b**2, -1, window)[5:-5, 5:-5] - mu2**2
    s12 = cv2.filter2D(a * b, -1, window)[5:-5, 5:-5] - mu1 * mu2
    ssim = ((2 * mu1 * mu2 + c1) * (2 * s12 + c2)) / ((mu1**2 + mu2**2 + c1) * (s11 + s22 + c2))
    return float(ssim.mean())


@pytest.mark.parametrize("scale", [1, 3])
def test_ssim_is_the_usual_y_channel_ssim(scale):
    sr, hr = _pair(48, 45, seed=7)
    q = quantize(sr)
    crop = (0, slice(None), slice(scale, -scale), slice(scale, -scale)) if scale > 1 else (0,)
    y_sr, y_hr = rgb_to_y(q)[crop], rgb_to_y(hr)[crop]
    got = calc_ssim(sr, hr, scale)
    assert got.shape == (1,) and got.item() == pytest.approx(_basicsr_ssim(y_sr[0], y_hr[0]), abs=1e-9)
    rgb = np.mean([_basicsr_ssim((q * 255)[crop][c], (hr * 255)[crop][c]) for c in range(3)])
    assert calc_ssim(sr, hr, scale, y_only=False).item() == pytest.approx(rgb, abs=1e-9)
    assert calc_ssim(hr, hr, scale).item() == pytest.approx(1.0)
    # MATLAB's luma: 16 for black, 235 for white
    assert rgb_to_y(torch.zeros(1, 3, 1, 1)).item() == pytest.approx(16)
    assert rgb_to_y(torch.ones(1, 3, 1, 1)).item() == pytest.approx(235, abs=1e-3)
    with pytest.raises(ValueError, match="11x11"):
        calc_ssim(sr[..., :12, :12], hr[..., :12, :12], 2)


def test_torchmetrics_ssim_averages_padded_borders_too():
    """Why calc_ssim does not call torchmetrics: it reflect-pads and keeps the border windows."""
    from torchmetrics.functional.image import structural_similarity_index_measure

    sr, hr = _pair(48, 45, seed=7)
    y_sr, y_hr = rgb_to_y(quantize(sr)), rgb_to_y(hr)
    theirs = structural_similarity_index_measure(y_sr, y_hr, gaussian_kernel=True, sigma=1.5, data_range=255.0)
    assert abs(theirs.item() - calc_ssim(sr, hr, 1).item()) > 1e-5
