"""taming's VectorQuantizer2: codes, loss placement, straight-through gradients, codebook init.

``tests/fixtures/vqgan/quantizer.safetensors`` holds what taming's own ``VectorQuantizer2`` computed
(``scripts/fixtures/make_vqgan.py``): codes, quantised latents, the loss with ``legacy`` True and False, and
the gradients of ``loss + sum(z_q * g)`` for the latent and the codebook, in float32 and float64.
"""
from __future__ import annotations

import pytest
import torch
from reference.fixtures import load_fixture

from visiontf.models.vqgan.quantize import VectorQuantizer2

TOL = {"float32": 1e-5, "float64": 1e-10}


def test_codebook_init_is_uniform_within_one_over_n():
    q = VectorQuantizer2(512, 16)
    w = q.embedding.weight
    assert w.abs().max() <= 1 / 512 and w.std() > 0.4 / 512  # U(-1/n, 1/n): std 1/(n*sqrt(3))
    assert list(q.state_dict()) == ["embedding.weight"]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("legacy", [True, False])
def test_same_codes_latents_loss_and_gradients_as_taming(legacy, dtype):
    fx = load_fixture("vqgan", "quantizer")
    tag, want, tol, dt = "legacy" if legacy else "nonlegacy", fx.outputs[dtype], TOL[dtype], getattr(torch, dtype)
    ours = VectorQuantizer2(32, 4, beta=0.25, legacy=legacy)
    ours.load_state_dict({k: v.float() for k, v in fx.weights.items()})
    ours = ours.to(dt)
    z = fx.inputs["z"].to(dt).requires_grad_(True)
    zq, loss, (perplexity, encodings, idx) = ours(z)
    (loss + (zq * fx.inputs["g"].to(dt)).sum()).backward()
    assert torch.equal(idx, want[f"{tag}_indices"]) and idx.shape == (3 * 5 * 7,)
    assert torch.equal(ours.codes(z.detach()).flatten(), want[f"{tag}_indices"])
    assert (zq - want[f"{tag}_z_q"]).abs().max() < tol
    assert abs(loss.item() - want[f"{tag}_loss"].item()) < tol
    assert (z.grad - want[f"{tag}_grad_z"]).abs().max() < tol
    assert (ours.embedding.weight.grad - want[f"{tag}_grad_codebook"]).abs().max() < tol
    assert encodings is None and 1 <= perplexity.item() <= 32


def test_codes_are_the_nearest_entries():
    q = VectorQuantizer2(32, 4)
    with torch.no_grad():
        q.embedding.weight.normal_()
    z = torch.randn(2, 4, 3, 3)
    brute = torch.cdist(z.permute(0, 2, 3, 1).reshape(-1, 4), q.embedding.weight).argmin(1).view(2, 3, 3)
    assert torch.equal(q.codes(z), brute)
    assert (q.lookup(brute) - q(z)[0]).abs().max() < 1e-6  # z + sg[zq - z]: zq up to rounding


def test_loss_placement_of_beta():
    """legacy (taming's default): |sg[zq] - z|^2 + beta |zq - sg[z]|^2 -> the encoder gets weight 1, the codebook beta."""
    for legacy, enc_w, book_w in ((True, 1.0, 0.25), (False, 0.25, 1.0)):
        q = VectorQuantizer2(4, 2, beta=0.25, legacy=legacy)
        with torch.no_grad():
            q.embedding.weight.copy_(torch.tensor([[0.0, 0.0], [5.0, 5.0], [-5.0, 5.0], [5.0, -5.0]]))
        z = torch.tensor([[[[1.0]], [[2.0]]]], requires_grad=True)  # nearest code 0; distance^2 = 5 over 2 dims
        _, loss, _ = q(z)
        assert loss.item() == pytest.approx((enc_w + book_w) * 2.5)
        loss.backward()
        # d/dz of enc_w * mean((z - e)^2) over 2 elements = enc_w * (z - e)
        assert torch.allclose(z.grad.flatten(), enc_w * torch.tensor([1.0, 2.0]))
        assert torch.allclose(q.embedding.weight.grad[0], -book_w * torch.tensor([1.0, 2.0]))


def test_straight_through_gradient_is_identity():
    q = VectorQuantizer2(16, 4)
    z = torch.randn(2, 4, 3, 3, requires_grad=True)
    zq, _, _ = q(z)
    g = torch.randn_like(zq)
    (zq * g).sum().backward()
    assert torch.allclose(z.grad, g)


def test_taming_codebook_entry_and_lookup_checks():
    q = VectorQuantizer2(16, 4)
    idx = torch.randint(0, 16, (2, 3, 5))
    assert torch.equal(q.get_codebook_entry(idx.flatten(), (2, 3, 5, 4)), q.lookup(idx))
    assert q.get_codebook_entry(idx.flatten(), None).shape == (30, 4)
    with pytest.raises(ValueError, match=r"\[0, 16\)"):
        q.lookup(torch.full((1, 1, 1), -1))
    with pytest.raises(TypeError, match="integers"):
        q.lookup(torch.zeros(1, 1, 1))
    with pytest.raises(ValueError, match=r"\(B, 4, h, w\)"):
        q(torch.zeros(1, 3, 2, 2))


def test_perplexity():
    q = VectorQuantizer2(8, 2)
    assert q.perplexity(torch.zeros(10, dtype=torch.long)).item() == pytest.approx(1.0)
    assert q.perplexity(torch.arange(8).repeat(3)).item() == pytest.approx(8.0, rel=1e-5)
