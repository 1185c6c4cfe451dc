"""visiontf's SETR as it was before it was rebuilt as mmsegmentation's (``git show d173670:visiontf/models/setr.py``),
kept for the tests of loading old checkpoints (``tests/test_setr_legacy_checkpoints.py``).

Our own code, copied unchanged but for this docstring and the end of the original: its registration
(the names are the new SETR's now) is left out, with its bare-ViT filter; ``old_setr`` builds what its
registered ``setr_{decoder}_vit_{size}_patch16`` built, from ``_VARIANTS`` as the original did.
"""
from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from visiontf.registry import create_model, load_pretrained
from visiontf.weights import load_state_dict_file

log = logging.getLogger(__name__)

Decoder = Literal["naive", "pup", "mla"]


def _norm_layer(norm: str) -> type[nn.Module]:
    if norm == "bn":
        return nn.BatchNorm2d
    if norm == "syncbn":
        return nn.SyncBatchNorm
    raise ValueError(f"norm={norm!r}; use 'bn' (one device) or 'syncbn' (DDP, statistics over all GPUs)")


def _conv_norm_relu(cin: int, cout: int, k: int, norm: type[nn.Module], bias: bool) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, k, padding=k // 2, bias=bias), norm(cout), nn.ReLU(inplace=True))


class TokenNorm(nn.Module):
    """LayerNorm over the channels of a (B, C, H, W) token map (the heads' own LN of the original)."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim, eps=eps)

    def forward(self, x: Tensor) -> Tensor:
        return self.norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class UpHead(nn.Module):
    """Naive / PUP head: LN, conv blocks each followed by a bilinear upscale, 1x1 classifier, resize.

    ``scales[i]`` is the upscale after conv block ``i`` (1 = none); the final resize goes to the
    requested output size, so the last 2x of PUP (after its classifier) lands exactly on the input.
    """

    def __init__(self, in_dim: int, channels: int, num_classes: int, kernel_size: int, scales: Sequence[int],
                 norm: type[nn.Module], align_corners: bool = False) -> None:
        super().__init__()
        self.norm = TokenNorm(in_dim)
        # the original convs keep their bias in front of BN; kept so parameter counts match
        self.convs = nn.ModuleList(
            _conv_norm_relu(in_dim if i == 0 else channels, channels, kernel_size, norm, bias=True) for i in range(len(scales))
        )
        self.scales = tuple(int(s) for s in scales)
        self.cls_seg = nn.Conv2d(channels, num_classes, 1)
        self.align_corners = align_corners

    def forward(self, x: Tensor, size: tuple[int, int]) -> Tensor:
        x = self.norm(x)
        for conv, s in zip(self.convs, self.scales):
            x = conv(x)
            if s != 1:
                x = F.interpolate(x, scale_factor=s, mode="bilinear", align_corners=self.align_corners)
        return F.interpolate(self.cls_seg(x), size=size, mode="bilinear", align_corners=self.align_corners)


class MLANeck(nn.Module):
    """Multi-level feature aggregation: per-level LN + 1x1 projection, top-down sums, 3x3 conv."""

    def __init__(self, in_dim: int, channels: int, num_levels: int, norm: type[nn.Module]) -> None:
        super().__init__()
        self.norms = nn.ModuleList(TokenNorm(in_dim) for _ in range(num_levels))
        self.proj = nn.ModuleList(_conv_norm_relu(in_dim, channels, 1, norm, bias=False) for _ in range(num_levels))
        self.smooth = nn.ModuleList(_conv_norm_relu(channels, channels, 3, norm, bias=False) for _ in range(num_levels))

    def forward(self, feats: Sequence[Tensor]) -> list[Tensor]:
        projected = [p(n(f)) for f, n, p in zip(feats, self.norms, self.proj)]
        # deepest level first: each shallower level adds everything above it
        out: list[Tensor] = [None] * len(projected)  # type: ignore[list-item]
        acc = None
        for i in reversed(range(len(projected))):
            acc = projected[i] if acc is None else acc + projected[i]
            out[i] = self.smooth[i](acc)
        return out


class MLAHead(nn.Module):
    """Per stream 2 x (3x3 conv + BN + ReLU) and 4x upscale; concat; 3x3 classifier; resize."""

    def __init__(self, channels: int, head_channels: int, num_classes: int, num_levels: int,
                 norm: type[nn.Module], align_corners: bool = False) -> None:
        super().__init__()
        self.streams = nn.ModuleList(
            nn.Sequential(_conv_norm_relu(channels, head_channels, 3, norm, bias=False),
                          _conv_norm_relu(head_channels, head_channels, 3, norm, bias=False))
            for _ in range(num_levels)
        )
        self.cls_seg = nn.Conv2d(num_levels * head_channels, num_classes, 3, padding=1)
        self.align_corners = align_corners

    def forward(self, feats: Sequence[Tensor], size: tuple[int, int]) -> Tensor:
        # the original's 4x upscale inside the MLA head uses align_corners=True
        x = torch.cat([F.interpolate(s(f), scale_factor=4, mode="bilinear", align_corners=True)
                       for f, s in zip(feats, self.streams)], dim=1)
        return F.interpolate(self.cls_seg(x), size=size, mode="bilinear", align_corners=self.align_corners)


class MLAAuxHead(nn.Module):
    """One MLA stream -> classes with a bias-free 1x1 conv, resized to the input."""

    def __init__(self, channels: int, num_classes: int, align_corners: bool = False) -> None:
        super().__init__()
        self.cls_seg = nn.Conv2d(channels, num_classes, 1, bias=False)
        self.align_corners = align_corners

    def forward(self, x: Tensor, size: tuple[int, int]) -> Tensor:
        return F.interpolate(self.cls_seg(x), size=size, mode="bilinear", align_corners=self.align_corners)


def default_indices(depth: int, decoder: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(main, auxiliary) 0-based block indices as the paper's configs for a ``depth``-block encoder."""
    if depth == 24:  # ViT-L: aux on blocks 10/15/20(/24), MLA on 6/12/18/24
        mla, aux = (5, 11, 17, 23), (9, 14, 19)
    elif depth % 4 == 0:  # ViT-B (12): aux on 3/6/9(/12), MLA on 3/6/9/12
        q = depth // 4
        mla, aux = (q - 1, 2 * q - 1, 3 * q - 1, depth - 1), (q - 1, 2 * q - 1, 3 * q - 1)
    else:
        raise ValueError(f"no default taps for a {depth}-block encoder; pass out_indices and aux_indices")
    if decoder == "mla":
        return mla, mla
    if decoder == "pup":
        return (depth - 1,), aux + (depth - 1,)
    return (depth - 1,), aux


class SETR(nn.Module):
    """SEgmentation TRansformer. ``forward(images)`` -> logits (B, K, H, W) at the input size.

    In training mode it returns ``{"out": logits, "aux": [logits, ...]}``; ``aux_weight`` is kept
    for the task's loss. ``out_indices``: tapped blocks (0-based) of the main decoder: one block for
    Naive/PUP, four for MLA; ``aux_indices``: blocks of the Naive/PUP auxiliary heads (MLA's aux
    heads sit on its streams). ``encoder_pretrained``: a timm or visiontf ViT checkpoint file; its
    classifier and final norm are dropped and ``pos_embed`` is resampled to the crop grid.
    """

    #: keys the registry's loader may leave at init or drop when the class count differs
    head_prefixes = ("decode_head.", "aux_heads.", "neck.")
    #: parameters trained at the base learning rate (the rest get the head multiplier); the MLA neck
    #: is here because the original code (and mmseg) kept it outside the "head" lr_mult key
    backbone_prefixes = ("encoder.", "neck.")

    def __init__(
        self,
        num_classes: int,
        encoder: str = "vit_large_patch16_384",
        img_size: int = 512,
        decoder: Decoder = "naive",
        out_indices: Sequence[int] | None = None,
        aux_indices: Sequence[int] | None = None,
        channels: int = 256,
        mla_channels: int = 256,
        mla_head_channels: int = 128,
        aux_weight: float = 0.4,
        norm: Literal["bn", "syncbn"] = "bn",
        encoder_pretrained: str | Path | None = None,
        drop_path_rate: float = 0.1,
        align_corners: bool = False,
        encoder_kwargs: dict | None = None,
    ) -> None:
        super().__init__()
        if decoder not in ("naive", "pup", "mla"):
            raise ValueError(f"decoder={decoder!r}; use 'naive', 'pup' or 'mla'")
        if num_classes < 1:
            raise ValueError(f"num_classes={num_classes}; a segmentation model needs at least one class")
        self.num_classes = num_classes
        self.decoder = decoder
        self.aux_weight = aux_weight
        self.align_corners = align_corners
        self.encoder = create_model(encoder, num_classes=0, img_size=img_size, drop_path_rate=drop_path_rate,
                                    norm_eps=1e-6, **(encoder_kwargs or {}))
        # every head normalises its own taps (as the original); the encoder's final LN would be unused
        self.encoder.norm = nn.Identity()
        dim, depth = self.encoder.embed_dim, len(self.encoder.blocks)
        need_defaults = out_indices is None or (aux_indices is None and decoder != "mla")
        main_default, aux_default = default_indices(depth, decoder) if need_defaults else ((), ())
        self.out_indices = tuple(int(i) % depth for i in (out_indices if out_indices is not None else main_default))
        aux = aux_indices if aux_indices is not None else aux_default
        self.aux_indices = tuple(int(i) % depth for i in aux) if decoder != "mla" else ()
        if decoder == "mla" and len(self.out_indices) < 2:
            raise ValueError(f"MLA needs several tapped blocks, got out_indices={self.out_indices}")
        if decoder != "mla" and len(self.out_indices) != 1:
            raise ValueError(f"{decoder} decodes one block; got out_indices={self.out_indices} (use aux_indices for the others)")

        norm_layer = _norm_layer(norm)
        if decoder == "naive":
            self.decode_head = UpHead(dim, channels, num_classes, 1, (1,), norm_layer, align_corners)
            self.aux_heads = nn.ModuleList(UpHead(dim, channels, num_classes, 1, (1,), norm_layer, align_corners)
                                           for _ in self.aux_indices)
        elif decoder == "pup":
            ups = int(round(math.log2(self.encoder.patch_embed.patch_size[0])))
            # four 3x3 blocks for a 16-px patch: 2x after each but the last, whose 2x follows the classifier
            scales = (2,) * (ups - 1) + (1,)
            self.decode_head = UpHead(dim, channels, num_classes, 3, scales, norm_layer, align_corners)
            self.aux_heads = nn.ModuleList(UpHead(dim, channels, num_classes, 3, (4,), norm_layer, align_corners)
                                           for _ in self.aux_indices)
        else:
            n = len(self.out_indices)
            self.neck = MLANeck(dim, mla_channels, n, norm_layer)
            self.decode_head = MLAHead(mla_channels, mla_head_channels, num_classes, n, norm_layer, align_corners)
            self.aux_heads = nn.ModuleList(MLAAuxHead(mla_channels, num_classes, align_corners) for _ in range(n))
        self.patch_size = self.encoder.patch_embed.patch_size
        crop = self.encoder.patch_embed.img_size
        self.pretrained_cfg = {
            "input_size": (3, *crop),
            "crop_size": crop,
            "mean": self.encoder.pretrained_cfg["mean"],
            "std": self.encoder.pretrained_cfg["std"],
            "interpolation": "bilinear",
        }
        if encoder_pretrained:
            self.load_encoder(encoder_pretrained)

    # ------------------------------------------------------------------ weights
    def load_encoder(self, path: str | Path) -> None:
        """Initialise the encoder from a timm / visiontf ViT checkpoint (classifier and final norm dropped)."""
        state = load_state_dict_file(path)
        if not any(k.startswith("blocks.") for k in state) and any(k.startswith("encoder.blocks.") for k in state):
            state = {k[len("encoder."):]: v for k, v in state.items() if k.startswith("encoder.")}
        state, dropped = _encoder_state(state)
        if dropped:
            log.info("%s: %d classifier / final-norm tensors not used by SETR's encoder: %s", path, len(dropped), ", ".join(dropped))
        load_pretrained(self.encoder, state, strict=True, source=str(path))

    # ------------------------------------------------------------------ forward
    def _features(self, images: Tensor, with_aux: bool) -> tuple[dict[int, Tensor], tuple[int, int]]:
        wanted = sorted(set(self.out_indices) | (set(self.aux_indices) if with_aux else set()))
        feats = self.encoder.forward_intermediates(images, wanted, norm=False)
        return dict(zip(wanted, feats)), (images.shape[-2], images.shape[-1])

    def _decode(self, images: Tensor, with_aux: bool) -> tuple[Tensor, list[Tensor]]:
        feats, size = self._features(images, with_aux)
        if self.decoder == "mla":
            streams = self.neck([feats[i] for i in self.out_indices])
            out = self.decode_head(streams, size)
            aux = [h(s, size) for h, s in zip(self.aux_heads, streams)] if with_aux else []
        else:
            out = self.decode_head(feats[self.out_indices[0]], size)
            aux = [h(feats[i], size) for h, i in zip(self.aux_heads, self.aux_indices)] if with_aux else []
        return out, aux

    def forward(self, images: Tensor) -> Tensor | dict[str, Tensor | list[Tensor]]:
        if self.training:
            out, aux = self._decode(images, with_aux=True)
            return {"out": out, "aux": aux}
        return self._decode(images, with_aux=False)[0]

    # ------------------------------------------------------------------ inference
    def _pad_to(self, images: Tensor, h: int, w: int) -> Tensor:
        # zero in normalised space is the dataset mean: the least surprising filler
        return F.pad(images, (0, w - images.shape[-1], 0, h - images.shape[-2]))

    def whole_inference(self, images: Tensor) -> Tensor:
        """Logits of the whole image at once (padded up to a multiple of the patch size, then cropped)."""
        H, W = images.shape[-2:]
        ph, pw = self.patch_size
        padded = self._pad_to(images, -(-H // ph) * ph, -(-W // pw) * pw)
        return self._decode(padded, with_aux=False)[0][..., :H, :W]

    def slide_inference(self, images: Tensor, num_classes: int | None = None, crop: int | Sequence[int] = 512,
                        stride: int | Sequence[int] = 341) -> Tensor:
        """mmseg's sliding window: crops covering the image, logits summed and divided by the overlap count.

        Windows are placed every ``stride`` pixels and the last one is shifted back to end at the
        border. An image smaller than ``crop`` is padded (bottom/right) to one full window.
        """
        num_classes = num_classes or self.num_classes
        ch, cw = (crop, crop) if isinstance(crop, int) else crop
        sh, sw = (stride, stride) if isinstance(stride, int) else stride
        B, _, H, W = images.shape
        if H < ch or W < cw:
            padded = self._pad_to(images, max(H, ch), max(W, cw))
            return self.slide_inference(padded, num_classes, (ch, cw), (sh, sw))[..., :H, :W]
        rows = max(H - ch + sh - 1, 0) // sh + 1
        cols = max(W - cw + sw - 1, 0) // sw + 1
        logits = images.new_zeros((B, num_classes, H, W))
        count = images.new_zeros((1, 1, H, W))
        for r in range(rows):
            for c in range(cols):
                y2, x2 = min(r * sh + ch, H), min(c * sw + cw, W)
                y1, x1 = max(y2 - ch, 0), max(x2 - cw, 0)
                logits[:, :, y1:y2, x1:x2] += self.whole_inference(images[:, :, y1:y2, x1:x2])
                count[:, :, y1:y2, x1:x2] += 1
        return logits / count

    def inference(self, images: Tensor, mode: Literal["whole", "slide"] = "whole", crop: int | Sequence[int] | None = None,
                  stride: int | Sequence[int] | None = None) -> Tensor:
        """Main-head logits at the input size; ``crop`` defaults to the model's crop, ``stride`` to 2/3 of it."""
        if mode == "whole":
            return self.whole_inference(images)
        if mode != "slide":
            raise ValueError(f"inference mode {mode!r}; use 'whole' or 'slide'")
        crop = crop or self.pretrained_cfg["crop_size"]
        if stride is None:
            c = (crop, crop) if isinstance(crop, int) else tuple(crop)
            stride = tuple(max(1, (2 * x) // 3) for x in c)
        return self.slide_inference(images, self.num_classes, crop, stride)


def _encoder_state(state: dict[str, Tensor]) -> tuple[dict[str, Tensor], list[str]]:
    """Drop what a classification ViT has and SETR's encoder does not: heads and the final norm."""
    drop = ("head.", "head_dist.", "norm.", "fc_norm.", "pre_logits.")
    kept = {k: v for k, v in state.items() if not k.startswith(drop)}
    return kept, sorted(set(state) - set(kept))


_VARIANTS = {
    "large": ("vit_large_patch16_384", 512, {}),
    "base": ("vit_base_patch16_384", 512, {}),
    # CPU-sized: the real ViT-Ti/16 (so timm's vit_tiny weights load) with narrow heads at 64-128 px
    "tiny": ("vit_tiny_patch16_224", 128, {"channels": 64, "mla_channels": 64, "mla_head_channels": 32}),
}


def old_setr(decoder: str, size: str = "tiny", num_classes: int = 150, **kwargs) -> SETR:
    """What ``create_model(f"setr_{decoder}_vit_{size}_patch16", **kwargs)`` built before the mmseg rework."""
    encoder, img, defaults = _VARIANTS[size]
    return SETR(num_classes, **{"encoder": encoder, "img_size": img, "decoder": decoder, **defaults, **kwargs})
