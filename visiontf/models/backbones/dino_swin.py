"""IDEA-Research/DINO's Swin Transformer backbones (``models/dino/swin_transformer.py``), in its layout.

DINO's Swin-T/B/L come from the Swin detection code (Swin-Transformer-Object-Detection), which takes
any image size: the image is padded bottom/right to a multiple of the patch, every block pads its
(normalised) tokens with zeros to a multiple of the window *before* the cyclic shift, the shift mask
(-100 between regions, as the original) is computed on that padded grid, and patch merging pads odd
sides. timm's Swin rolls before it pads and shrinks windows to the feature size, which gives other
numbers at sizes that are not window multiples, so this module follows DINO's arithmetic itself
(attention through ``F.scaled_dot_product_attention`` with the relative position bias and the shift
mask added to the logits). The parameter and buffer names are DINO's (``patch_embed``, ``layers.i``
with ``downsample`` at the end of stage i, ``norm{i}`` on each output), so DINO's checkpoints
(``backbone.0.*``) and the Swin ImageNet releases load by a prefix rename.
``tests/models/deformable_detr/test_dino_swin.py`` compares it with what DINO's own code computed (fixtures recorded by
``scripts/fixtures/make_dino.py`` from a checkout of the original).
"""
from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from visiontf.models.backbones.backbone import Backbone, check_indices, select_levels
from visiontf.models.backbones.registry import register_backbone
from visiontf.nn.attention import scaled_dot_product_attention

log = logging.getLogger(__name__)

#: DINO's ``build_swin_transformer`` names: (embed_dim, depths, num_heads, window_size)
DINO_SWIN_NAMES: dict[str, tuple[int, tuple[int, ...], tuple[int, ...], int]] = {
    "swin_T_224_1k": (96, (2, 2, 6, 2), (3, 6, 12, 24), 7),
    "swin_B_224_22k": (128, (2, 2, 18, 2), (4, 8, 16, 32), 7),
    "swin_B_384_22k": (128, (2, 2, 18, 2), (4, 8, 16, 32), 12),
    "swin_L_224_22k": (192, (2, 2, 18, 2), (6, 12, 24, 48), 7),
    "swin_L_384_22k": (192, (2, 2, 18, 2), (6, 12, 24, 48), 12),
}
#: the ImageNet releases DINO's README points to (``backbone_dir``), by name
RELEASES = {
    "swin_T_224_1k": "https://github.com/SwinTransformer/storage/releases/download/v1.0.0/swin_tiny_patch4_window7_224.pth",
    "swin_B_384_22k": "https://github.com/SwinTransformer/storage/releases/download/v1.0.0/swin_base_patch4_window12_384_22k.pth",
    "swin_L_384_22k": "https://github.com/SwinTransformer/storage/releases/download/v1.0.0/swin_large_patch4_window12_384_22k.pth",
}


def window_partition(x: Tensor, w: int) -> Tensor:
    """(B, H, W, C) with H, W multiples of ``w`` -> (B * windows, w * w, C), windows row-major."""
    B, H, W, C = x.shape
    return x.view(B, H // w, w, W // w, w, C).permute(0, 1, 3, 2, 4, 5).reshape(-1, w * w, C)


def window_reverse(windows: Tensor, w: int, H: int, W: int) -> Tensor:
    B = windows.shape[0] // ((H // w) * (W // w))
    return windows.view(B, H // w, W // w, w, w, -1).permute(0, 1, 3, 2, 4, 5).reshape(B, H, W, -1)


def shift_mask(Hp: int, Wp: int, window: int, shift: int, device: torch.device) -> Tensor:
    """DINO's shifted-window mask on the padded grid: (windows, w * w, w * w), 0 within a region, -100 across."""
    region = torch.zeros(Hp, Wp, device=device)
    cuts = (slice(0, -window), slice(-window, -shift), slice(-shift, None))
    for i, h in enumerate(cuts):
        for j, v in enumerate(cuts):
            region[h, v] = 3 * i + j
    ids = window_partition(region[None, :, :, None], window).squeeze(-1)
    diff = ids[:, None, :] - ids[:, :, None]
    return torch.zeros_like(diff).masked_fill(diff != 0, -100.0)


class WindowAttention(nn.Module):
    """Multi-head self-attention within a window, with a learned relative position bias (DINO's names)."""

    def __init__(self, dim: int, window: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.window = window
        self.relative_position_bias_table = nn.Parameter(torch.zeros((2 * window - 1) ** 2, num_heads))
        coords = torch.stack(torch.meshgrid(torch.arange(window), torch.arange(window), indexing="ij")).flatten(1)
        rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0) + (window - 1)
        self.register_buffer("relative_position_index", rel[..., 0] * (2 * window - 1) + rel[..., 1])
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)
        nn.init.trunc_normal_(self.relative_position_bias_table, std=0.02)

    def forward(self, x: Tensor, mask: Tensor | None) -> Tensor:
        """x (B * windows, N, C); mask (windows, N, N) added to the logits, or None."""
        Bw, N, C = x.shape
        q, k, v = self.qkv(x).view(Bw, N, 3, self.num_heads, C // self.num_heads).permute(2, 0, 3, 1, 4)
        bias = self.relative_position_bias_table[self.relative_position_index.view(-1)].view(N, N, -1).permute(2, 0, 1)
        bias = bias.unsqueeze(0).to(q.dtype)
        if mask is not None:
            # (images, windows, heads, N, d) against a (1, windows, heads, N, N) bias: broadcast over the images,
            # whose count stays dynamic in an exported graph (an expand to B * windows baked the traced batch)
            nw = mask.shape[0]
            q, k, v = (t.reshape(-1, nw, *t.shape[1:]) for t in (q, k, v))
            bias = bias.unsqueeze(0) + mask.to(q.dtype)[None, :, None]
            out = scaled_dot_product_attention(q, k, v, attn_mask=bias).flatten(0, 1)
        else:
            out = scaled_dot_product_attention(q, k, v, attn_mask=bias)
        return self.proj(out.transpose(1, 2).reshape(Bw, N, C))


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.act(self.fc1(x)))


class SwinBlock(nn.Module):
    def __init__(self, dim: int, num_heads: int, window: int, shift: int, drop_path: float) -> None:
        super().__init__()
        from timm.layers import DropPath

        self.window, self.shift = window, shift
        self.norm1 = nn.LayerNorm(dim)
        self.attn = WindowAttention(dim, window, num_heads)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, 4 * dim)

    def forward(self, x: Tensor, H: int, W: int, mask: Tensor | None) -> Tensor:
        B, L, C = x.shape
        w = self.window
        y = F.pad(self.norm1(x).view(B, H, W, C), (0, 0, 0, -W % w, 0, -H % w))  # pad after the norm, as DINO's
        Hp, Wp = y.shape[1:3]
        if self.shift:
            y = torch.roll(y, shifts=(-self.shift, -self.shift), dims=(1, 2))
        y = window_reverse(self.attn(window_partition(y, w), mask if self.shift else None), w, Hp, Wp)
        if self.shift:
            y = torch.roll(y, shifts=(self.shift, self.shift), dims=(1, 2))
        x = x + self.drop_path(y[:, :H, :W].reshape(B, L, C))
        return x + self.drop_path(self.mlp(self.norm2(x)))


class PatchMerging(nn.Module):
    """2x2 neighbours concatenated (odd sides zero-padded), normalised, projected to twice the channels."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.reduction = nn.Linear(4 * dim, 2 * dim, bias=False)
        self.norm = nn.LayerNorm(4 * dim)

    def forward(self, x: Tensor, H: int, W: int) -> Tensor:
        B, _, C = x.shape
        x = F.pad(x.view(B, H, W, C), (0, 0, 0, W % 2, 0, H % 2))
        x = torch.cat([x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]], -1)
        return self.reduction(self.norm(x.view(B, -1, 4 * C)))


class SwinStage(nn.Module):
    """DINO's ``BasicLayer``: blocks alternating plain and shifted windows, then (but the last) patch merging."""

    def __init__(self, dim: int, depth: int, num_heads: int, window: int, drop_path: Sequence[float], downsample: bool) -> None:
        super().__init__()
        self.window = window
        self.blocks = nn.ModuleList(
            SwinBlock(dim, num_heads, window, 0 if i % 2 == 0 else window // 2, drop_path[i]) for i in range(depth)
        )
        self.downsample = PatchMerging(dim) if downsample else None

    def forward(self, x: Tensor, H: int, W: int) -> tuple[Tensor, Tensor, int, int]:
        """-> this stage's tokens (B, H * W, C), the next stage's input and its (H, W)."""
        w = self.window
        # ceiling division of non-negative sizes (exported graphs divide ints truncating, so -(-H // w) would shrink)
        mask = shift_mask((H + w - 1) // w * w, (W + w - 1) // w * w, w, w // 2, x.device)
        for blk in self.blocks:
            x = blk(x, H, W, mask)
        if self.downsample is None:
            return x, x, H, W
        return x, self.downsample(x, H, W), (H + 1) // 2, (W + 1) // 2


class PatchEmbed(nn.Module):
    """4x4 patches (image padded bottom/right to a multiple), then LayerNorm."""

    def __init__(self, embed_dim: int, patch: int = 4) -> None:
        super().__init__()
        self.patch = patch
        self.proj = nn.Conv2d(3, embed_dim, kernel_size=patch, stride=patch)
        self.norm = nn.LayerNorm(embed_dim)

    def forward(self, x: Tensor) -> Tensor:
        p = self.patch
        x = self.proj(F.pad(x, (0, -x.shape[-1] % p, 0, -x.shape[-2] % p)))
        B, C, h, w = x.shape
        return self.norm(x.flatten(2).transpose(1, 2)).transpose(1, 2).view(B, C, h, w)


class SwinTransformer(nn.Module):
    """DINO's ``SwinTransformer`` (no absolute position embedding, patch norm on): images -> NCHW maps of ``out_indices``."""

    def __init__(self, embed_dim: int, depths: Sequence[int], num_heads: Sequence[int], window_size: int,
                 out_indices: Sequence[int] = (1, 2, 3), drop_path_rate: float = 0.2) -> None:
        super().__init__()
        self.out_indices = tuple(out_indices)
        self.patch_embed = PatchEmbed(embed_dim)
        dpr = torch.linspace(0, drop_path_rate, sum(depths), device="cpu").tolist()
        self.num_features = [embed_dim * 2 ** i for i in range(len(depths))]
        self.layers = nn.ModuleList(
            SwinStage(self.num_features[i], depths[i], num_heads[i], window_size, dpr[sum(depths[:i]):sum(depths[:i + 1])],
                      downsample=i < len(depths) - 1)
            for i in range(len(depths))
        )
        for i in self.out_indices:
            self.add_module(f"norm{i}", nn.LayerNorm(self.num_features[i]))
        # the original's classifier backbone leaves its weights to the checkpoint; at random, timm's Swin init
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)

    def forward(self, images: Tensor) -> list[Tensor]:
        x = self.patch_embed(images)
        H, W = x.shape[-2:]
        x = x.flatten(2).transpose(1, 2)
        outs = []
        for i, layer in enumerate(self.layers[: max(self.out_indices) + 1]):
            out, x, h, w = layer(x, H, W)
            if i in self.out_indices:
                out = getattr(self, f"norm{i}")(out)
                outs.append(out.view(-1, H, W, self.num_features[i]).permute(0, 3, 1, 2).contiguous())
            H, W = h, w
        return outs


class DinoSwinBackbone(Backbone):
    """A DINO Swin (``"swin_T_224_1k"``, ``"swin_L_384_22k"``, ...) as a :class:`Backbone`; ``body`` is DINO's
    ``backbone.0``. ``out_indices`` are stages 0-3 (strides 4-32; DINO's ``return_interm_indices``), by
    default the last ``num_levels``. ``freeze_stem`` freezes the patch embedding and stage 0 (DINO
    itself freezes nothing: its configs build with ``freeze_stem=False``); ``frozen_stages=k`` the patch
    embedding and stages 0..k. ``pretrained``: a Swin ImageNet release (``{"model": ...}``, its
    classifier and final norm dropped, as DINO's ``backbone_dir`` loading) or True to download it."""

    def __init__(self, name: str, out_indices: Sequence[int] | None = None, num_levels: int = 3, min_stride: int = 8,
                 pretrained: bool | str | Path | None = None, train_backbone: bool = True, freeze_stem: bool = True,
                 frozen_stages: int | None = None, drop_path_rate: float = 0.2, **sizes: int | Sequence[int]) -> None:
        super().__init__()
        embed_dim, depths, heads, window = DINO_SWIN_NAMES[name]
        spec = {**dict(embed_dim=embed_dim, depths=depths, num_heads=heads, window_size=window), **sizes}
        strides = [4 * 2 ** i for i in range(len(spec["depths"]))]
        indices = select_levels(strides, num_levels, min_stride) if out_indices is None else check_indices(out_indices, strides, name)
        self.body = SwinTransformer(**spec, out_indices=indices, drop_path_rate=drop_path_rate)
        self.channels = [self.body.num_features[i] for i in indices]
        self.strides = [strides[i] for i in indices]
        if pretrained:
            load_swin_release(self.body, name, pretrained)
        last_frozen = frozen_stages if frozen_stages is not None else (0 if freeze_stem else None)
        for pname, p in self.body.named_parameters():
            stage = int(pname.split(".")[1]) if pname.startswith("layers.") else (-1 if pname.startswith("patch_embed.") else None)
            frozen = not train_backbone or (last_frozen is not None and stage is not None and stage <= last_frozen)
            p.requires_grad_(not frozen)

    def forward_maps(self, images: Tensor) -> list[Tensor]:
        return self.body(images)



@register_backbone("dino_swin", names=DINO_SWIN_NAMES, summary="IDEA-Research/DINO's Swin layout",
                   examples={"swin_T_224_1k": dict(embed_dim=32, depths=(1, 1, 1, 1), num_heads=(1, 2, 4, 8), window_size=3)})
def dino_swin_backbone(name: str, *, out_indices: Sequence[int] | None = None, num_levels: int = 3, min_stride: int = 8,
                       pretrained: bool | str | Path | None = None, train_backbone: bool = True, freeze_stem: bool = True,
                       frozen_stages: int | None = None, frozen_bn: bool = True, channels_last: bool = False,
                       dilation: bool = False, **kwargs: Any) -> DinoSwinBackbone:
    """The registry's builder of DINO's Swin names (LayerNorm throughout: ``frozen_bn`` and ``channels_last`` change
    nothing); ``kwargs``: ``drop_path_rate`` and the sizes (``embed_dim``, ``depths``, ``num_heads``, ``window_size``)."""
    if dilation:
        raise ValueError(f"dilation (DC5) is not built for DINO's Swin ({name}); use its stages 1-3 (strides 8-32)")
    return DinoSwinBackbone(name, out_indices=out_indices, num_levels=num_levels, min_stride=min_stride, pretrained=pretrained,
                            train_backbone=train_backbone, freeze_stem=freeze_stem, frozen_stages=frozen_stages, **kwargs)


def load_swin_release(body: SwinTransformer, name: str, pretrained: bool | str | Path) -> None:
    """A Swin ImageNet checkpoint into ``body``: classifier, final norm and precomputed masks dropped
    (DINO loads with ``strict=False``); every stage tensor must be there, the output norms may not."""
    from visiontf.io.weights import load_state_dict_file

    if pretrained is True:
        if name not in RELEASES:
            raise ValueError(f"{name} has no published ImageNet release in DINO's README; pass a local file (one of {sorted(RELEASES)})")
        from visiontf.io.downloads import DownloadError, check_torch_hub_download

        url = RELEASES[name]
        fix = f"Without network, download {url} elsewhere and pass its path."
        check_torch_hub_download(url, f"{name} ImageNet weights", fix)
        try:
            state = torch.hub.load_state_dict_from_url(url, map_location="cpu", weights_only=True)
        except Exception as e:
            raise DownloadError(f"could not download {url} ({type(e).__name__}: {e}). {fix}") from e
        state = state.get("model", state)
    else:
        state = load_state_dict_file(pretrained)
    state = {k: v for k, v in state.items() if not k.startswith(("head.", "norm.")) and not k.endswith(("attn_mask", "num_batches_tracked"))}
    missing, unexpected = body.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.startswith("norm")]
    if missing or unexpected:
        raise RuntimeError(f"{pretrained}: not {name}'s Swin weights: missing {missing[:5]}, unexpected {unexpected[:5]}")
    log.info("%s: loaded %d tensors from %s (output norms at init)", name, len(state), pretrained)
