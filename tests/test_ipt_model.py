"""visiontf's IPT against the original's layout and maths (``benchmarks/reference_ipt.py``).

Official-layout state dicts (random values, saved to a .pt file as the released files are) load
through ``create_model(name, pretrained=path)`` and give the reference's output; the full-size
layouts are checked key by key and shape by shape on the meta device; the parameter counts are
those computed from the original code.
"""
from __future__ import annotations

import pytest
import torch
from ipt_helpers import SMALL, TINY, randomized_reference, save_reference

from benchmarks.reference_ipt import OriginalIPT
from visiontf.models import WeightsLayoutError, create_model, get_entry, list_models
from visiontf.models.ipt.convert import convert_state_dict, to_original_state_dict
from visiontf.models.ipt.ipt import IPT, PRETRAIN_TASKS

TOL = 1e-4

#: registered name -> (scales, queries) of its original layout
LAYOUTS = {
    "ipt_sr_x2": ((2,), 1), "ipt_sr_x3": ((3,), 1), "ipt_sr_x4": ((4,), 1),
    "ipt_denoise_sigma30": ((1,), 1), "ipt_denoise_sigma50": ((1,), 1), "ipt_derain": ((1,), 1),
    "ipt_pretrain": ((2, 3, 4, 1, 1, 1), 6),
}

#: trainable parameters, from the original code (REFERENCE.md: 115.46 / 115.65 / 115.61 / 115.31 / ~118.9 M);
#: the original's 24 frozen MeanShift values are buffers here
PARAMS = {"ipt_sr_x2": 115_460_419, "ipt_sr_x3": 115_645_059, "ipt_sr_x4": 115_608_131,
          "ipt_denoise_sigma30": 115_312_707, "ipt_denoise_sigma50": 115_312_707, "ipt_derain": 115_312_707,
          "ipt_pretrain": 118_892_370}


def _meta(name: str, **kwargs) -> IPT:
    with torch.device("meta"):
        return create_model(name, **kwargs)


def test_registered_names_tags_and_counts():
    assert set(list_models("ipt_*")) == set(LAYOUTS) | {"ipt_tiny"}
    for name, count in PARAMS.items():
        assert get_entry(name).tags[:2] == ("restoration", "ipt")
        model = _meta(name)
        assert sum(p.numel() for p in model.parameters()) == count, name
        scales, _ = LAYOUTS[name]
        assert model.scales == scales and model.pretrained_cfg.tile_size == 48
        assert model.pretrained_cfg.rgb_range == 255


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_full_size_layout_is_the_originals(name):
    """Every key and shape of the released layout, both ways (meta device: nothing is allocated)."""
    scales, queries = LAYOUTS[name]
    with torch.device("meta"):
        original = OriginalIPT(scales, num_queries=queries).state_dict()
    model = _meta(name)
    ours = to_original_state_dict(model.state_dict())
    assert {k: tuple(v.shape) for k, v in ours.items()} == {k: tuple(v.shape) for k, v in original.items()}
    converted = convert_state_dict(original, model)
    own = model.state_dict()
    assert {k: tuple(v.shape) for k, v in converted.items()} == {k: tuple(v.shape) for k, v in own.items()}
    # the names the brief and spandrel rely on
    assert {"head.0.0.weight", "body.encoder.layers.0.self_attn.in_proj_weight", "body.query_embed.weight",
            "body.decoder.layers.11.multihead_attn.out_proj.weight", "tail.0.1.weight"} <= set(original)


@pytest.mark.parametrize("name", ["ipt_sr_x2", "ipt_sr_x3", "ipt_sr_x4", "ipt_denoise_sigma30", "ipt_derain"])
def test_official_weights_give_the_official_output(name, tmp_path):
    scales, _ = LAYOUTS[name]
    ref = randomized_reference(scales, **SMALL)
    path = save_reference(ref, tmp_path / "weights.pt")
    model = create_model(name, pretrained=path, **SMALL).eval()
    x = torch.rand(2, 3, 48, 48)
    with torch.no_grad():
        expected = ref(x * 255) / 255
        got = model(x)
    assert got.shape == (2, 3, 48 * scales[0], 48 * scales[0])
    assert (got - expected).abs().max().item() < TOL
    with torch.no_grad():  # the same maths: float64 agrees to rounding
        x = x.double()
        assert (model.double()(x) - ref.double()(x * 255) / 255).abs().max().item() < 1e-10


def test_round_trip_to_the_original_names(tmp_path):
    ref = randomized_reference((2,), **SMALL)
    model = create_model("ipt_sr_x2", pretrained=save_reference(ref, tmp_path / "w.pt"), **SMALL)
    back = to_original_state_dict(model.state_dict())
    original = ref.state_dict()
    assert set(back) == set(original)
    assert all(torch.equal(back[k], original[k]) for k in original)


def test_pretrain_weights_per_task_and_extracted(tmp_path):
    """IPT_pretrain.pt's layout: the multi-task model by name or index, and one task taken out of it."""
    ref = randomized_reference((2, 3, 4, 1, 1, 1), num_queries=6, **SMALL)
    path = save_reference(ref, tmp_path / "pretrain.pt")
    multi = create_model("ipt_pretrain", pretrained=path, **SMALL).eval()
    x = torch.rand(1, 3, 48, 48)
    expected = {}
    for index, task in enumerate(PRETRAIN_TASKS):
        ref.set_scale(index)
        assert multi.task_index(task) == multi.task_index(index) == index
        with torch.no_grad():
            expected[task] = ref(x * 255) / 255
            assert (multi(x, task=task) - expected[task]).abs().max().item() < TOL
    for name, task in [("ipt_sr_x3", "sr_x3"), ("ipt_denoise_sigma30", "denoise_sigma30"), ("ipt_derain", "derain")]:
        single = create_model(name, pretrained=path, **SMALL).eval()
        with torch.no_grad():
            assert (single(x) - expected[task]).abs().max().item() < TOL, name
        assert single.body.query_embed.weight.shape[0] == 1
    with pytest.raises(ValueError, match="pass task="):
        multi(x)
    with pytest.raises(ValueError, match="unknown task 'sr_x8'"):
        multi(x, task="sr_x8")


def test_other_task_weights_are_refused_naming_the_model_they_fit():
    """Full-size layouts on the meta device: the message names the registered model."""
    with torch.device("meta"):
        sr3 = OriginalIPT((3,)).state_dict()
        denoise = OriginalIPT((1,)).state_dict()
        sr2 = OriginalIPT((2,)).state_dict()
    with pytest.raises(WeightsLayoutError, match=r"these weights fit ipt_sr_x3: create_model\('ipt_sr_x3'"):
        convert_state_dict(sr3, _meta("ipt_sr_x2"))
    with pytest.raises(WeightsLayoutError, match="fit ipt_denoise_sigma30 / ipt_denoise_sigma50 / ipt_derain"):
        convert_state_dict(denoise, _meta("ipt_sr_x4"))
    with pytest.raises(WeightsLayoutError, match="these weights fit ipt_sr_x2"):
        convert_state_dict(sr2, _meta("ipt_pretrain"))


def test_refusal_through_the_registry_loader(tmp_path):
    ref = randomized_reference((3,), **TINY)
    path = save_reference(ref, tmp_path / "tiny_x3.pt")
    with pytest.raises(WeightsLayoutError, match=r"ipt_tiny\(scale=3\).*create_model\('ipt_tiny', scale=3"):
        create_model("ipt_tiny", pretrained=path)
    model = create_model("ipt_tiny", scale=3, pretrained=path).eval()
    x = torch.rand(1, 3, 48, 48)
    with torch.no_grad():
        assert (model(x) - ref(x * 255) / 255).abs().max().item() < TOL
    with pytest.raises(ValueError, match="not an IPT state dict"):
        convert_state_dict({"weight": torch.zeros(1)}, model)


def test_bad_inputs_are_clear_errors():
    model = create_model("ipt_tiny", **SMALL, patch_dim=3).eval()
    with pytest.raises(ValueError, match="NaN or infinite"):
        model(torch.full((1, 3, 48, 48), float("nan")))
    with pytest.raises(ValueError, match=r"\(B, 3, H, W\)"):
        model(torch.rand(1, 1, 48, 48))
    with pytest.raises(ValueError, match="float images"):
        model(torch.zeros(1, 3, 48, 48, dtype=torch.uint8))
    with pytest.raises(ValueError, match="task index 1 out of range"):
        model(torch.rand(1, 3, 48, 48), task=1)
    with pytest.raises(ValueError, match="scales 1, 2, 3, 4, 8"):
        IPT(tasks=("sr_x5",), **SMALL)


def test_images_smaller_than_a_tile_are_padded():
    model = create_model("ipt_tiny", **SMALL, patch_dim=3).eval()
    x = torch.rand(1, 3, 30, 41)
    with torch.no_grad():
        y = model(x)
        padded = torch.nn.functional.pad(x * 255, (0, 7, 0, 18), mode="reflect")
        expected = model.forward_window(padded)[..., :60, :82] / 255
        tiny = model(torch.rand(2, 3, 5, 7))  # too small to reflect: replicated
    assert y.shape == (1, 3, 60, 82) and (y - expected).abs().max().item() < 1e-5
    assert tiny.shape == (2, 3, 10, 14)
    # one side long enough to tile, the other padded
    with torch.no_grad():
        assert model(torch.rand(1, 3, 20, 70)).shape == (1, 3, 40, 140)


def test_tiny_trains_and_is_cpu_sized():
    model = create_model("ipt_tiny")
    assert (model.body.dim, model.body.num_tokens, len(model.body.encoder.layers)) == (128, 144, 2)
    assert sum(p.numel() for p in model.parameters()) < 1.2e6
    x = torch.rand(2, 3, 48, 48)
    loss = (model(x) - torch.rand(2, 3, 96, 96)).abs().mean()
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())
    assert not any(b.requires_grad for b in model.buffers())


def test_save_model_and_load_model_round_trip(tmp_path):
    import visiontf
    from visiontf.models import load_model

    model = create_model("ipt_tiny", scale=3).eval()
    path = visiontf.save_model(model, tmp_path / "tiny.safetensors")
    again = load_model(path).eval()
    x = torch.rand(1, 3, 50, 50)
    with torch.no_grad():
        assert again.scales == (3,) and torch.equal(model(x), again(x))


@pytest.mark.slow
def test_full_size_x2_official_weights(tmp_path):
    """The full 115 M parameter x2 model: official-layout file -> the reference's output (48x48).

    At the original's random init the decoder's attention is sharp and amplifies float32 rounding:
    against a float64 run the reference is off by ~5e-5 and visiontf by ~2e-4 with PyTorch's CPU
    flash SDPA kernel (~5e-5 with the math kernel); in float64 the two agree to ~1e-12 (measured;
    the small models' test checks float64 agreement).
    """
    torch.manual_seed(0)
    ref = OriginalIPT((2,)).eval()
    path = save_reference(ref, tmp_path / "IPT_sr2.pt")
    model = create_model("ipt_sr_x2", pretrained=path).eval()
    x = torch.rand(1, 3, 48, 48)
    with torch.no_grad():
        assert (model(x) - ref(x * 255) / 255).abs().max().item() < 5e-4
