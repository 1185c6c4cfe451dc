"""VQGAN's vector quantiser: taming's ``VectorQuantizer2`` (``taming/modules/vqvae/quantize.py``).

Each latent vector is replaced by its nearest codebook entry (squared Euclidean distance,
computed as ``|z|^2 + |e|^2 - 2 z.e`` as taming does). The codebook loss keeps taming's default
``legacy=True`` placement of ``beta`` (the original's own note calls it a bug kept for
compatibility): ``mean((sg[z_q] - z)^2) + beta * mean((z_q - sg[z])^2)``; ``legacy=False`` puts
``beta`` on the commitment term as in the VQ-VAE paper. Gradients pass to the encoder by the
straight-through estimator ``z + sg[z_q - z]``. The codebook (``embedding.weight``, the taming
key) starts from U(-1/n_e, 1/n_e).

taming's index remapping (``remap``) and the Gumbel/EMA quantisers are not part of VQGAN's
published models and are not implemented.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn


class VectorQuantizer2(nn.Module):
    """Nearest-neighbour vector quantisation with a learnt codebook.

    Args:
        n_e: number of codebook entries (codes).
        e_dim: width of each entry (the latent channels it quantises).
        beta: weight of the second loss term (see the module docstring).
        legacy: taming's default loss placement (True) or the VQ-VAE paper's (False).
    """

    def __init__(self, n_e: int, e_dim: int, beta: float = 0.25, legacy: bool = True) -> None:
        super().__init__()
        self.n_e, self.e_dim, self.beta, self.legacy = n_e, e_dim, beta, legacy
        self.embedding = nn.Embedding(n_e, e_dim)
        nn.init.uniform_(self.embedding.weight, -1.0 / n_e, 1.0 / n_e)

    @property
    def num_codes(self) -> int:
        return self.n_e

    def distances(self, z_flat: Tensor) -> Tensor:
        """(N, e_dim) -> (N, n_e) squared distances to every codebook entry."""
        e = self.embedding.weight
        return (z_flat**2).sum(dim=1, keepdim=True) + (e**2).sum(dim=1) - 2 * (z_flat @ e.t())

    def codes(self, z: Tensor) -> Tensor:
        """Latents (B, e_dim, h, w) -> code indices (B, h, w), int64."""
        B, C, h, w = self._check(z)
        z_flat = z.permute(0, 2, 3, 1).reshape(-1, C)
        return self.distances(z_flat).argmin(dim=1).view(B, h, w)

    def lookup(self, indices: Tensor) -> Tensor:
        """Code indices (B, h, w) -> quantised latents (B, e_dim, h, w)."""
        if indices.dtype.is_floating_point or indices.dtype == torch.bool:
            raise TypeError(f"code indices must be integers, got {indices.dtype}")
        if indices.numel() and (int(indices.min()) < 0 or int(indices.max()) >= self.n_e):
            raise ValueError(f"code indices must lie in [0, {self.n_e}), got [{int(indices.min())}, {int(indices.max())}]")
        return self.embedding(indices).permute(0, 3, 1, 2).contiguous()

    def get_codebook_entry(self, indices: Tensor, shape: tuple[int, int, int, int] | None) -> Tensor:
        """taming's signature: flat ``indices`` and ``shape`` = (B, h, w, e_dim) -> (B, e_dim, h, w);
        ``shape=None`` returns the entries as (N, e_dim)."""
        z_q = self.embedding(indices)
        if shape is None:
            return z_q
        return z_q.view(shape).permute(0, 3, 1, 2).contiguous()

    def loss(self, z: Tensor, z_q: Tensor) -> Tensor:
        """The codebook + commitment loss of latents ``z`` and their (not straight-through) codes ``z_q``."""
        first = torch.mean((z_q.detach() - z) ** 2)
        second = torch.mean((z_q - z.detach()) ** 2)
        return first + self.beta * second if self.legacy else self.beta * first + second

    def forward(self, z: Tensor) -> tuple[Tensor, Tensor, tuple[Tensor, None, Tensor]]:
        """Quantise latents (B, e_dim, h, w).

        Returns taming's triple ``(z_q, loss, (perplexity, min_encodings, indices))``: ``z_q``
        (B, e_dim, h, w) with straight-through gradients, the scalar loss, the codebook perplexity
        of this batch (taming's ``VectorQuantizer2`` leaves it None; computed here from the
        indices, no gradient), ``None`` for the one-hot encodings (N x n_e, never built) and the
        indices flattened to (B*h*w,) in (b, h, w) order as taming returns them (``codes`` gives
        them as (B, h, w)).
        """
        B, C, h, w = self._check(z)
        z_bhwc = z.permute(0, 2, 3, 1).contiguous()
        z_flat = z_bhwc.view(-1, C)
        indices = self.distances(z_flat).argmin(dim=1)
        z_q = self.embedding(indices).view(z_bhwc.shape)
        loss = self.loss(z_bhwc, z_q)
        z_q = z_bhwc + (z_q - z_bhwc).detach()
        z_q = z_q.permute(0, 3, 1, 2).contiguous()
        return z_q, loss, (self.perplexity(indices), None, indices)

    @torch.no_grad()
    def perplexity(self, indices: Tensor) -> Tensor:
        """exp(entropy) of the code histogram of ``indices``: 1 when one code is used, n_e when all are evenly."""
        p = torch.bincount(indices.reshape(-1), minlength=self.n_e).float()
        p = p / p.sum().clamp_min(1)
        return torch.exp(-(p * torch.log(p + 1e-10)).sum())

    def _check(self, z: Tensor) -> tuple[int, int, int, int]:
        if z.dim() != 4 or z.shape[1] != self.e_dim:
            raise ValueError(f"expected latents of shape (B, {self.e_dim}, h, w), got {tuple(z.shape)}")
        return tuple(z.shape)  # type: ignore[return-value]
