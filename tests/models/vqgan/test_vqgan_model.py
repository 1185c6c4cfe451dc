"""VQGAN first stage: taming's layout and maths, its Lightning checkpoints, tokens, odd inputs.

The outputs compared are those the original computed: ``tests/fixtures/vqgan/first_stage.safetensors``
(a toy ``VQModel`` of the published layout's parts, random weights, float32 and float64) and the key layouts
of the published models in ``tests/fixtures/vqgan/taming_layouts.txt``, both written by
``scripts/fixtures/make_vqgan.py`` from a checkout of CompVis/taming-transformers. The fixture's weights go
through a Lightning-style ``.ckpt`` and ``create_model(..., pretrained=path)``, as a user loads taming's files.
"""
from __future__ import annotations

import logging
import re
import sys
import types
from pathlib import Path

import pytest
import torch
from reference.fixtures import FIXTURES, load_fixture
from torch import nn

from visiontf.models import create_model, get_entry, list_models
from visiontf.models._registry import WeightsLayoutError
from visiontf.models.vqgan.blocks import AttnBlock
from visiontf.models.vqgan.vqgan import convert_state_dict

#: float32 / float64 tolerances against the original's outputs
TOL = {"float32": 1e-4, "float64": 1e-8}
#: the fixture's toy first stage in visiontf's arguments (its meta holds taming's ddconfig)
TOY = dict(n_embed=32, embed_dim=8, ch=32, ch_mult=(1, 1), num_res_blocks=1, attn_resolutions=(8,), resolution=16,
           z_channels=8)


def parse_layouts(path: Path) -> dict[str, dict]:
    """``{name: {"params", "entries", "keys": {key: shape}}}`` from a generator's listing (``blocks.N ... xK`` expanded)."""
    sections: dict[str, dict] = {}
    cur: dict | None = None
    for line in path.read_text().splitlines():
        head = re.match(r"^## (\S+) .*: (\d+) parameters, (\d+) state-dict entries$", line)
        if head:
            cur = sections[head.group(1)] = {"params": int(head.group(2)), "entries": int(head.group(3)), "keys": {}}
            continue
        row = re.match(r"^(\S+) \[([\d, ]*)\](?:\s+x(\d+))?$", line)
        if cur is not None and row:
            shape = tuple(int(v) for v in row.group(2).split(",") if v.strip())
            for i in range(int(row.group(3) or 1)):
                cur["keys"][row.group(1).replace(".N.", f".{i}.")] = shape
    return sections


LAYOUTS = parse_layouts(FIXTURES / "vqgan" / "taming_layouts.txt")


def listed_state(name: str) -> dict[str, torch.Tensor]:
    """The published model's state dict as meta tensors (shapes only)."""
    return {k: torch.empty(shape, device="meta") for k, shape in LAYOUTS[name]["keys"].items()}


def fixture_weights(case: str = "first_stage") -> dict[str, torch.Tensor]:
    """The fixture's weights as the original held them (stored as float16 where exact; float32 to load)."""
    return {k: v.float() if v.is_floating_point() else v for k, v in load_fixture("vqgan", case).weights.items()}


def _save_ckpt(state, path: Path, callback: str = "callbacks.model_checkpoint.ModelCheckpoint") -> Path:
    """A taming-style Lightning 1.0 checkpoint: the callbacks keyed by their class, as Lightning < 1.5 wrote them
    (pickled by reference to ``pytorch_lightning.callbacks.model_checkpoint.ModelCheckpoint``; a stand-in
    module holds it while saving, which spares the tests Lightning's import time)."""
    if isinstance(state, nn.Module):
        state = state.state_dict()
    module, cls = f"pytorch_lightning.{callback}".rsplit(".", 1)
    names = ("pytorch_lightning", "pytorch_lightning.callbacks", module)
    saved = {n: sys.modules.get(n) for n in names}
    stand_in = type(cls, (), {"__module__": module})
    try:
        for n in names:
            sys.modules[n] = types.ModuleType(n)
        setattr(sys.modules[module], cls, stand_in)
        torch.save({"epoch": 3, "global_step": 1000, "pytorch-lightning_version": "1.0.8",
                    "callbacks": {stand_in: {"best_model_score": torch.tensor(0.5), "best_model_path": "x.ckpt"}},
                    "optimizer_states": [], "lr_schedulers": [], "state_dict": state}, path)
    finally:
        for n, mod in saved.items():
            if mod is None:
                sys.modules.pop(n, None)
            else:
                sys.modules[n] = mod
    assert cls.encode() in path.read_bytes()
    return path


def _training_ckpt(path: Path) -> Path:
    """The fixture's first stage as a training checkpoint: with ``loss.*`` tensors (discriminator and LPIPS
    names of taming's loss; random values: they play no part in inference)."""
    state = fixture_weights()
    state["loss.discriminator.main.0.weight"] = torch.randn(64, 3, 4, 4)
    state["loss.discriminator.main.2.running_mean"] = torch.zeros(128)
    state["loss.perceptual_loss.lin0.model.1.weight"] = torch.randn(1, 64, 1, 1)
    return _save_ckpt(state, path)


def _images(B=2, H=32, W=32, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(B, 3, H, W, generator=g) * 2 - 1


# --------------------------------------------------------------------------- registry and layout
def test_registered_names_and_param_counts():
    assert {"vqgan_imagenet_f16_1024", "vqgan_imagenet_f16_16384", "vq_f8", "vq_f8_n256", "vqgan_tiny"} <= set(list_models("vq*"))
    assert get_entry("vqgan_tiny").tags[:2] == ("generation", "vqgan")
    for name in ("vqgan_imagenet_f16_1024", "vqgan_imagenet_f16_16384", "vq_f8", "vq_f8_n256"):
        with torch.device("meta"):
            count = sum(p.numel() for p in create_model(name).parameters())
        assert count == LAYOUTS[name]["params"], name  # taming's VQModel at that config (the loss not built)
    # REFERENCE.md: the autoencoders (no loss) of taming's ImageNet configs
    assert round(LAYOUTS["vqgan_imagenet_f16_1024"]["params"] / 1e6, 2) == 72.14
    assert round(LAYOUTS["vqgan_imagenet_f16_16384"]["params"] / 1e6, 2) == 76.07
    assert round(LAYOUTS["loss.discriminator"]["params"] / 1e6, 2) == 2.77


@pytest.mark.parametrize("name", ["vqgan_imagenet_f16_1024", "vqgan_imagenet_f16_16384", "vq_f8", "vq_f8_n256"])
def test_full_size_keys_and_shapes_are_tamings(name):
    with torch.device("meta"):
        ours = create_model(name).state_dict()
    listed = LAYOUTS[name]
    assert {k: tuple(v.shape) for k, v in ours.items()} == listed["keys"]
    assert len(listed["keys"]) == listed["entries"]
    for key in ("encoder.down.4.attn.1.q.weight", "encoder.down.3.downsample.conv.weight", "decoder.up.0.block.2.conv2.weight",
                "decoder.up.4.upsample.conv.weight", "encoder.down.1.block.0.norm1.weight", "encoder.mid.attn_1.proj_out.bias") \
            if name.startswith("vqgan") else ("encoder.down.3.attn.0.k.weight", "decoder.up.2.block.0.nin_shortcut.weight", "decoder.up.3.attn.2.v.bias"):
        assert key in ours


def test_pretrained_cfg():
    m = create_model("vqgan_tiny")
    assert m.num_codes == 512 and m.downsample_factor == 8
    assert m.pretrained_cfg.mean == (0.5, 0.5, 0.5) and m.pretrained_cfg.std == (0.5, 0.5, 0.5)
    with torch.device("meta"):
        assert create_model("vq_f8").pretrained_cfg.url.endswith("vq-f8.zip")


def test_attention_block_equals_the_explicit_softmax():
    """SDPA gives single-head attention over the HW positions as an explicit softmax(q k^T / sqrt(C)) v does."""
    torch.manual_seed(0)
    block = AttnBlock(64)
    x = torch.randn(2, 64, 16, 12) * 3
    with torch.no_grad():
        h = block.norm(x)
        q, k, v = (conv(h).flatten(2) for conv in (block.q, block.k, block.v))  # (B, C, HW)
        weights = torch.softmax(torch.einsum("bci,bcj->bij", q, k) / 64**0.5, dim=-1)
        expected = x + block.proj_out(torch.einsum("bij,bcj->bci", weights, v).view_as(x))
        err = (block(x) - expected).abs().max().item()
    assert err < 1e-5, err


# --------------------------------------------------------------------------- taming checkpoints
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_taming_checkpoint_gives_tamings_outputs(tmp_path, caplog, dtype):
    fx = load_fixture("vqgan", "first_stage")
    assert fx.meta["repository"] == "CompVis/taming-transformers" and fx.meta["settings"]["n_embed"] == TOY["n_embed"]
    path = _training_ckpt(tmp_path / "last.ckpt")
    with caplog.at_level(logging.INFO):
        ours = create_model("vqgan_imagenet_f16_1024", pretrained=path, **TOY).eval()
    assert "loss.* tensors" in caplog.text and "not used for inference" in caplog.text
    assert sum(p.numel() for p in ours.parameters()) == fx.meta["params"]
    ours = ours.to(getattr(torch, dtype))
    want, tol = fx.outputs[dtype], TOL[dtype]
    x = fx.inputs["x"].to(ours.encoder.conv_in.weight.dtype)
    with torch.no_grad():
        q, loss, (perplexity, _, idx) = ours.encode(x)
        tokens = ours.tokenize(x)
        rec, qloss = ours(x, return_loss=True)
        rec_from_tokens = ours.detokenize(tokens)
    assert torch.equal(idx, want["indices"])
    assert torch.equal(tokens.flatten(), want["indices"]) and tokens.shape == (2, 8, 8)
    assert fx.meta["codes_used"] > 4 and len(idx.unique()) == fx.meta["codes_used"]  # several codes exercised
    assert (q - want["z_q"]).abs().max().item() < tol
    assert abs(loss.item() - want["codebook_loss"].item()) < tol * max(1.0, want["codebook_loss"].item())
    assert abs(qloss.item() - want["forward_loss"].item()) < tol * max(1.0, want["forward_loss"].item())
    assert (ours.decode(want["z_q"]) - want["decoded"]).abs().max().item() < tol
    assert (rec - want["decoded"]).abs().max().item() < tol
    assert (rec_from_tokens - want["decoded_from_indices"]).abs().max().item() < tol
    assert 1.0 <= perplexity.item() <= TOY["n_embed"]


def test_width_changing_blocks_equal_the_own_words_reference():
    """What the fixture cannot hold at its size: the blocks that change width (``nin_shortcut``) and a third
    level, against the project's own-words reference of taming's first stage (``tests/reference/vqgan.py``)
    on the same random weights, through visiontf's converter."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
    from reference.vqgan import OriginalVQModel

    ddconfig = dict(ch=32, ch_mult=(1, 2, 2), num_res_blocks=1, attn_resolutions=(4,), resolution=16, z_channels=8,
                    in_channels=3, out_ch=3, dropout=0.0, double_z=False)
    torch.manual_seed(0)
    ref = OriginalVQModel(ddconfig, n_embed=16, embed_dim=8).eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.normal_(0, 0.1)
    assert any(k.endswith("nin_shortcut.weight") for k in ref.state_dict())
    ours = create_model("vqgan_imagenet_f16_1024", n_embed=16, embed_dim=8, ch=32, ch_mult=(1, 2, 2), num_res_blocks=1,
                        attn_resolutions=(4,), resolution=16, z_channels=8).eval()
    ours.load_state_dict(convert_state_dict(ref.state_dict(), ours))
    x = torch.rand(2, 3, 16, 16) * 2 - 1
    with torch.no_grad():
        # each half on its own: the codebook's snapping would hide a difference in the encoder from the output
        z_ref, z = ref.encoder(x), ours.encoder(x)
        q_ref = ref.encode(x)[0]
        rec_ref, rec = ref.decode(q_ref), ours.decode(q_ref)
    assert (z - z_ref).abs().max().item() < 1e-5 * z_ref.abs().max().item()
    assert (rec - rec_ref).abs().max().item() < 1e-5 * rec_ref.abs().max().item()


def test_net2net_checkpoint_gives_its_first_stage(tmp_path):
    state = {f"first_stage_model.{k}": v for k, v in fixture_weights().items()}
    state["transformer.tok_emb.weight"] = torch.zeros(3, 3)
    torch.save({"state_dict": state}, tmp_path / "net2net.ckpt")
    ours = create_model("vq_f8_n256", pretrained=tmp_path / "net2net.ckpt", **TOY).eval()
    fx = load_fixture("vqgan", "first_stage")
    with torch.no_grad():
        assert (ours(fx.inputs["x"].float()) - fx.outputs["float32"]["decoded"]).abs().max().item() < TOL["float32"]


def test_codebook_of_another_size_is_refused(tmp_path):
    path = _save_ckpt(fixture_weights(), tmp_path / "n32.ckpt")
    with pytest.raises(WeightsLayoutError, match="codebook of 32 codes x 8.*model has 64 x 8"):
        create_model("vq_f8", pretrained=path, **{**TOY, "n_embed": 64})


def test_refusal_names_the_registered_model_that_fits():
    state = listed_state("vq_f8")
    with torch.device("meta"):
        model = create_model("vq_f8_n256")
        f16 = create_model("vqgan_imagenet_f16_1024")
    with pytest.raises(WeightsLayoutError, match=r"16384 codes x 4 \(the model has 256 x 4\).*They fit vq_f8\b"):
        convert_state_dict(state, model)
    with pytest.raises(WeightsLayoutError, match="They fit vq_f8"):
        convert_state_dict(state, f16)
    with pytest.raises(WeightsLayoutError, match="They fit vq_f8_n256"):
        convert_state_dict(listed_state("vq_f8_n256"), create_model("vq_f8", **TOY))
    state["quant_conv.weight"] = torch.empty(5, 4, 1, 1, device="meta")
    with pytest.raises(WeightsLayoutError, match="No registered VQGAN has this layout"):
        convert_state_dict(state, model)


# --------------------------------------------------------------------------- inputs
def test_nan_and_wrong_shape_inputs_are_clear_errors():
    m = create_model("vqgan_tiny").eval()
    x = _images(1)
    x[0, 1, 3, 3] = float("nan")
    for call in (m, m.tokenize, m.encode):
        with pytest.raises(ValueError, match="NaN or infinite"):
            call(x)
    with pytest.raises(ValueError, match=r"\(B, 3, H, W\)"):
        m(torch.zeros(3, 64, 64))
    with pytest.raises(ValueError, match=r"\[0, 512\)"):
        m.detokenize(torch.full((1, 2, 2), 512))


def test_sizes_not_divisible_by_the_factor():
    m = create_model("vqgan_tiny").eval()
    x = _images(2, 61, 45)
    with torch.no_grad():
        rec = m(x)
        padded = torch.nn.functional.pad(x, (0, 3, 0, 3), mode="replicate")
        assert rec.shape == x.shape
        assert (rec - m(padded)[..., :61, :45]).abs().max().item() < 1e-6
    with pytest.raises(ValueError, match="divisible by the downsampling factor 8, got 61x45"):
        m.tokenize(x)


def test_training_gradients_pass_the_quantiser():
    m = create_model("vqgan_tiny", **dict(resolution=32))
    x = _images(2, 32, 32)
    rec, qloss = m(x, return_loss=True)
    ((rec - x).abs().mean() + qloss).backward()
    assert m.encoder.conv_in.weight.grad.abs().sum() > 0  # straight-through to the encoder
    assert m.quantize.embedding.weight.grad.abs().sum() > 0  # codebook term
    assert m.last_layer() is m.decoder.conv_out.weight


def test_lightning_1_0_callback_keys_load_as_inert_stand_ins(tmp_path):
    from visiontf.io.weights import WeightsError, safe_torch_load

    ckpt = safe_torch_load(_save_ckpt(nn.Conv2d(1, 1, 1), tmp_path / "old.ckpt"))
    (key,) = ckpt["callbacks"]
    assert key.__name__ == "ModelCheckpoint" and not hasattr(key, "on_save_checkpoint")
    assert ckpt["callbacks"][key]["best_model_path"] == "x.ckpt"
    # any other class is still refused
    with pytest.raises(WeightsError, match="refused to load with weights_only=True"):
        safe_torch_load(_save_ckpt(nn.Conv2d(1, 1, 1), tmp_path / "other.ckpt", "callbacks.lr_monitor.LearningRateMonitor"))


def test_save_model_and_load_model_round_trip(tmp_path):
    import visiontf

    m = create_model("vqgan_tiny", n_embed=256).eval()
    path = visiontf.save_model(m, tmp_path / "tok.safetensors")
    back = visiontf.load_model(path).eval()
    x = _images(1, 32, 32)
    with torch.no_grad():
        assert back.num_codes == 256 and torch.equal(back.tokenize(x), m.tokenize(x))


def test_norm_groups_sets_every_groupnorm_and_keeps_the_image_mean():
    default = create_model("vqgan_tiny", ch_mult=(1, 2, 2), attn_resolutions=())
    one = create_model("vqgan_tiny", ch_mult=(1, 2, 2), attn_resolutions=(), norm_groups=1)
    groups = lambda m: {g.num_groups for g in m.modules() if isinstance(g, nn.GroupNorm)}  # noqa: E731
    assert groups(default) == {32} and groups(one) == {1}
    assert default.state_dict().keys() == one.state_dict().keys()  # same weights layout: checkpoints interchange
    # why: with one channel per group (32 groups of 32 channels) a norm removes each feature's mean over the
    # image (the photo's colour and brightness); with one group only the mean over all features goes
    torch.manual_seed(0)
    photo = torch.rand(1, 3, 16, 16) * torch.tensor([1.0, 0.3, -0.5])[:, None, None]
    for model, removed in ((default, True), (one, False)):
        block = model.encoder.down[0].block[0]
        with torch.no_grad():
            means = block.norm1(model.encoder.conv_in(photo)).mean((2, 3)) - block.norm1.bias
        assert (means.abs().max() < 1e-5) == removed
    with pytest.raises(ValueError, match="norm_groups"):
        create_model("vqgan_tiny", ch=24, ch_mult=(1, 2, 2), norm_groups=16)
