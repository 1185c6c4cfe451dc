"""Position embeddings: 1D/2D sinusoidal and learned, as in the Transformer, ViT and DETR papers."""
from __future__ import annotations

import math

import torch
from timm.layers import resample_abs_pos_embed
from torch import Tensor, nn

from visiontf.nn.precision import at_least_float32


def sinusoidal_1d(positions: Tensor, dim: int, temperature: float = 10000.0) -> Tensor:
    """PE(pos, 2i) = sin(pos / T^(2i/d)), PE(pos, 2i+1) = cos(pos / T^(2i/d)); shape (*positions.shape, dim)."""
    if dim % 2:
        raise ValueError(f"sinusoidal embedding needs an even dim, got {dim}")
    i = torch.arange(dim // 2, dtype=torch.float32, device=positions.device)
    inv_freq = temperature ** (-2 * i / dim)
    angles = positions.float()[..., None] * inv_freq
    return torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2)


def sine_embedding(coords: Tensor, num_feats: int, temperature: float = 10000.0, scale: float = 2 * math.pi) -> Tensor:
    """Sine/cosine features of coordinates: (..., k) -> (..., k * num_feats).

    Per coordinate, ``num_feats`` channels sin/cos interleaved at frequencies T^(2(i//2)/num_feats)
    of ``coords * scale`` (Deformable DETR's ``get_proposal_pos_embed`` for two-stage query
    positions, normalised boxes with scale 2 pi; Relation-DETR's ``get_sine_pos_embed`` of box
    relations, with scale 100). The same features as :func:`sinusoidal_1d` of ``coords * scale``, but
    divided by the frequencies as the DETR-family originals do, not multiplied by their inverses: the
    two differ by float rounding (up to 2e-6), and checkpoint parity with those originals is tested.
    """
    i = torch.arange(num_feats, dtype=torch.float32, device=coords.device)
    dim_t = temperature ** (2 * torch.div(i, 2, rounding_mode="floor") / num_feats)
    pos = (at_least_float32(coords) * scale)[..., None] / dim_t
    return torch.stack((pos[..., 0::2].sin(), pos[..., 1::2].cos()), dim=-1).flatten(-3)


class SinusoidalPositionEmbedding1d(nn.Module):
    """Fixed 1D embedding of the Transformer paper for sequences (B, L, C) -> (1, L, C)."""

    def __init__(self, dim: int, temperature: float = 10000.0) -> None:
        super().__init__()
        self.dim = dim
        self.temperature = temperature

    def forward(self, x: Tensor) -> Tensor:
        pos = torch.arange(x.shape[1], device=x.device)
        return sinusoidal_1d(pos, self.dim, self.temperature).unsqueeze(0).to(x.dtype)


class PositionEmbeddingSine2d(nn.Module):
    """DETR's ``PositionEmbeddingSine``: per-axis sinusoids over the cumulative count of valid pixels.

    The output is cat(pos_y, pos_x), each ``num_pos_feats`` channels with sin on even and cos on
    odd channels. With ``normalize`` the cumulative sums are divided by their last (valid) value, so
    padding never shifts the positions of real pixels.

    ``offset`` is subtracted from the counts before normalising: 0 in DETR, 0.5 in Deformable DETR
    (``(cumsum - 0.5) / (last + eps) * scale``, the pixel centres).
    """

    def __init__(
        self,
        num_pos_feats: int = 128,
        temperature: float = 10000.0,
        normalize: bool = True,
        scale: float | None = None,
        offset: float = 0.0,
    ) -> None:
        super().__init__()
        if scale is not None and not normalize:
            raise ValueError("scale is only used with normalize=True")
        if offset and not normalize:
            raise ValueError("offset is only used with normalize=True")
        self.num_pos_feats = num_pos_feats
        self.temperature = temperature
        self.normalize = normalize
        self.scale = 2 * math.pi if scale is None else scale
        self.offset = offset

    def forward(self, mask: Tensor) -> Tensor:
        """mask: (B, H, W) bool, True on padded pixels -> (B, 2*num_pos_feats, H, W) float32."""
        not_mask = (~mask).to(torch.float32)
        y = not_mask.cumsum(1)
        x = not_mask.cumsum(2)
        if self.normalize:
            eps = 1e-6
            if self.offset:
                y = (y - self.offset) / (y[:, -1:, :] + eps) * self.scale
                x = (x - self.offset) / (x[:, :, -1:] + eps) * self.scale
            else:
                y = y / (y[:, -1:, :] + eps) * self.scale
                x = x / (x[:, :, -1:] + eps) * self.scale
        i = torch.arange(self.num_pos_feats, dtype=torch.float32, device=mask.device)
        dim_t = self.temperature ** (2 * torch.div(i, 2, rounding_mode="floor") / self.num_pos_feats)
        pos_x = x[..., None] / dim_t
        pos_y = y[..., None] / dim_t
        pos_x = torch.stack((pos_x[..., 0::2].sin(), pos_x[..., 1::2].cos()), dim=4).flatten(3)
        pos_y = torch.stack((pos_y[..., 0::2].sin(), pos_y[..., 1::2].cos()), dim=4).flatten(3)
        return torch.cat((pos_y, pos_x), dim=3).permute(0, 3, 1, 2)


class PositionEmbeddingLearned2d(nn.Module):
    """DETR's ``PositionEmbeddingLearned``: learned row and column tables, output cat(x, y)."""

    def __init__(self, num_pos_feats: int = 128, num_embeddings: int = 50) -> None:
        super().__init__()
        self.row_embed = nn.Embedding(num_embeddings, num_pos_feats)
        self.col_embed = nn.Embedding(num_embeddings, num_pos_feats)
        nn.init.uniform_(self.row_embed.weight)
        nn.init.uniform_(self.col_embed.weight)

    def forward(self, mask: Tensor) -> Tensor:
        """mask: (B, H, W) (only its shape is used) -> (B, 2*num_pos_feats, H, W)."""
        B, H, W = mask.shape
        if H > self.row_embed.num_embeddings or W > self.col_embed.num_embeddings:
            raise ValueError(
                f"feature map {H}x{W} exceeds the learned table of {self.row_embed.num_embeddings} positions; "
                "use the sine embedding or a larger num_embeddings"
            )
        x_emb = self.col_embed(torch.arange(W, device=mask.device))
        y_emb = self.row_embed(torch.arange(H, device=mask.device))
        pos = torch.cat((x_emb[None].expand(H, W, -1), y_emb[:, None].expand(H, W, -1)), dim=-1)
        return pos.permute(2, 0, 1)[None].expand(B, -1, -1, -1)


class LearnedPositionEmbedding1d(nn.Module):
    """ViT-style learned table (1, num_prefix_tokens + H*W, C) that resamples to other grids.

    The table keeps the prefix (class/distillation) tokens unresampled and interpolates the grid
    part bicubically with antialiasing, exactly as timm's ``resample_abs_pos_embed``.
    """

    def __init__(self, grid_size: tuple[int, int], dim: int, num_prefix_tokens: int = 1, std: float = 0.02) -> None:
        super().__init__()
        self.grid_size = tuple(grid_size)
        self.num_prefix_tokens = num_prefix_tokens
        self.weight = nn.Parameter(torch.zeros(1, num_prefix_tokens + self.grid_size[0] * self.grid_size[1], dim))
        nn.init.trunc_normal_(self.weight, std=std)

    def forward(self, grid_size: tuple[int, int] | None = None) -> Tensor:
        return resample_pos_embed(self.weight, self.grid_size, grid_size, self.num_prefix_tokens)


def resample_pos_embed(pos_embed: Tensor, old_grid: tuple[int, int], new_grid: tuple[int, int] | None, num_prefix_tokens: int) -> Tensor:
    """Bicubic (antialiased) resampling of a ViT position table to ``new_grid`` (timm's function)."""
    if new_grid is None or tuple(new_grid) == tuple(old_grid):
        return pos_embed
    return resample_abs_pos_embed(pos_embed, list(new_grid), list(old_grid), num_prefix_tokens=num_prefix_tokens)
