"""VQGAN's second stage: taming's minGPT layout and logits, KV-cached sampling, Net2NetTransformer checkpoints.

The outputs compared are those taming's own code computed (``scripts/fixtures/make_vqgan.py``):
``tests/fixtures/vqgan/gpt.safetensors`` and ``gpt_unmasked.safetensors`` (minGPT logits, with prepended
embeddings, the loss, ``forward_with_past``), ``net2net.safetensors`` (``Net2NetTransformer`` over the
``first_stage`` fixture: logits with the SOS token and with a class label, and ``sample`` with temperature and
top-k under a fixed seed, greedy too). The top-k/top-p filter is compared with HF transformers' logits warpers.
"""
from __future__ import annotations

import re

import pytest
import torch
from reference.fixtures import FIXTURES, load_fixture

from visiontf.models import create_model
from visiontf.models._registry import WeightsLayoutError
from visiontf.models.vqgan.gpt import GPT, convert_state_dict, filter_logits

TOL = {"float32": 1e-5, "float64": 1e-10}
#: the first stage of the fixtures (taming's ddconfig in first_stage.safetensors' meta)
TOY_FIRST = dict(n_embed=32, embed_dim=8, ch=32, ch_mult=(1, 1), num_res_blocks=1, attn_resolutions=(8,), resolution=16,
                 z_channels=8)


def _weights(case: str) -> dict[str, torch.Tensor]:
    return {k: v.float() if v.is_floating_point() else v for k, v in load_fixture("vqgan", case).weights.items()}


class _Holder(torch.nn.Module):
    def __init__(self, gpt):
        super().__init__()
        self.transformer = gpt


def _gpt(case: str, dtype: str = "float32") -> GPT:
    """visiontf's GPT with the fixture's minGPT weights, through the Net2Net converter (masks checked, dropped)."""
    settings = load_fixture("vqgan", case).meta["settings"]
    ours = GPT(**settings).eval()
    state = {f"transformer.{k}": v for k, v in _weights(case).items()}
    ours.load_state_dict({k[len("transformer."):]: v for k, v in convert_state_dict(state, _Holder(ours)).items()})
    return ours.to(getattr(torch, dtype))


def _net2net(path, n_classes=None, dtype="float32"):
    gpt = load_fixture("vqgan", "gpt").meta["settings"]
    model = create_model("vqgan_transformer_tiny", pretrained=path, first_stage_kwargs=TOY_FIRST, n_classes=n_classes,
                         **{k: gpt[k] for k in ("block_size", "n_layer", "n_head", "n_embd")}).eval()
    return model.to(getattr(torch, dtype))


def _net2net_ckpt(tmp_path):
    """A taming Net2NetTransformer checkpoint: the fixtures' first stage and minGPT under their prefixes."""
    state = {f"first_stage_model.{k}": v for k, v in _weights("first_stage").items()}
    state.update({f"transformer.{k}": v for k, v in _weights("gpt").items()})
    path = tmp_path / "last.ckpt"
    torch.save({"state_dict": state}, path)
    return path


def test_layout_and_init_are_tamings():
    settings = load_fixture("vqgan", "gpt").meta["settings"]
    ours = GPT(**settings)
    own = {k: tuple(v.shape) for k, v in ours.state_dict().items()}
    assert own == {k: tuple(v.shape) for k, v in _weights("gpt").items() if not k.endswith("attn.mask")}
    for key in ("tok_emb.weight", "pos_emb", "blocks.1.attn.query.bias", "blocks.0.mlp.0.weight", "blocks.0.mlp.2.bias", "ln_f.weight"):
        assert key in own
    assert "head.bias" not in own and own["pos_emb"] == (1, 17, 16)
    # the registered tiny GPT has taming's keys and parameter count at that config
    listing = (FIXTURES / "vqgan" / "taming_layouts.txt").read_text()
    head = re.search(r"## gpt vqgan_transformer_tiny .*: (\d+) parameters, (\d+) state-dict entries", listing)
    with torch.device("meta"):
        tiny = create_model("vqgan_transformer_tiny").transformer
    assert sum(p.numel() for p in tiny.parameters()) == int(head.group(1))
    assert len(tiny.state_dict()) + tiny.n_layer == int(head.group(2))  # + taming's causal mask per block
    big = GPT(vocab_size=1024, block_size=16, n_layer=2, n_head=4, n_embd=256)
    assert abs(big.tok_emb.weight.std().item() - 0.02) < 1e-3 and big.blocks[0].attn.key.bias.abs().sum() == 0
    assert big.pos_emb.abs().sum() == 0  # a bare Parameter: taming's init leaves it at zeros
    # taming's AdamW groups: only Linear weights decay
    nwd = big.no_weight_decay()
    assert {"pos_emb", "tok_emb.weight", "ln_f.weight", "blocks.0.ln1.bias", "blocks.0.attn.key.bias"} <= nwd
    assert not {"head.weight", "blocks.0.attn.proj.weight", "blocks.0.mlp.0.weight"} & nwd


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", ["gpt", "gpt_unmasked"])
def test_logits_equal_tamings(case, dtype):
    """Plain, with prepended embeddings, the loss, and step by step on the KV cache (taming's forward_with_past)."""
    fx = load_fixture("vqgan", case)
    ours, want, tol, dt = _gpt(case, dtype), fx.outputs[dtype], TOL[dtype], getattr(torch, dtype)
    idx, targets, prompt = fx.inputs["idx"], fx.inputs["targets"], fx.meta["prompt"]
    with torch.no_grad():
        logits, loss = ours(idx, targets=targets)
        with_prefix, _ = ours(idx[:, : idx.shape[1] - 4], embeddings=fx.inputs["prefix"].to(dt))
        cache = ours.new_cache(idx.shape[0], idx.shape[1])
        ours(idx[:, :prompt], cache=cache)
        steps = torch.cat([ours(idx[:, t : t + 1], cache=cache)[0] for t in range(prompt, idx.shape[1])], dim=1)
    assert (logits - want["logits"]).abs().max().item() < tol
    assert abs(loss.item() - want["loss"].item()) < tol
    assert (with_prefix - want["logits_with_embeddings"]).abs().max().item() < tol
    assert (steps - want["logits_with_past"]).abs().max().item() < tol


def test_cached_steps_give_the_full_forwards_logits():
    ours = _gpt("gpt")
    idx = torch.randint(0, 32, (2, 17))
    with torch.no_grad():
        full, _ = ours(idx)
        cache = ours.new_cache(2, 17)
        parts = [ours(idx[:, :5], cache=cache)[0]] + [ours(idx[:, t : t + 1], cache=cache)[0] for t in range(5, 17)]
        assert cache.length == 17
    assert (torch.cat(parts, dim=1) - full).abs().max().item() < 1e-5


def test_filter_matches_transformers_logits_warpers():
    """taming's sampler called transformers' top_k_top_p_filtering: top-k, then top-p, as these two warpers."""
    from transformers import TopKLogitsWarper, TopPLogitsWarper

    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(0)) * 3
    for k, p in ((10, 1.0), (0, 0.9), (20, 0.7), (1, 0.5), (50, 0.999)):
        theirs = logits.clone()
        if k > 0:
            theirs = TopKLogitsWarper(k)(None, theirs)
        if p < 1.0:
            theirs = TopPLogitsWarper(p)(None, theirs)
        ours = filter_logits(logits, top_k=k, top_p=p)
        assert torch.equal(ours.isinf(), theirs.isinf()), (k, p)
        assert torch.equal(ours[~ours.isinf()], logits[~ours.isinf()])


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("cond", ["sos", "class"])
def test_sampling_draws_tamings_tokens(tmp_path, cond, dtype):
    """taming's Net2NetTransformer.sample (no cache) under torch.manual_seed: one multinomial draw per step on the
    global generator, as ours, so the same seed gives the same codes, with and without our KV cache; each step's
    top-k filtered logits (teacher-forced on the recorded codes) are taming's."""
    fx = load_fixture("vqgan", "net2net")
    want, tol, s = fx.outputs[dtype], TOL[dtype], fx.meta["settings"]["sample"]
    model = _net2net(_net2net_ckpt(tmp_path), n_classes=10 if cond == "class" else None, dtype=dtype)
    labels = fx.inputs["labels"] if cond == "class" else None
    for use_cache in (True, False):
        torch.manual_seed(s["seed"])
        codes = model.sample(2, (4, 4), labels=labels, temperature=s["temperature"], top_k=s["top_k"], use_cache=use_cache)
        assert torch.equal(codes.flatten(1), want[f"{cond}_sampled"]), use_cache
    assert torch.equal(model.sample(2, (4, 4), labels=labels, greedy=True).flatten(1), want[f"{cond}_greedy"])
    cond_tokens = model.cond_tokens(2, labels)
    assert torch.equal(cond_tokens, want[f"{cond}_cond"])
    with torch.no_grad():
        logits, _ = model.transformer(torch.cat((cond_tokens, want[f"{cond}_sampled"]), dim=1)[:, :-1])
    filtered = filter_logits(logits / s["temperature"], top_k=s["top_k"])
    recorded = want[f"{cond}_sampled_filtered_logits"]
    assert torch.equal(filtered.isinf(), recorded.isinf())
    assert (filtered[~filtered.isinf()] - recorded[~recorded.isinf()]).abs().max().item() < tol
    assert len(want[f"{cond}_sampled"].unique()) > 3  # sampled, not collapsed


def test_generator_runs_are_reproducible_and_the_block_size_is_checked():
    ours = _gpt("gpt")
    cond = torch.tensor([[1], [2], [3], [4]])
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    assert torch.equal(ours.generate(cond, 8, generator=g1), ours.generate(cond, 8, generator=g2, use_cache=False))
    assert torch.equal(ours.generate(cond, 12, greedy=True), ours.generate(cond, 12, greedy=True, use_cache=False))
    with pytest.raises(ValueError, match="block size 17"):
        ours.generate(cond, 18)  # 1 + 18 - 1 positions


# --------------------------------------------------------------------------- Net2NetTransformer
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_taming_net2net_checkpoint_loads_and_matches(tmp_path, dtype):
    fx = load_fixture("vqgan", "net2net")
    path = _net2net_ckpt(tmp_path)
    x = fx.inputs["x"].to(getattr(torch, dtype))
    for cond, n_classes, labels in (("sos", None, None), ("class", 10, fx.inputs["labels"])):
        model = _net2net(path, n_classes=n_classes, dtype=dtype)
        with torch.no_grad():
            logits, target = model(x, labels=labels)
        assert torch.equal(target, fx.outputs[dtype][f"{cond}_target"]) and logits.shape == (2, 16, 32)
        assert (logits - fx.outputs[dtype][f"{cond}_logits"]).abs().max().item() < TOL[dtype]
    codes = model.sample(2, (4, 4), labels=labels, top_k=10, generator=torch.Generator().manual_seed(0))
    assert codes.shape == (2, 4, 4) and model.decode_to_img(codes).shape == (2, 3, 8, 8)


def test_class_conditional_and_training_mode():
    model = create_model("vqgan_transformer_tiny", n_classes=10, pkeep=0.5)
    model.train()
    assert not model.first_stage_model.training and not any(p.requires_grad for p in model.first_stage_model.parameters())
    x = torch.rand(2, 3, 64, 64) * 2 - 1
    logits, target = model(x, labels=torch.tensor([3, 9]))
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 512), target.reshape(-1))
    loss.backward()
    assert model.transformer.tok_emb.weight.grad[[3, 9]].abs().sum() > 0  # the label tokens were used
    with pytest.raises(ValueError, match="class labels"):
        model.eval().sample(2, (8, 8))
    assert model.sample(2, (2, 2), labels=torch.tensor([1, 2]), greedy=True).shape == (2, 2, 2)


def test_wrong_mask_or_vocabulary_refused():
    state = {f"transformer.{k}": v for k, v in _weights("gpt").items()}
    model = create_model("vqgan_transformer_tiny", first_stage_kwargs=TOY_FIRST, block_size=17, n_layer=2, n_head=4, n_embd=16)
    assert set(convert_state_dict(dict(state), model)) == {k for k in state if not k.endswith("attn.mask")}
    bad = dict(state)
    bad["transformer.blocks.0.attn.mask"] = torch.ones(1, 1, 17, 17)
    with pytest.raises(WeightsLayoutError, match="n_unmasked=0"):
        convert_state_dict(bad, model)
    unmasked = {f"transformer.{k}": v for k, v in _weights("gpt_unmasked").items()}  # taming's n_unmasked=3 masks
    with pytest.raises(WeightsLayoutError, match="n_unmasked=0"):
        convert_state_dict(unmasked, model)
    bad = dict(state)
    bad["transformer.tok_emb.weight"] = torch.zeros(1024, 16)
    with pytest.raises(WeightsLayoutError, match="vocabulary of 1024 tokens"):
        convert_state_dict(bad, model)
