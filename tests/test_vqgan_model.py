"""VQGAN first stage: taming's layout and maths, its Lightning checkpoints, tokens, odd inputs.

The original repository cannot be imported; ``benchmarks/reference_vqgan.py`` re-creates its
module tree (so its ``state_dict()`` has the published checkpoints' keys) and per-op maths
(attention by ``bmm`` and softmax). Checkpoints are built from it at small configs of the same
layout; full-size models are only built on the meta device.
"""
from __future__ import annotations

import logging
import sys
import types
from pathlib import Path

import pytest
import torch
from torch import nn

from visiontf.models import create_model, get_entry, list_models
from visiontf.models._registry import WeightsLayoutError
from visiontf.models.vqgan.blocks import AttnBlock
from visiontf.models.vqgan.vqgan import DEFAULT_CFGS, convert_state_dict

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ is not an installed package
from benchmarks import reference_vqgan as ref  # noqa: E402

TOL = 1e-4

# small configs of the published layouts, 32 px: f16-like (2 ResNet blocks, attention at the middle level,
# 2 channel sizes) and f8-like (z of 4 channels, attention at the lowest resolution)
SMALL_F16 = dict(ch=32, ch_mult=(1, 1, 2), num_res_blocks=2, attn_resolutions=(16,), resolution=32, z_channels=32)
SMALL_F8 = dict(ch=32, ch_mult=(1, 2, 2), num_res_blocks=1, attn_resolutions=(8,), resolution=32, z_channels=4)


def _ddconfig(cfg: dict) -> dict:
    return dict(double_z=False, in_channels=3, out_ch=3, dropout=0.0, **cfg)


def _reference(cfg: dict, n_embed: int, embed_dim: int, seed: int = 0) -> ref.OriginalVQModel:
    """A reference model with non-trivial norms and a codebook on the latents' scale."""
    torch.manual_seed(seed)
    model = ref.OriginalVQModel(_ddconfig(cfg), n_embed, embed_dim).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 and "norm" in name:
                p.copy_((1.0 if name.endswith("weight") else 0.0) + 0.1 * torch.randn_like(p))
        z = model.quant_conv(model.encoder(torch.rand(4, 3, 32, 32) * 2 - 1))
        z = z.permute(0, 2, 3, 1).reshape(-1, embed_dim)
        model.quantize.embedding.weight.copy_(z[torch.randperm(len(z))[:n_embed]] + 0.01 * torch.randn(n_embed, embed_dim))
    return model


def _save_ckpt(model: nn.Module, path: Path, callback: str = "callbacks.model_checkpoint.ModelCheckpoint") -> Path:
    """A taming-style Lightning 1.0 checkpoint: the callbacks keyed by their class, as Lightning < 1.5 wrote them
    (pickled by reference to ``pytorch_lightning.callbacks.model_checkpoint.ModelCheckpoint``; a stand-in
    module holds it while saving, which spares the tests Lightning's import time)."""
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
                    "optimizer_states": [], "lr_schedulers": [], "state_dict": model.state_dict()}, path)
    finally:
        for n, mod in saved.items():
            if mod is None:
                sys.modules.pop(n, None)
            else:
                sys.modules[n] = mod
    assert cls.encode() in path.read_bytes()
    return path


def _images(B=2, H=32, W=32, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(B, 3, H, W, generator=g) * 2 - 1


# --------------------------------------------------------------------------- registry and layout
def test_registered_names_and_param_counts():
    assert {"vqgan_imagenet_f16_1024", "vqgan_imagenet_f16_16384", "vq_f8", "vq_f8_n256", "vqgan_tiny"} <= set(list_models("vq*"))
    assert get_entry("vqgan_tiny").tags[:2] == ("generation", "vqgan")
    counts = {}
    for name in ("vqgan_imagenet_f16_1024", "vqgan_imagenet_f16_16384"):
        with torch.device("meta"):
            counts[name] = sum(p.numel() for p in create_model(name).parameters())
    # REFERENCE.md: the autoencoders (no loss) of taming's ImageNet configs
    assert round(counts["vqgan_imagenet_f16_1024"] / 1e6, 2) == 72.14
    assert round(counts["vqgan_imagenet_f16_16384"] / 1e6, 2) == 76.07


@pytest.mark.parametrize("name", ["vqgan_imagenet_f16_16384", "vq_f8"])
def test_full_size_keys_and_shapes_are_tamings(name):
    s = DEFAULT_CFGS[name].kwargs
    cfg = {k: s[k] for k in ("ch", "ch_mult", "num_res_blocks", "attn_resolutions", "resolution", "z_channels")}
    with torch.device("meta"):
        theirs = ref.OriginalVQModel(_ddconfig(cfg), s["n_embed"], s["embed_dim"], with_loss=False).state_dict()
        ours = create_model(name).state_dict()
    assert {k: tuple(v.shape) for k, v in ours.items()} == {k: tuple(v.shape) for k, v in theirs.items()}
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


def test_attention_block_equals_bmm_softmax():
    torch.manual_seed(0)
    ours, theirs = AttnBlock(64), ref.AttnBlock(64)
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(2, 64, 16, 12) * 3
    with torch.no_grad():
        err = (ours(x) - theirs(x)).abs().max().item()
    assert err < 1e-5, err


# --------------------------------------------------------------------------- taming checkpoints
@pytest.mark.parametrize("cfg,n_embed,embed_dim", [(SMALL_F16, 64, 16), (SMALL_F8, 256, 4)], ids=["f16_layout", "f8_layout"])
def test_taming_checkpoint_parity(tmp_path, caplog, cfg, n_embed, embed_dim):
    theirs = _reference(cfg, n_embed, embed_dim)
    assert any(k.startswith("loss.") for k in theirs.state_dict())
    path = _save_ckpt(theirs, tmp_path / "last.ckpt")
    with caplog.at_level(logging.INFO):
        ours = create_model("vqgan_imagenet_f16_1024", pretrained=path, n_embed=n_embed, embed_dim=embed_dim, **cfg).eval()
    assert "loss.* tensors" in caplog.text and "not used for inference" in caplog.text
    x = _images()
    with torch.no_grad():
        q_ref, loss_ref, (_, _, idx_ref) = theirs.encode(x)
        rec_ref, _ = theirs(x)
        q, loss, (perplexity, _, idx) = ours.encode(x)
        tokens = ours.tokenize(x)
        rec = ours(x)
        rec_from_tokens = ours.detokenize(tokens)
    assert torch.equal(idx, idx_ref)
    assert torch.equal(tokens.flatten(), idx_ref) and tokens.shape == (2, 32 // ours.downsample_factor, 32 // ours.downsample_factor)
    assert len(idx_ref.unique()) > 4  # the test exercises several codes
    assert (q - q_ref).abs().max().item() < TOL
    assert abs(loss.item() - loss_ref.item()) < TOL * max(1.0, loss_ref.item())
    assert (rec - rec_ref).abs().max().item() < TOL
    assert (rec_from_tokens - rec_ref).abs().max().item() < TOL
    assert 1.0 <= perplexity.item() <= n_embed


def test_net2net_checkpoint_gives_its_first_stage(tmp_path):
    theirs = _reference(SMALL_F8, 256, 4)
    state = {f"first_stage_model.{k}": v for k, v in theirs.state_dict().items() if not k.startswith("loss.")}
    state["transformer.tok_emb.weight"] = torch.zeros(3, 3)
    torch.save({"state_dict": state}, tmp_path / "net2net.ckpt")
    ours = create_model("vq_f8_n256", pretrained=tmp_path / "net2net.ckpt", **SMALL_F8).eval()
    x = _images(1)
    with torch.no_grad():
        assert (ours(x) - theirs(x)[0]).abs().max().item() < TOL


def test_codebook_of_another_size_is_refused(tmp_path):
    theirs = _reference(SMALL_F8, 256, 4)
    path = _save_ckpt(theirs, tmp_path / "n256.ckpt")
    with pytest.raises(WeightsLayoutError, match="codebook of 256 codes x 4.*model has 512 x 4"):
        create_model("vq_f8", pretrained=path, n_embed=512, **SMALL_F8)


def test_refusal_names_the_registered_model_that_fits():
    s = DEFAULT_CFGS["vq_f8"].kwargs
    cfg = {k: s[k] for k in ("ch", "ch_mult", "num_res_blocks", "attn_resolutions", "resolution", "z_channels")}
    with torch.device("meta"):
        state = ref.OriginalVQModel(_ddconfig(cfg), 16384, 4).state_dict()
        model = create_model("vq_f8_n256")
        f16 = create_model("vqgan_imagenet_f16_1024")
    with pytest.raises(WeightsLayoutError, match=r"16384 codes x 4 \(the model has 256 x 4\).*They fit vq_f8\b"):
        convert_state_dict(state, model)
    with pytest.raises(WeightsLayoutError, match="They fit vq_f8"):
        convert_state_dict(state, f16)
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
