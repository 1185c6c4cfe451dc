"""``forward_chop`` / ``forward_x8`` against the original's.

The original's own tiling (``Model.forward_chop`` and ``forward_x8`` of huawei-noah/Pretrained-IPT, run by
``scripts/fixtures/make_ipt.py``) is recorded in ``tests/fixtures/ipt`` around toy IPTs at scales 1, 2 and 3
(windows of 8, images no multiple of the tile stride); those outputs are compared with ``model(x)``.
The sweep over sizes and scales at the published window of 48 uses a cheap stand-in for the network whose
windows disagree where they overlap (a position pattern inside each window), so any blending difference
shows, against ``tests/reference/ipt.py``'s ``forward_chop`` (the project's own re-creation).
"""
from __future__ import annotations

import pytest
import torch
from ipt_helpers import TOL, TOY, fixture_file
from reference.fixtures import load_fixture
from reference.ipt import forward_chop as reference_chop
from torch import Tensor, nn

from visiontf.models import create_model
from visiontf.models.ipt.convert import convert_state_dict, to_original_state_dict
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


def test_x8_flips_and_transposes_are_undone():
    net = WindowNet(2)
    x = torch.rand(1, 3, 50, 61) * 255
    with torch.no_grad():
        got = forward_x8(lambda v: forward_chop(net, v, 48, 2), x)
        views = [x, x.flip(-1), x.flip(-2), x.flip(-1).flip(-2)]
        views += [v.transpose(-1, -2) for v in views]
        outs = [forward_chop(net, v, 48, 2) for v in views]
        undone = [o if i < 4 else o.transpose(-1, -2) for i, o in enumerate(outs)]
        undone = [o.flip(-2) if i % 4 > 1 else o for i, o in enumerate(undone)]
        undone = [o.flip(-1) if i % 2 else o for i, o in enumerate(undone)]
    assert got.shape == (1, 3, 100, 122)
    assert (got - torch.stack(undone).mean(0)).abs().max().item() < 1e-3


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(("name", "case"), [("ipt_sr_x2", "sr_x2"), ("ipt_sr_x3", "sr_x3"), ("ipt_denoise_sigma30", "denoise")])
def test_ipt_tiles_any_size_as_the_original(tmp_path, name, case, dtype):
    """``model(x)`` on an odd size = the original ``Model.forward_chop`` (recorded in 0-255)."""
    fx = load_fixture("ipt", case)
    model = create_model(name, pretrained=fixture_file(case, tmp_path / "w.pt"), **TOY).eval().to(getattr(torch, dtype))
    x = fx.inputs["chop"].to(getattr(torch, dtype))
    with torch.no_grad():
        got = model(x)
    expected = fx.outputs[dtype]["chop"] / 255
    assert got.shape == expected.shape and min(x.shape[-2:]) > TOY["tile_size"]
    assert (got - expected).abs().max().item() < TOL[dtype]


def test_ipt_self_ensemble_is_the_originals(tmp_path):
    """``self_ensemble=True`` = the original ``forward_x8`` around ``forward_chop`` (float32: the original's
    ensemble rebuilds its tensors with ``torch.Tensor`` and cannot run in float64)."""
    fx = load_fixture("ipt", "denoise")
    model = create_model("ipt_denoise_sigma30", pretrained=fixture_file("denoise", tmp_path / "w.pt"), **TOY,
                         self_ensemble=True).eval()
    with torch.no_grad():
        got = model(fx.inputs["x8"].float())
    assert "x8" not in fx.outputs["float64"]
    assert (got - fx.outputs["float32"]["x8"] / 255).abs().max().item() < TOL["float32"]


def test_tiling_is_differentiable():
    model = create_model("ipt_tiny").train()
    x = torch.rand(1, 3, 50, 53, requires_grad=True)
    model(x).mean().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()


@pytest.mark.parametrize("scale,h,w", [(2, 50, 61), (3, 73, 101), (1, 50, 61)])
def test_spandrel_gives_the_same_output(scale, h, w):
    """spandrel (PyPI, a dev dependency) keeps its own copy of the original code and loads the same files."""
    import spandrel  # not importorskip: a missing dev dependency must fail here, not skip the check
    name = {1: "ipt_derain", 2: "ipt_sr_x2", 3: "ipt_sr_x3"}[scale]
    torch.manual_seed(scale)
    donor = create_model(name, n_feats=8, num_heads=12, num_layers=1)  # spandrel assumes 12 heads
    with torch.no_grad():  # non-trivial LayerNorms and biases, as a trained file has
        for key, p in donor.named_parameters():
            if ".norm" in key:
                p.copy_((1.0 if key.endswith("weight") else 0.0) + 0.1 * torch.randn_like(p))
            elif key.endswith("bias"):
                p.normal_(0, 0.05)
    state = to_original_state_dict(donor.state_dict())  # a file in the released layout
    descriptor = spandrel.ModelLoader().load_from_state_dict(state)
    model = create_model(name, n_feats=8, num_heads=12, num_layers=1)
    model.load_state_dict(convert_state_dict(state, model))
    x = torch.rand(1, 3, h, w)
    with torch.no_grad():  # spandrel's descriptor clamps to [0, 1]; its call_fn does not
        expected = descriptor._call_fn(descriptor.model.eval(), x)
        assert (model.eval()(x) - expected).abs().max().item() < 1e-5
