"""VQGAN's vector quantiser: taming's ``VectorQuantizer2`` (``taming/modules/vqvae/quantize.py``).

Each latent vector is replaced by its nearest codebook entry (squared Euclidean distance,
computed as ``|z|^2 + |e|^2 - 2 z.e`` as taming does). The codebook loss keeps taming's default
``legacy=True`` placement of ``beta`` (the original's own note calls it a bug kept for
compatibility): ``mean((sg[z_q] - z)^2) + beta * mean((z_q - sg[z])^2)``; ``legacy=False`` puts
``beta`` on the commitment term as in the VQ-VAE paper. Gradients pass to the encoder by the
straight-through estimator ``z + sg[z_q - z]``. The codebook (``embedding.weight``, the taming
key) starts from U(-1/n_e, 1/n_e).

taming's index remapping (``remap``) and the Gumbel quantiser are not part of VQGAN's published
models and are not implemented.

Options beyond the original, each OFF by default (the published models use none of them), for
training from scratch where taming's codebook leaves most codes unused:

* ``kmeans_init`` (Zeghidour et al., SoundStream 2021, and lucidrains' vector-quantize-pytorch): the
  codebook is set by ``kmeans_iters`` Lloyd iterations on the first training batch's latents.
* ``restart_dead_codes`` (Dhariwal et al., Jukebox 2020, "random restarts"): a code whose running
  usage (an EMA of its counts, decay ``usage_decay``) falls below ``dead_code_threshold`` is
  replaced by a random latent of the current batch.
* ``l2_norm`` (Yu et al., ViT-VQGAN 2022, "factorized and l2-normalized codes"): latents and codes are
  l2-normalised before the nearest-neighbour search, so the search is by cosine similarity; with a
  small ``embed_dim`` (ViT-VQGAN uses 32 then 8) the lookup is low-dimensional.
* ``ema_decay`` (van den Oord et al., VQ-VAE 2017 appendix, and VQ-VAE-2): the codebook is not learnt by
  gradient but is an exponential moving average of the latents assigned to each code (Laplace
  smoothed counts); the loss keeps only the commitment term ``beta * mean((z - sg[z_q])^2)``.

Under ``torch.distributed`` the statistics are summed over ranks and the random draws (k-means
start, restarts) are rank 0's, so every rank keeps the same codebook.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor, nn


class VectorQuantizer2(nn.Module):
    """Nearest-neighbour vector quantisation with a learnt codebook.

    Args:
        n_e: number of codebook entries (codes).
        e_dim: width of each entry (the latent channels it quantises).
        beta: weight of the second loss term (see the module docstring).
        legacy: taming's default loss placement (True) or the VQ-VAE paper's (False).
        kmeans_init, kmeans_iters, restart_dead_codes, dead_code_threshold, usage_decay, l2_norm,
            ema_decay, ema_eps: the options of the module docstring (all off: taming's quantiser).
    """

    def __init__(self, n_e: int, e_dim: int, beta: float = 0.25, legacy: bool = True, *,
                 kmeans_init: bool = False, kmeans_iters: int = 10, restart_dead_codes: bool = False,
                 dead_code_threshold: float = 1e-3, usage_decay: float = 0.99, l2_norm: bool = False,
                 ema_decay: float | None = None, ema_eps: float = 1e-5) -> None:
        super().__init__()
        self.n_e, self.e_dim, self.beta, self.legacy = n_e, e_dim, beta, legacy
        self.embedding = nn.Embedding(n_e, e_dim)
        nn.init.uniform_(self.embedding.weight, -1.0 / n_e, 1.0 / n_e)
        if ema_decay is not None and not 0.0 < ema_decay < 1.0:
            raise ValueError(f"ema_decay={ema_decay}; use a value in (0, 1) (0.99 in VQ-VAE) or None")
        self.kmeans_init, self.kmeans_iters = kmeans_init, kmeans_iters
        self.restart_dead_codes, self.dead_code_threshold, self.usage_decay = restart_dead_codes, dead_code_threshold, usage_decay
        self.l2_norm, self.ema_decay, self.ema_eps = l2_norm, ema_decay, ema_eps
        # buffers exist only with the options, so taming's state dicts keep their keys
        if kmeans_init:
            self.register_buffer("initted", torch.zeros(()))
        if restart_dead_codes:
            self.register_buffer("usage", torch.ones(n_e))
        if ema_decay is not None:
            self.embedding.weight.requires_grad_(False)
            self.register_buffer("cluster_size", torch.zeros(n_e))
            self.register_buffer("embed_avg", self.embedding.weight.detach().clone())

    @property
    def num_codes(self) -> int:
        return self.n_e

    def codebook(self) -> Tensor:
        """The entries as searched and looked up: l2-normalised with ``l2_norm``."""
        e = self.embedding.weight
        return nn.functional.normalize(e, dim=1) if self.l2_norm else e

    def distances(self, z_flat: Tensor) -> Tensor:
        """(N, e_dim) -> (N, n_e) squared distances to every codebook entry."""
        e = self.codebook()
        if self.l2_norm:
            z_flat = nn.functional.normalize(z_flat, dim=1)
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
        return nn.functional.embedding(indices, self.codebook()).permute(0, 3, 1, 2).contiguous()

    def get_codebook_entry(self, indices: Tensor, shape: tuple[int, int, int, int] | None) -> Tensor:
        """taming's signature: flat ``indices`` and ``shape`` = (B, h, w, e_dim) -> (B, e_dim, h, w);
        ``shape=None`` returns the entries as (N, e_dim)."""
        z_q = nn.functional.embedding(indices, self.codebook())
        if shape is None:
            return z_q
        return z_q.view(shape).permute(0, 3, 1, 2).contiguous()

    def loss(self, z: Tensor, z_q: Tensor) -> Tensor:
        """The codebook + commitment loss of latents ``z`` and their (not straight-through) codes ``z_q``."""
        first = torch.mean((z_q.detach() - z) ** 2)
        if self.ema_decay is not None:  # the codebook follows its EMA: only the commitment term
            return self.beta * first
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
        if self.l2_norm:
            z_bhwc = nn.functional.normalize(z_bhwc, dim=-1)
        z_flat = z_bhwc.view(-1, C)
        if self.training and self.kmeans_init and not bool(self.initted):
            self._kmeans(z_flat.detach().float())
        indices = self.distances(z_flat).argmin(dim=1)
        if self.training:
            self._update(z_flat.detach().float(), indices)
        z_q = nn.functional.embedding(indices, self.codebook()).view(z_bhwc.shape)
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

    # ------------------------------------------------------------------ options (training only)
    @torch.no_grad()
    def _kmeans(self, z: Tensor) -> None:
        """Lloyd's k-means on this batch's latents (rank 0's start, statistics summed over ranks)."""
        idx = torch.randint(0, z.shape[0], (self.n_e,), device=z.device) if z.shape[0] < self.n_e \
            else torch.randperm(z.shape[0], device=z.device)[: self.n_e]
        centres = _broadcast(z[idx].clone())
        for _ in range(self.kmeans_iters):
            assign = torch.cdist(z, centres).argmin(dim=1)
            sums = torch.zeros_like(centres).index_add_(0, assign, z)
            counts = torch.bincount(assign, minlength=self.n_e).to(z.dtype)
            sums, counts = _all_reduce(sums), _all_reduce(counts)
            centres = torch.where(counts[:, None] > 0, sums / counts.clamp_min(1)[:, None], centres)
        self.embedding.weight.data.copy_(centres)
        if self.ema_decay is not None:
            self.embed_avg.copy_(centres)
            self.cluster_size.fill_(1.0)
        self.initted.fill_(1.0)

    @torch.no_grad()
    def _update(self, z: Tensor, indices: Tensor) -> None:
        if self.ema_decay is None and not self.restart_dead_codes:
            return
        counts = _all_reduce(torch.bincount(indices, minlength=self.n_e).to(z.dtype))
        if self.ema_decay is not None:
            d = self.ema_decay
            sums = _all_reduce(torch.zeros(self.n_e, self.e_dim, device=z.device, dtype=z.dtype).index_add_(0, indices, z))
            self.cluster_size.mul_(d).add_(counts, alpha=1 - d)
            self.embed_avg.mul_(d).add_(sums, alpha=1 - d)
            n = self.cluster_size.sum()
            size = (self.cluster_size + self.ema_eps) / (n + self.n_e * self.ema_eps) * n  # Laplace smoothing
            self.embedding.weight.data.copy_(self.embed_avg / size[:, None])
        if self.restart_dead_codes:
            self.usage.mul_(self.usage_decay).add_(counts / counts.sum().clamp_min(1) * self.n_e, alpha=1 - self.usage_decay)
            dead = self.usage < self.dead_code_threshold
            if bool(dead.any()):
                k = int(dead.sum())
                new = _broadcast(z[torch.randint(0, z.shape[0], (k,), device=z.device)])
                self.embedding.weight.data[dead] = new
                if self.ema_decay is not None:
                    self.embed_avg[dead] = new
                    self.cluster_size[dead] = 1.0
                self.usage[dead] = 1.0

    def _check(self, z: Tensor) -> tuple[int, int, int, int]:
        if z.dim() != 4 or z.shape[1] != self.e_dim:
            raise ValueError(f"expected latents of shape (B, {self.e_dim}, h, w), got {tuple(z.shape)}")
        return tuple(z.shape)  # type: ignore[return-value]


def _all_reduce(t: Tensor) -> Tensor:
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t)
    return t


def _broadcast(t: Tensor) -> Tensor:
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        t = t.contiguous()
        dist.broadcast(t, 0)
    return t
