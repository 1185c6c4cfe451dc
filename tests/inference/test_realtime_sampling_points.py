"""The sampling-point picture (Deformable DETR's appendix figure) of the real-time DETRs, whose levels may have different
counts of points (RT-DETRv2's ``num_points`` list, D-FINE's and DEIM's (3, 6, 3)): the model returns the locations its
attention core reads and the weights of its softmax, the picture draws each point at its place with its level's marker
and its weight's colour, and Deformable DETR's picture stays as it was."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from rtdetr_helpers import one_thread  # noqa: F401 (a module fixture: one torch thread)

import visiontf
from visiontf.inference.predictor import Predictor
from visiontf.nn import ms_deform_attn
from visiontf.tasks.detection.deformable_attention import (
    LEVEL_MARKERS,
    _level_strides,
    deformable_sampling_points,
    save_sampling_points_figure,
)

RESNET = {"kwargs": {"widths": (8, 16, 32, 64), "stem_width": 4, "blocks": (1, 1, 1, 1)}}
HGNET = {"kwargs": {"stem": (4, 4), "stages": ((4, 4, 8, 1, False, False, 3, 1), (8, 4, 16, 1, True, False, 3, 1),
                                                (16, 8, 24, 1, True, True, 5, 1), (24, 8, 32, 1, True, True, 5, 1))}}
SMALL = {"encoder": {"hidden_dim": 32, "nhead": 2, "dim_feedforward": 32},
         "decoder": {"hidden_dim": 32, "nhead": 2, "dim_feedforward": 32, "num_queries": 12, "num_layers": 2}, "denoising": {"num_denoising": 4}}
#: (registered name, backbone, decoder options over SMALL's): RT-DETRv2 with uneven counts, D-FINE's and DEIM's (3, 6, 3)
FAMILIES = {
    "rtdetrv2": ("rtdetrv2_r18vd", RESNET, {"num_points": (2, 4, 6)}),
    "dfine": ("dfine_s", HGNET, {}),
    "deim_dfine": ("deim_dfine_s", HGNET, {}),
}


def _model(family: str, seed: int = 0, **decoder):
    name, backbone, points = FAMILIES[family]
    torch.manual_seed(seed)
    return visiontf.create_model(name, num_classes=3, backbone=backbone, **{**SMALL, "decoder": {**SMALL["decoder"], **points, **decoder}}).eval()


def _batch():
    """Two images, the second padded on the right (its sampling is over the padded canvas all the same)."""
    images = torch.randn(2, 3, 64, 96, generator=torch.Generator().manual_seed(0))
    mask = torch.zeros(2, 64, 96, dtype=torch.bool)
    mask[1, :, 70:] = True
    return images, mask


def _core_inputs(monkeypatch, method: str) -> list:
    """Record what every call of the attention core receives: gather's pixel coordinates (N, Lq, 2, M, J) or
    grid_sample's normalised locations (N, Lq, M, J, 2), with the weights."""
    seen = []
    name = "pixel_core" if method == "gather" else "ms_deform_attn_core"
    core = getattr(ms_deform_attn, name)

    def recording(value, shapes, where, weights, *args, **kwargs):
        seen.append((where.detach().clone(), weights.detach().clone(), list(shapes)))
        return core(value, shapes, where, weights, *args, **kwargs)

    monkeypatch.setattr(ms_deform_attn, name, recording)
    return seen


@pytest.mark.parametrize("family, method", [("rtdetrv2", "gather"), ("rtdetrv2", "grid_sample"), ("dfine", "gather"),
                                            ("deim_dfine", "grid_sample")])
def test_returned_locations_are_the_ones_the_core_reads(family, method, monkeypatch):
    model = _model(family)
    model.set_attn_method(method)
    attn = model.decoder.layers[-1].cross_attn
    counts = attn.points_per_level
    assert len(set(counts)) > 1, "the case has uneven counts"
    assert attn.projections == (family == "rtdetrv2")  # D-FINE's attention has no value/output projection
    seen = _core_inputs(monkeypatch, method)
    images, mask = _batch()
    with torch.no_grad():
        out = model(images, mask, need_weights=True)
    J, heads = sum(counts), attn.n_heads
    loc, weights = out["dec_sampling_locations"], out["dec_attention_weights"]
    assert loc.shape == (2, 12, heads, J, 2) and weights.shape == (2, 12, heads, J)
    assert out["dec_sampling_points"] == counts and out["dec_sampling_mode"] == "bilinear"
    assert len(seen) == SMALL["decoder"]["num_layers"]  # one core call per layer: the last one is the picture's
    where, core_weights, shapes = seen[-1]
    if method == "gather":  # pixel coordinates x * W_l - 0.5 of each sample's level
        levels = torch.repeat_interleave(torch.arange(len(counts)), torch.tensor(counts))
        size = torch.tensor([(w, h) for h, w in shapes], dtype=where.dtype)[levels]  # (J, 2)
        where = (where.permute(0, 1, 3, 4, 2) + 0.5) / size
    torch.testing.assert_close(loc, where, atol=1e-5, rtol=0)
    torch.testing.assert_close(weights, core_weights, atol=1e-6, rtol=0)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 12, heads))  # one softmax over all J points of a head
    assert out["spatial_shapes"] == shapes


def test_uniform_counts_keep_the_level_and_point_axes():
    model = _model("rtdetrv2", num_points=(4, 4, 4))
    with torch.no_grad():
        out = model(*_batch(), need_weights=True)
    assert out["dec_sampling_locations"].shape == (2, 12, 2, 3, 4, 2) and out["dec_sampling_points"] == (4, 4, 4)


def test_per_level_points_land_on_the_reference_with_zero_offsets():
    """Offsets zeroed: every point of every level lies on the reference box's centre (an image whose sides are
    multiples of 32 has no padding), so the per-level layout is mapped back to pixels level by level."""
    model = _model("dfine", seed=1)
    for layer in model.decoder.layers:
        torch.nn.init.zeros_(layer.cross_attn.sampling_offsets.weight)
        torch.nn.init.zeros_(layer.cross_attn.sampling_offsets.bias)
    image = (np.random.default_rng(0).random((64, 96, 3)) * 255).astype(np.uint8)
    data = deformable_sampling_points(model, image, preprocess={"min_size": 64, "max_size": 96}, max_queries=2, score_threshold=0.0)
    assert data["strides"] == [8, 16, 32] and data["points_per_level"] == (3, 6, 3)
    assert data["point_levels"].tolist() == [0] * 3 + [1] * 6 + [2] * 3
    n, heads, J, _ = data["points"].shape
    assert (n, heads, J) == (2, 2, 12) and data["weights"].shape == (2, 2, 12)
    np.testing.assert_allclose(data["points"], np.broadcast_to(data["reference"][:, None, None], data["points"].shape), atol=1e-3)
    np.testing.assert_allclose(data["weights"].sum(-1), 1.0, atol=1e-5)


def test_discrete_sampling_is_drawn_at_the_cells_read(tmp_path, monkeypatch):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    model = _model("rtdetrv2", seed=2, sampling="discrete")
    image = (np.random.default_rng(1).random((64, 96, 3)) * 255).astype(np.uint8)
    data = deformable_sampling_points(model, image, preprocess={"min_size": 64, "max_size": 96}, query_indices=[3])
    stride = np.asarray(data["strides"])[data["point_levels"]][None, None, :, None]  # (1, 1, J, 1)
    cell = data["points"] / stride - 0.5  # no resize, no padding: a cell's centre is (c + 0.5) * stride
    np.testing.assert_allclose(cell, np.round(cell), atol=1e-4)
    assert np.ptp(data["points"].reshape(-1, 2), 0).min() > 0  # the points are not all on one cell
    fig = _drawn_figure(monkeypatch, data, tmp_path / "one.png")  # one panel: the longer legend still fits
    legend = fig.legends[0].get_window_extent(FigureCanvasAgg(fig).get_renderer())
    assert 0 <= legend.x0 and legend.x1 <= fig.bbox.x1


def _drawn_figure(monkeypatch, data, path):
    """Save the picture and return the matplotlib figure that was saved."""
    from matplotlib.figure import Figure

    saved, save = [], Figure.savefig

    def keeping(fig, *args, **kwargs):
        saved.append(fig)
        return save(fig, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keeping)
    save_sampling_points_figure(data, path)
    return saved[0]


def _marker_vertices(marker: str) -> np.ndarray:
    from matplotlib.markers import MarkerStyle

    style = MarkerStyle(marker)
    return style.get_path().transformed(style.get_transform()).vertices


@pytest.mark.parametrize("family", ["rtdetrv2", "dfine"])
def test_every_point_has_its_levels_marker_and_its_weights_colour(family, tmp_path, monkeypatch):
    from matplotlib import colormaps
    from matplotlib.collections import PathCollection

    model = _model(family, seed=3)
    image = (np.random.default_rng(2).random((72, 100, 3)) * 255).astype(np.uint8)
    predictor = Predictor(model, device="cpu", preprocess={"min_size": 64, "max_size": 96})  # what predict --attention passes
    data = deformable_sampling_points(predictor, image, query_indices=[1, 4])
    fig = _drawn_figure(monkeypatch, data, tmp_path / "points.png")
    vmax = float(data["weights"].max())
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    for level, (stride, count) in enumerate(zip(data["strides"], data["points_per_level"])):
        assert legend[level] == f"level {level} (stride {stride}, {count} points)"
    for i in range(2):
        ax = fig.axes[i]
        dots = [c for c in ax.collections if isinstance(c, PathCollection)][:-1]  # the last one is the reference cross
        pts, w = data["points"][i].reshape(-1, 2), data["weights"][i].reshape(-1)
        level = np.tile(data["point_levels"], data["points"].shape[1])
        assert len(dots) == len(w) == 2 * sum(data["points_per_level"])
        drawn = np.zeros(len(w), dtype=bool)
        for dot in dots:  # find the point by its place and weight: one dot per point, each with its level's marker
            x, y = dot.get_offsets()[0]
            weight = float(dot.get_array()[0])
            k = int(np.argmin(np.where(drawn, np.inf, np.abs(pts - (x, y)).sum(1) + np.abs(w - weight))))
            assert abs(pts[k] - (x, y)).max() < 1e-6 and abs(w[k] - weight) < 1e-7
            np.testing.assert_allclose(dot.get_paths()[0].vertices, _marker_vertices(LEVEL_MARKERS[level[k]]))
            np.testing.assert_allclose(dot.get_facecolor()[0], colormaps["jet"](weight / vmax), atol=1e-6)
            drawn[k] = True  # each point drawn once
        assert drawn.all()


def test_deformable_detr_picture_is_unchanged_by_the_per_level_layout(tmp_path):
    """Deformable DETR keeps its (heads, L, P) arrays and legend; the same points given as one J axis with their
    levels draw the very same pixels, so the drawing of uneven counts is the drawing of even ones."""
    from PIL import Image

    torch.manual_seed(0)
    model = visiontf.create_model("deformable_detr_tiny", num_classes=3, arch={"hidden_dim": 64, "nheads": 2, "enc_layers": 1,
                                                                              "dec_layers": 2, "dim_feedforward": 64, "num_queries": 12}).eval()
    image = np.full((72, 120, 3), 40, dtype=np.uint8)
    data = deformable_sampling_points(model, image, query_indices=[0, 5], preprocess={"min_size": 64, "max_size": 128})
    assert data["points"].shape == (2, 2, 3, 4, 2) and data["points_per_level"] == (4, 4, 4) and data["strides"] == [8, 16, 32]
    flat = {**data, "points": data["points"].reshape(2, 2, 12, 2), "weights": data["weights"].reshape(2, 2, 12)}
    old = {k: v for k, v in data.items() if k not in ("points_per_level", "point_levels")}  # a dict from before
    pictures = [np.asarray(Image.open(save_sampling_points_figure(d, tmp_path / f"{k}.png")))
                for k, d in (("grid", data), ("flat", flat), ("old", old))]
    assert all(np.array_equal(pictures[0], p) for p in pictures[1:])


def test_level_strides_cover_padded_and_ceiled_maps():
    # Deformable DETR's ResNet maps (ceil of the size over the stride), 64 x 107
    assert _level_strides([(8, 14), (4, 7), (2, 4)], (64, 107)) == [8, 16, 32]
    # RT-DETR's maps of the canvas padded to a multiple of 32 (40 x 40 -> 64 x 64): up to 31 pixels beyond the image
    assert _level_strides([(8, 8), (4, 4), (2, 2)], (40, 40)) == [8, 16, 32]
