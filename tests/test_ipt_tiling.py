"""``forward_chop`` / ``forward_x8`` against the original's (``benchmarks/reference_ipt.py``).

Most cases use a cheap stand-in for the network whose windows disagree where they overlap (a
position pattern inside each window), so any blending difference shows; one case runs a small IPT
end to end through ``model(x)``.
"""
from __future__ import annotations

import pytest
import torch
from ipt_helpers import SMALL, randomized_reference, save_reference
from torch import Tensor, nn

from benchmarks.reference_ipt import forward_chop as reference_chop
from benchmarks.reference_ipt import forward_x8 as reference_x8
from visiontf.models import create_model
from visiontf.models.ipt.convert import convert_state_dict
from visiontf.models.ipt.tiling import chop_geometry, forward_chop, forward_x8


class WindowNet(nn.Module):
    """(N, 3, t, t) -> (N, 3, t*s, t*s): a conv, pixel shuffle and a fixed pattern over the window."""

    def __init__(self, scale: int, tile: int = 48) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.patch_size, self.scale, self.scale_idx = tile, [scale], 0
        self.conv = nn.Conv2d(3, 3 * scale * scale, 3, padding=1)
        self.shuffle = nn.PixelShuffle(scale)
        self.register_buffer("pattern", 1 + torch.rand(tile * scale, tile * scale))
        self.calls = 0

    def forward(self, x: Tensor) -> Tensor:
        self.calls += x.shape[0]
        return self.shuffle(self.conv(x)) * self.pattern


def _ours(net: WindowNet, x: Tensor, crop_batch_size: int = 64) -> Tensor:
    with torch.no_grad():
        return forward_chop(net, x, net.patch_size, net.scale[0], crop_batch_size)


SIZES = [(48, 48), (50, 61), (97, 130), (48, 100), (60, 48), (59, 59), (131, 49)]


@pytest.mark.parametrize("h,w", SIZES)
def test_chop_equals_the_original_x2(h, w):
    net = WindowNet(2)
    x = torch.rand(1, 3, h, w) * 255
    expected = reference_chop(net, x)
    got = _ours(net, x)
    assert got.shape == expected.shape == (1, 3, 2 * h, 2 * w)
    assert (got - expected).abs().max().item() < 1e-3  # 0-255 values times a pattern up to 2


@pytest.mark.parametrize("scale", [1, 3, 4])
@pytest.mark.parametrize("h,w", [(53, 49), (73, 101)])
def test_chop_equals_the_original_other_scales(scale, h, w):
    """Scale 3 with odd ``tile - cut`` exercises the original's int(d) / int(d + 0.5) split."""
    net = WindowNet(scale)
    x = torch.rand(1, 3, h, w) * 255
    expected = reference_chop(net, x)
    assert (_ours(net, x) - expected).abs().max().item() < 1e-3


def test_small_tile_and_batches_and_crop_batch_sizes():
    net = WindowNet(2, tile=24)
    x = torch.rand(3, 3, 41, 57) * 255
    per_image = torch.cat([reference_chop(net, x[i:i + 1], crop_batch_size=5) for i in range(3)])
    for bs in (1, 7, 64):
        assert (_ours(net, x, bs) - per_image).abs().max().item() < 1e-3


def test_each_window_runs_once():
    """The original runs the top row and left column of windows twice; here each distinct window once."""
    net = WindowNet(1)
    _ours(net, torch.rand(1, 3, 97, 130))
    assert net.calls == 5 * 7 + 7 + 5 + 1  # grid, bottom strip, right strip, corner
    net.calls = 0
    reference_chop(net, torch.rand(1, 3, 97, 130))
    assert net.calls == 5 * 7 + 2 * 7 + 2 * 5 + 1
    net.calls = 0
    _ours(net, torch.rand(2, 3, 96, 96))  # edges on the grid: the strips are its last row and column
    assert net.calls == 2 * 5 * 5


def test_geometry_and_its_errors():
    assert chop_geometry(97, 130, 48) == {"stride": 12, "shave": 24, "h_cut": 1, "w_cut": 10, "rows": 5, "cols": 7}
    with pytest.raises(ValueError, match="multiple of 4"):
        chop_geometry(100, 100, 30)
    with pytest.raises(ValueError, match="at least 48x48"):
        chop_geometry(40, 100, 48)


def test_x8_equals_the_original():
    net = WindowNet(2)
    x = torch.rand(1, 3, 50, 61) * 255
    expected = reference_x8(lambda v: reference_chop(net, v), x)
    with torch.no_grad():
        got = forward_x8(lambda v: forward_chop(net, v, 48, 2), x)
    assert got.shape == expected.shape == (1, 3, 100, 122)
    assert (got - expected).abs().max().item() < 1e-3


def test_ipt_tiles_any_size_as_the_original(tmp_path):
    """``model(x)`` on odd sizes (and with the x8 ensemble) = the original forward_chop in 0-255."""
    ref = randomized_reference((2,), **SMALL)
    model = create_model("ipt_sr_x2", pretrained=save_reference(ref, tmp_path / "w.pt"), **SMALL).eval()
    x = torch.rand(1, 3, 50, 61)
    with torch.no_grad():
        assert (model(x) - reference_chop(ref, x * 255) / 255).abs().max().item() < 1e-4
        model.self_ensemble = True  # one window: the original's chop of it is the network itself
        x = x[..., :48, :48]
        expected = reference_x8(ref, x * 255) / 255
        assert (model(x) - expected).abs().max().item() < 1e-4


def test_tiling_is_differentiable():
    model = create_model("ipt_tiny").train()
    x = torch.rand(1, 3, 50, 53, requires_grad=True)
    model(x).mean().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()


@pytest.mark.parametrize("scale,h,w", [(2, 50, 61), (3, 73, 101), (1, 50, 61)])
def test_spandrel_gives_the_same_output(scale, h, w):
    """spandrel (PyPI, a dev dependency) keeps its own copy of the original code and loads the same files."""
    import spandrel  # not importorskip: a missing dev dependency must fail here, not skip the check
    ref = randomized_reference((scale,), n_feats=8, num_heads=12, num_layers=1)  # spandrel assumes 12 heads
    descriptor = spandrel.ModelLoader().load_from_state_dict(ref.state_dict())
    name = {1: "ipt_derain", 2: "ipt_sr_x2", 3: "ipt_sr_x3"}[scale]
    model = create_model(name, n_feats=8, num_heads=12, num_layers=1)
    model.load_state_dict(convert_state_dict(ref.state_dict(), model))
    x = torch.rand(1, 3, h, w)
    with torch.no_grad():  # spandrel's descriptor clamps to [0, 1]; its call_fn does not
        expected = descriptor._call_fn(descriptor.model.eval(), x)
        assert (model.eval()(x) - expected).abs().max().item() < 1e-5
