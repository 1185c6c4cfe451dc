"""VQGAN's second stage: taming's minGPT layout and logits, KV-cached sampling, Net2NetTransformer checkpoints."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from visiontf.models import create_model
from visiontf.models._registry import WeightsLayoutError
from visiontf.models.vqgan.transformer import GPT, convert_state_dict, filter_logits

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ is not an installed package
from benchmarks import reference_vqgan as ref  # noqa: E402

SMALL = dict(vocab_size=40, block_size=24, n_layer=2, n_head=4, n_embd=32)
TOL = 1e-5


def _pair(n_unmasked=0, seed=0):
    """A reference minGPT with non-trivial weights (pos_emb and LayerNorms too) and ours loaded from its state dict."""
    torch.manual_seed(seed)
    theirs = ref.GPT(**SMALL, n_unmasked=n_unmasked).eval()
    with torch.no_grad():
        for name, p in theirs.named_parameters():
            p.normal_(1.0 if name.endswith(("ln1.weight", "ln2.weight", "ln_f.weight")) else 0.0, 0.2)
    ours = GPT(**SMALL, n_unmasked=n_unmasked).eval()
    state = {f"transformer.{k}": v for k, v in theirs.state_dict().items()}
    state = {k[len("transformer."):]: v for k, v in convert_state_dict(state, _Holder(ours)).items()}
    ours.load_state_dict(state)
    return ours, theirs


class _Holder(torch.nn.Module):
    def __init__(self, gpt):
        super().__init__()
        self.transformer = gpt


def test_layout_and_init_are_tamings():
    ours = GPT(**SMALL)
    theirs = ref.GPT(**SMALL)
    own = {k: tuple(v.shape) for k, v in ours.state_dict().items()}
    assert own == {k: tuple(v.shape) for k, v in theirs.state_dict().items() if not k.endswith("attn.mask")}
    for key in ("tok_emb.weight", "pos_emb", "blocks.1.attn.query.bias", "blocks.0.mlp.0.weight", "blocks.0.mlp.2.bias", "ln_f.weight"):
        assert key in own
    assert "head.bias" not in own and own["pos_emb"] == (1, 24, 32)
    big = GPT(vocab_size=1024, block_size=16, n_layer=2, n_head=4, n_embd=256)
    assert abs(big.tok_emb.weight.std().item() - 0.02) < 1e-3 and big.blocks[0].attn.key.bias.abs().sum() == 0
    assert big.pos_emb.abs().sum() == 0  # a bare Parameter: taming's init leaves it at zeros
    # taming's AdamW groups: only Linear weights decay
    nwd = big.no_weight_decay()
    assert {"pos_emb", "tok_emb.weight", "ln_f.weight", "blocks.0.ln1.bias", "blocks.0.attn.key.bias"} <= nwd
    assert not {"head.weight", "blocks.0.attn.proj.weight", "blocks.0.mlp.0.weight"} & nwd


@pytest.mark.parametrize("n_unmasked", [0, 3])
def test_logits_equal_tamings(n_unmasked):
    ours, theirs = _pair(n_unmasked)
    idx = torch.randint(0, 40, (3, 24))
    targets = torch.randint(0, 40, (3, 24))
    with torch.no_grad():
        logits, loss = ours(idx, targets=targets)
        ref_logits, _ = theirs(idx)
    assert (logits - ref_logits).abs().max().item() < TOL
    assert abs(loss.item() - torch.nn.functional.cross_entropy(ref_logits.reshape(-1, 40), targets.reshape(-1)).item()) < TOL


def test_cached_steps_give_the_full_forwards_logits():
    ours, theirs = _pair()
    idx = torch.randint(0, 40, (2, 20))
    with torch.no_grad():
        full, _ = ours(idx)
        cache = ours.new_cache(2, 20)
        parts = [ours(idx[:, :5], cache=cache)[0]] + [ours(idx[:, t : t + 1], cache=cache)[0] for t in range(5, 20)]
        assert cache.length == 20
        # taming's forward_with_past, one token at a time after a prompt of 5
        _, _, present = theirs.forward_with_past(idx[:, :5])
        past, ref_last = [present], []
        for t in range(5, 20):
            lg, _, present = theirs.forward_with_past(idx[:, t : t + 1], past=past, past_length=t)
            past.append(present)
            ref_last.append(lg)
    cached = torch.cat(parts, dim=1)
    assert (cached - full).abs().max().item() < TOL
    assert (torch.cat(ref_last, 1) - full[:, 5:]).abs().max().item() < TOL


def test_filter_matches_transformers_top_k_top_p():
    logits = torch.randn(6, 50) * 3
    for k, p in ((10, 1.0), (0, 0.9), (20, 0.7), (1, 0.5), (50, 0.999)):
        ours = filter_logits(logits, top_k=k, top_p=p)
        theirs = ref.top_k_top_p_filtering(logits, top_k=k, top_p=p)
        assert torch.equal(ours.isinf(), theirs.isinf()), (k, p)
        assert torch.equal(ours[~ours.isinf()], logits[~ours.isinf()])


def test_greedy_sampling_cached_uncached_and_tamings_agree():
    ours, theirs = _pair()
    cond = torch.tensor([[3], [7], [11]])
    cached = ours.generate(cond, 20, greedy=True)
    uncached = ours.generate(cond, 20, greedy=True, use_cache=False)
    taming = ref.sample_with_past(cond, theirs, 20, sample_logits=False)
    assert cached.shape == (3, 20)
    assert torch.equal(cached, uncached) and torch.equal(cached, taming)


def test_seeded_sampling_cached_uncached_and_tamings_agree():
    ours, theirs = _pair()
    cond = torch.tensor([[1], [2], [3], [4]])
    runs = []
    for use_cache in (True, False):
        torch.manual_seed(123)
        runs.append(ours.generate(cond, 20, temperature=0.9, top_k=15, top_p=0.9, use_cache=use_cache))
    torch.manual_seed(123)
    taming = ref.sample_with_past(cond, theirs, 20, temperature=0.9, top_k=15, top_p=0.9)
    assert torch.equal(runs[0], runs[1]) and torch.equal(runs[0], taming)
    torch.manual_seed(123)  # taming's uncached Net2NetTransformer.sample (top-k only) draws the same tokens
    uncached = ref.sample(cond[:, :0], cond, 20, theirs, temperature=0.9, sample=True, top_k=15)
    torch.manual_seed(123)
    assert torch.equal(uncached, ours.generate(cond, 20, temperature=0.9, top_k=15))
    assert torch.equal(ref.sample(cond[:, :0], cond, 20, theirs, top_k=15), ours.generate(cond, 20, greedy=True))
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    assert torch.equal(ours.generate(cond, 8, generator=g1), ours.generate(cond, 8, generator=g2, use_cache=False))
    assert len(runs[0].unique()) > 3  # sampled, not collapsed
    with pytest.raises(ValueError, match="block size 24"):
        ours.generate(cond, 25)  # 1 + 25 - 1 positions


# --------------------------------------------------------------------------- Net2NetTransformer
def _taming_net2net_state(n_embd=128, n_head=4, n_layer=4):
    """A taming Net2NetTransformer state dict over vqgan_tiny: first_stage_model.* (with loss.*) and transformer.* (with masks)."""
    from visiontf.models.vqgan.vqgan import DEFAULT_CFGS

    s = DEFAULT_CFGS["vqgan_tiny"].kwargs
    dd = {k: s[k] for k in ("ch", "ch_mult", "num_res_blocks", "attn_resolutions", "resolution", "z_channels")}
    first = ref.OriginalVQModel(dict(double_z=False, in_channels=3, out_ch=3, **dd), s["n_embed"], s["embed_dim"]).eval()
    gpt = ref.GPT(vocab_size=512, block_size=64, n_layer=n_layer, n_head=n_head, n_embd=n_embd).eval()
    with torch.no_grad():
        for p in gpt.parameters():
            p.normal_(0, 0.05)
    state = {f"first_stage_model.{k}": v for k, v in first.state_dict().items()}
    state.update({f"transformer.{k}": v for k, v in gpt.state_dict().items()})
    return state, first, gpt


def test_taming_net2net_checkpoint_loads_and_matches(tmp_path):
    state, first, gpt = _taming_net2net_state()
    torch.save({"state_dict": state}, tmp_path / "last.ckpt")
    model = create_model("vqgan_transformer_tiny", pretrained=tmp_path / "last.ckpt").eval()
    x = torch.rand(2, 3, 64, 64) * 2 - 1
    with torch.no_grad():
        logits, target = model(x)
        _, _, (_, _, idx) = first.encode(x)
        z = idx.view(2, -1)
        sos = torch.zeros(2, 1, dtype=torch.long)
        ref_logits, _ = gpt(torch.cat((sos, z), 1)[:, :-1])
    assert torch.equal(target, z) and logits.shape == (2, 64, 512)
    assert (logits - ref_logits).abs().max().item() < TOL
    codes = model.sample(2, (8, 8), top_k=50, generator=torch.Generator().manual_seed(0))
    assert codes.shape == (2, 8, 8) and model.decode_to_img(codes).shape == (2, 3, 64, 64)


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
    state, _, _ = _taming_net2net_state(n_embd=32, n_layer=1)
    model = create_model("vqgan_transformer_tiny", n_embd=32, n_layer=1)
    bad = dict(state)
    bad["transformer.blocks.0.attn.mask"] = torch.ones(1, 1, 64, 64)
    with pytest.raises(WeightsLayoutError, match="n_unmasked=0"):
        convert_state_dict(bad, model)
    bad = dict(state)
    bad["transformer.tok_emb.weight"] = torch.zeros(1024, 32)
    with pytest.raises(WeightsLayoutError, match="vocabulary of 1024 tokens"):
        convert_state_dict(bad, model)
