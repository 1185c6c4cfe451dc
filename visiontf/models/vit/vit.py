"""Vision Transformer (ViT) and DeiT, with timm's exact state-dict layout.

``model.load_state_dict(timm_model.state_dict())`` works and gives timm's logits; a checkpoint
made at another image size has its ``pos_embed`` resampled bicubically on load.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.data import IMAGENET_INCEPTION_MEAN as INCEPTION_MEAN
from timm.data import IMAGENET_INCEPTION_STD as INCEPTION_STD
from torch import Tensor, nn

from visiontf.models._registry import list_models, register_model
from visiontf.models.contract import Classifier, ModelCfg, PretrainedCfg
from visiontf.models.vit.build import build_vit, vit_variant
from visiontf.models.vit.features import features_only
from visiontf.models.vit.timm_api import TimmViTApi
from visiontf.nn import TransformerEncoderLayer, resample_pos_embed
from visiontf.nn.patch_embed import PatchEmbed


def merge_distilled(out: Tensor | tuple[Tensor, Tensor]) -> Tensor:
    """DeiT's inference output: the mean of the class and distillation heads, (B, K) from two (B, K).

    A plain tensor (a model without a distillation head, or one already in eval mode) passes through,
    so consumers of any ViT's output call this once instead of checking for the training form.
    """
    if isinstance(out, (tuple, list)):
        return (out[0] + out[1]) / 2
    return out


class VisionTransformer(TimmViTApi, Classifier):
    """ViT / DeiT classifier. ``num_classes=0`` gives a feature extractor (identity head).

    ``pretrained_cfg``: eval settings over the ViT defaults (Inception mean/std, crop 0.9, bicubic,
    ``input_size`` from ``img_size``); the registry gives each variant's (DeiT: ImageNet mean/std, 0.875).

    ``dynamic_img_size`` (default True here, False in timm): an input of another size gets ``pos_embed``
    resampled to its grid on the fly (timm's ``dynamic_img_size=True`` arithmetic); False refuses any
    size but ``img_size``, as timm's default. ``dynamic_img_pad``: pad the image bottom/right to a
    multiple of the patch instead of refusing it (timm's). The rest of timm's ViT API
    (``forward_intermediates``, ``set_input_size``, ``features_only``) is
    :class:`~visiontf.models.vit.timm_api.TimmViTApi`.
    """

    head_prefixes = ("head.", "head_dist.")

    def __init__(
        self,
        img_size: int | tuple[int, int] = 224,
        patch_size: int = 16,
        in_chans: int = 3,
        num_classes: int = 1000,
        embed_dim: int = 768,
        depth: int = 12,
        num_heads: int = 12,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        drop_rate: float = 0.0,
        pos_drop_rate: float = 0.0,
        attn_drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        distilled: bool = False,
        norm_eps: float = 1e-6,
        patch_bias: bool = True,
        dynamic_img_size: bool = True,
        dynamic_img_pad: bool = False,
        pretrained_cfg: PretrainedCfg | Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.dynamic_img_size = dynamic_img_size
        self.embed_dim = self.num_features = embed_dim
        self.distilled = distilled
        self.num_prefix_tokens = 2 if distilled else 1
        # mmsegmentation 1.x's ViT has no patch-embedding bias (SETR's layout); timm's has one
        self.patch_embed = PatchEmbed(img_size, patch_size, in_chans, embed_dim, bias=patch_bias, dynamic_img_pad=dynamic_img_pad)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self.dist_token = nn.Parameter(torch.zeros(1, 1, embed_dim)) if distilled else None
        num_patches = self.patch_embed.grid_size[0] * self.patch_embed.grid_size[1]
        self.pos_embed = nn.Parameter(torch.zeros(1, num_patches + self.num_prefix_tokens, embed_dim))
        self.pos_drop = nn.Dropout(pos_drop_rate)
        # on the CPU explicitly: the rates are Python floats even when built under torch.device("meta")
        dpr = torch.linspace(0, drop_path_rate, depth, device="cpu").tolist()
        self.blocks = nn.ModuleList(
            TransformerEncoderLayer(
                embed_dim, num_heads, int(embed_dim * mlp_ratio), dropout=drop_rate, attn_drop=attn_drop_rate,
                drop_path=dpr[i], norm_first=True, qkv_bias=qkv_bias, norm_eps=norm_eps,
            )
            for i in range(depth)
        )
        self.norm = nn.LayerNorm(embed_dim, eps=norm_eps)
        self.head_drop = nn.Dropout(drop_rate)
        self.head = nn.Linear(embed_dim, num_classes) if num_classes > 0 else nn.Identity()
        self.head_dist = (nn.Linear(embed_dim, num_classes) if num_classes > 0 else nn.Identity()) if distilled else None
        #: with a distillation token, training returns (class logits, distillation logits)
        self.distilled_training = distilled
        self.pretrained_cfg = PretrainedCfg(
            input_size=(in_chans, *self.patch_embed.img_size), mean=INCEPTION_MEAN, std=INCEPTION_STD, crop_pct=0.9,
            interpolation="bicubic",
        ).merged(pretrained_cfg)
        self._init_weights()
        self._register_load_state_dict_pre_hook(self._resample_pos_embed_on_load)

    def _init_weights(self) -> None:
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        nn.init.normal_(self.cls_token, std=1e-6)
        if self.dist_token is not None:
            nn.init.trunc_normal_(self.dist_token, std=0.02)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)

    def _resample_pos_embed_on_load(self, state_dict, prefix, *args) -> None:
        key = prefix + "pos_embed"
        if key in state_dict and state_dict[key].shape != self.pos_embed.shape:
            old = state_dict[key]
            n = old.shape[1] - self.num_prefix_tokens
            side = int(math.isqrt(n))
            if side * side != n:
                raise ValueError(f"pos_embed with {n} grid tokens is not square; cannot infer its grid")
            state_dict[key] = resample_pos_embed(old, (side, side), self.patch_embed.grid_size, self.num_prefix_tokens)

    @property
    def grid_size(self) -> tuple[int, int]:
        return self.patch_embed.grid_size

    def _embed(self, x: Tensor) -> tuple[Tensor, tuple[int, int]]:
        if not self.dynamic_img_size and tuple(x.shape[-2:]) != self.patch_embed.img_size:
            raise ValueError(
                f"input {x.shape[-2]}x{x.shape[-1]} differs from img_size {self.patch_embed.img_size} of a ViT built with "
                "dynamic_img_size=False; build it with dynamic_img_size=True (position table resampled per input) or "
                "call set_input_size()"
            )
        x, grid = self.patch_embed(x)
        prefix = [self.cls_token.expand(x.shape[0], -1, -1)]
        if self.dist_token is not None:
            prefix.append(self.dist_token.expand(x.shape[0], -1, -1))
        x = torch.cat(prefix + [x], dim=1)
        # other input sizes (sliding windows, larger crops) get a resampled table on the fly
        x = x + resample_pos_embed(self.pos_embed, self.patch_embed.grid_size, grid, self.num_prefix_tokens)
        return self.pos_drop(x), grid

    def input_size_error(self, size: tuple[int, int]) -> str | None:
        """Why the ViT cannot take ``size`` (H, W): another size than ``img_size`` without ``dynamic_img_size``, or
        one its patches do not divide without ``dynamic_img_pad``; None when it can."""
        size = (int(size[0]), int(size[1]))
        if not self.dynamic_img_size and size != tuple(self.patch_embed.img_size):
            return f"this ViT takes only {self.patch_embed.img_size[0]}x{self.patch_embed.img_size[1]} (built with dynamic_img_size=False)"
        (ph, pw) = self.patch_embed.patch_size
        if not self.patch_embed.dynamic_img_pad and (size[0] % ph or size[1] % pw):
            return (f"this ViT's {ph}x{pw} patches do not divide {size[0]}x{size[1]}; a multiple of the patch, e.g. "
                    f"{max(ph, round(size[0] / ph) * ph)}x{max(pw, round(size[1] / pw) * pw)}")
        return None

    def forward_features(self, x: Tensor) -> Tensor:
        """Normalised tokens (B, prefix + H*W, C)."""
        x, _ = self._embed(x)
        for blk in self.blocks:
            x = blk(x)[0]
        return self.norm(x)

    def forward_head(self, x: Tensor, pre_logits: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """Tokens (B, prefix + N, D) -> logits (B, K) (``pre_logits``: the (B, D) features they come from)."""
        if self.dist_token is None:
            x = self.head_drop(x[:, 0])
            return x if pre_logits else self.head(x)
        x, x_dist = self.head_drop(x[:, 0]), self.head_drop(x[:, 1])
        if pre_logits:
            return merge_distilled((x, x_dist))
        x, x_dist = self.head(x), self.head_dist(x_dist)
        if self.distilled_training and self.training:
            return x, x_dist
        return merge_distilled((x, x_dist))

    def forward(self, x: Tensor) -> Tensor | tuple[Tensor, Tensor]:
        """Images (B, 3, H, W), normalised -> logits (B, K).

        A distilled model in training with ``distilled_training`` returns (class logits, distillation
        logits), both (B, K); :func:`merge_distilled` turns that into the inference output.
        """
        return self.forward_head(self.forward_features(x))

    def forward_attention(self, x: Tensor) -> list[Tensor]:
        """Head-averaged self-attention weights (B, N, N) of every block (for attention rollout)."""
        x, _ = self._embed(x)
        maps = []
        for blk in self.blocks:
            x, attn = blk(x, need_weights=True)
            maps.append(attn)
        return maps

    # ------------------------------------------------------------------ optimiser knowledge (timm's)
    def no_weight_decay(self) -> set[str]:
        """Parameter names trained without weight decay besides biases and norms (timm's set)."""
        return {"pos_embed", "cls_token"} | ({"dist_token"} if self.dist_token is not None else set())

    def param_group(self, name: str) -> str:
        """The learning-rate group of a parameter: one group for the whole ViT."""
        return "default"

    def reset_classifier(self, num_classes: int) -> None:
        self.num_classes = num_classes
        self.head = nn.Linear(self.embed_dim, num_classes) if num_classes > 0 else nn.Identity()
        if self.head_dist is not None:
            self.head_dist = nn.Linear(self.embed_dim, num_classes) if num_classes > 0 else nn.Identity()


#: DeiT was trained with ImageNet statistics (ViT's augreg weights use Inception's, the class default)
_DEIT = dict(mean=IMAGENET_DEFAULT_MEAN, std=IMAGENET_DEFAULT_STD, crop_pct=0.875)
_vit = vit_variant
_TAGS = ("classification", "vit")

#: every registered ViT / DeiT variant (384-px models are evaluated without a crop margin, as timm's)
DEFAULT_CFGS: dict[str, ModelCfg] = {
    "vit_tiny_patch16_224": _vit("vit_tiny_patch16_224.augreg_in21k_ft_in1k", "tiny", 16, 224),
    "vit_tiny_patch16_384": _vit("vit_tiny_patch16_384.augreg_in21k_ft_in1k", "tiny", 16, 384, crop_pct=1.0),
    "vit_small_patch16_224": _vit("vit_small_patch16_224.augreg_in21k_ft_in1k", "small", 16, 224),
    "vit_small_patch16_384": _vit("vit_small_patch16_384.augreg_in21k_ft_in1k", "small", 16, 384, crop_pct=1.0),
    "vit_base_patch16_224": _vit("vit_base_patch16_224.augreg_in21k_ft_in1k", "base", 16, 224),
    "vit_base_patch16_384": _vit("vit_base_patch16_384.augreg_in21k_ft_in1k", "base", 16, 384, crop_pct=1.0),
    "vit_large_patch16_224": _vit("vit_large_patch16_224.augreg_in21k_ft_in1k", "large", 16, 224),
    "vit_large_patch16_384": _vit("vit_large_patch16_384.augreg_in21k_ft_in1k", "large", 16, 384, crop_pct=1.0),
    "vit_base_patch32_224": _vit("vit_base_patch32_224.augreg_in21k_ft_in1k", "base", 32, 224),
    "vit_base_patch32_384": _vit("vit_base_patch32_384.augreg_in21k_ft_in1k", "base", 32, 384, crop_pct=1.0),
    "vit_large_patch32_224": _vit("vit_large_patch32_224.orig_in21k_ft_in1k", "large", 32, 224),
    "vit_large_patch32_384": _vit("vit_large_patch32_384.orig_in21k_ft_in1k", "large", 32, 384, crop_pct=1.0),
    "deit_tiny_patch16_224": _vit("deit_tiny_patch16_224", "tiny", 16, 224, **_DEIT),
    "deit_tiny_distilled_patch16_224": _vit("deit_tiny_distilled_patch16_224", "tiny", 16, 224, distilled=True, **_DEIT),
    "deit_small_patch16_224": _vit("deit_small_patch16_224", "small", 16, 224, **_DEIT),
    "deit_small_distilled_patch16_224": _vit("deit_small_distilled_patch16_224", "small", 16, 224, distilled=True, **_DEIT),
    "deit_base_patch16_224": _vit("deit_base_patch16_224", "base", 16, 224, **_DEIT),
    "deit_base_distilled_patch16_224": _vit("deit_base_distilled_patch16_224", "base", 16, 224, distilled=True, **_DEIT),
    "deit_base_patch16_384": _vit("deit_base_patch16_384", "base", 16, 384, **{**_DEIT, "crop_pct": 1.0}),
    "deit_base_distilled_patch16_384": _vit("deit_base_distilled_patch16_384", "base", 16, 384, distilled=True, **{**_DEIT, "crop_pct": 1.0}),
}


#: the registry-wide test's settings: two narrow blocks on 32-px images (tests/models/test_registry.py)
_TEST = dict(test_kwargs=dict(embed_dim=32, depth=2, num_heads=2), test_image_size=(32, 32))


def _create(name: str, **kwargs) -> VisionTransformer:
    return build_vit(VisionTransformer, DEFAULT_CFGS[name], **kwargs)


def _timm_weights(name: str) -> Callable[[], dict]:
    """Fetch ``name``'s published weights through timm's own download code (a clear error offline)."""

    def fetch() -> dict:
        import contextlib

        import timm

        from visiontf.io.downloads import HF_HOST, DownloadError, hf_hub_offline, network_problem

        timm_name = DEFAULT_CFGS[name].pretrained_cfg.hf_hub_id
        # offline, the hub client would wait through its retries; in offline mode it reads its cache or fails at once
        problem = network_problem(f"https://{HF_HOST}")
        try:
            with hf_hub_offline() if problem else contextlib.nullcontext():
                return timm.create_model(timm_name, pretrained=True).state_dict()
        except Exception as e:
            reason = f"{problem}; not in the local cache either" if problem else f"{type(e).__name__}: {e}"
            raise DownloadError(
                f"could not download {timm_name} through timm ({reason}). Without network, save "
                f"timm.create_model('{timm_name}', pretrained=True).state_dict() elsewhere (safetensors) and pass pretrained=PATH."
            ) from e

    return fetch


@register_model(fetch_pretrained=_timm_weights("vit_tiny_patch16_224"), tags=_TAGS, features_fn=features_only, **_TEST)
def vit_tiny_patch16_224(**kwargs) -> VisionTransformer:
    """ViT-tiny/16 at 224 px."""
    return _create("vit_tiny_patch16_224", **kwargs)


@register_model(fetch_pretrained=_timm_weights("vit_tiny_patch16_384"), tags=_TAGS, features_fn=features_only, **_TEST)
def vit_tiny_patch16_384(**kwargs) -> VisionTransformer:
    """ViT-tiny/16 at 384 px."""
    return _create("vit_tiny_patch16_384", **kwargs)


@register_model(fetch_pretrained=_timm_weights("vit_small_patch16_224"), tags=_TAGS, features_fn=features_only, **_TEST)
def vit_small_patch16_224(**kwargs) -> VisionTransformer:
    """ViT-small/16 at 224 px."""
    return _create("vit_small_patch16_224", **kwargs)


@register_model(fetch_pretrained=_timm_weights("vit_small_patch16_384"), tags=_TAGS, features_fn=features_only, **_TEST)
def vit_small_patch16_384(**kwargs) -> VisionTransformer:
    """ViT-small/16 at 384 px."""
    return _create("vit_small_patch16_384", **kwargs)


@register_model(fetch_pretrained=_timm_weights("vit_base_patch16_224"), tags=_TAGS, features_fn=features_only, **_TEST)
def vit_base_patch16_224(**kwargs) -> VisionTransformer:
    """ViT-base/16 at 224 px."""
    return _create("vit_base_patch16_224", **kwargs)


@register_model(fetch_pretrained=_timm_weights("vit_base_patch16_384"), tags=_TAGS, features_fn=features_only, **_TEST)
def vit_base_patch16_384(**kwargs) -> VisionTransformer:
    """ViT-base/16 at 384 px."""
    return _create("vit_base_patch16_384", **kwargs)


@register_model(fetch_pretrained=_timm_weights("vit_large_patch16_224"), tags=_TAGS, features_fn=features_only, **_TEST)
def vit_large_patch16_224(**kwargs) -> VisionTransformer:
    """ViT-large/16 at 224 px."""
    return _create("vit_large_patch16_224", **kwargs)


@register_model(fetch_pretrained=_timm_weights("vit_large_patch16_384"), tags=_TAGS, features_fn=features_only, **_TEST)
def vit_large_patch16_384(**kwargs) -> VisionTransformer:
    """ViT-large/16 at 384 px."""
    return _create("vit_large_patch16_384", **kwargs)


@register_model(fetch_pretrained=_timm_weights("vit_base_patch32_224"), tags=_TAGS, features_fn=features_only, **_TEST)
def vit_base_patch32_224(**kwargs) -> VisionTransformer:
    """ViT-base/32 at 224 px."""
    return _create("vit_base_patch32_224", **kwargs)


@register_model(fetch_pretrained=_timm_weights("vit_base_patch32_384"), tags=_TAGS, features_fn=features_only, **_TEST)
def vit_base_patch32_384(**kwargs) -> VisionTransformer:
    """ViT-base/32 at 384 px."""
    return _create("vit_base_patch32_384", **kwargs)


@register_model(fetch_pretrained=_timm_weights("vit_large_patch32_224"), tags=_TAGS, features_fn=features_only, **_TEST)
def vit_large_patch32_224(**kwargs) -> VisionTransformer:
    """ViT-large/32 at 224 px."""
    return _create("vit_large_patch32_224", **kwargs)


@register_model(fetch_pretrained=_timm_weights("vit_large_patch32_384"), tags=_TAGS, features_fn=features_only, **_TEST)
def vit_large_patch32_384(**kwargs) -> VisionTransformer:
    """ViT-large/32 at 384 px."""
    return _create("vit_large_patch32_384", **kwargs)


@register_model(fetch_pretrained=_timm_weights("deit_tiny_patch16_224"), tags=_TAGS, features_fn=features_only, **_TEST)
def deit_tiny_patch16_224(**kwargs) -> VisionTransformer:
    """DeiT-tiny/16 at 224 px."""
    return _create("deit_tiny_patch16_224", **kwargs)


@register_model(fetch_pretrained=_timm_weights("deit_tiny_distilled_patch16_224"), tags=_TAGS, features_fn=features_only, **_TEST)
def deit_tiny_distilled_patch16_224(**kwargs) -> VisionTransformer:
    """DeiT-tiny/16 at 224 px, with a distillation token and head."""
    return _create("deit_tiny_distilled_patch16_224", **kwargs)


@register_model(fetch_pretrained=_timm_weights("deit_small_patch16_224"), tags=_TAGS, features_fn=features_only, **_TEST)
def deit_small_patch16_224(**kwargs) -> VisionTransformer:
    """DeiT-small/16 at 224 px."""
    return _create("deit_small_patch16_224", **kwargs)


@register_model(fetch_pretrained=_timm_weights("deit_small_distilled_patch16_224"), tags=_TAGS, features_fn=features_only, **_TEST)
def deit_small_distilled_patch16_224(**kwargs) -> VisionTransformer:
    """DeiT-small/16 at 224 px, with a distillation token and head."""
    return _create("deit_small_distilled_patch16_224", **kwargs)


@register_model(fetch_pretrained=_timm_weights("deit_base_patch16_224"), tags=_TAGS, features_fn=features_only, **_TEST)
def deit_base_patch16_224(**kwargs) -> VisionTransformer:
    """DeiT-base/16 at 224 px."""
    return _create("deit_base_patch16_224", **kwargs)


@register_model(fetch_pretrained=_timm_weights("deit_base_distilled_patch16_224"), tags=_TAGS, features_fn=features_only, **_TEST)
def deit_base_distilled_patch16_224(**kwargs) -> VisionTransformer:
    """DeiT-base/16 at 224 px, with a distillation token and head."""
    return _create("deit_base_distilled_patch16_224", **kwargs)


@register_model(fetch_pretrained=_timm_weights("deit_base_patch16_384"), tags=_TAGS, features_fn=features_only, **_TEST)
def deit_base_patch16_384(**kwargs) -> VisionTransformer:
    """DeiT-base/16 at 384 px."""
    return _create("deit_base_patch16_384", **kwargs)


@register_model(fetch_pretrained=_timm_weights("deit_base_distilled_patch16_384"), tags=_TAGS, features_fn=features_only, **_TEST)
def deit_base_distilled_patch16_384(**kwargs) -> VisionTransformer:
    """DeiT-base/16 at 384 px, with a distillation token and head."""
    return _create("deit_base_distilled_patch16_384", **kwargs)


def visiontf_vits() -> list[str]:
    """The registered visiontf ViT / DeiT names (what ``backbone="vit_..."`` and ``"simplefpn:vit_..."`` take)."""
    return list_models("vit_*") + list_models("deit_*")
