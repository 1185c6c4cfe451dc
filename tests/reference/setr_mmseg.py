"""mmsegmentation 1.x's SETR (ViT-L Naive / PUP / MLA), written again in plain torch as an oracle at full width.

mmsegmentation's own outputs are recorded at toy width in ``tests/fixtures/setr`` (``scripts/fixtures/make_setr.py``
runs mmseg installed in a separate environment); this module is the project's own re-creation for what those
fixtures cannot hold: full ViT-L logits (``scripts/experiments/setr_mmseg_parity.py``, the slow test) and mmseg-layout
files of other widths. :func:`build_setr` builds the ``EncoderDecoder`` of the ``setr_vit-l_{naive,pup,mla}``
ADE20K 512 and Cityscapes 768 configs with mmseg's module tree and semantics:

* mmcv's ``ConvModule`` (conv without bias, BN, ReLU; keys ``conv``, ``bn``), mmseg's size-based
  ``Upsample`` and its ``resize``;
* mmseg's ``VisionTransformer``: ``PatchEmbed`` with ``padding="corner"`` (``projection``, no bias in
  1.x), pre-norm layers ``ln1 / attn.attn (nn.MultiheadAttention, fused in_proj) / ln2 / ffn.layers.0.0,
  ffn.layers.1``, ``pos_embed`` resized with ``interpolate_mode`` only when the token count differs,
  ``with_cls_token`` (False: the class token is dropped before the first layer), ``out_indices``,
  ``final_norm=False``;
* ``SETRUPHead`` (its own LayerNorm), ``SETRMLAHead``, ``FCNHead(num_convs=0)``, ``MLANeck``
  (``norm``, ``mla.channel_proj``, ``mla.feat_extract``, outputs deepest level first);
* ``EncoderDecoder.encode_decode`` (logits resized to the input) and its whole / slide inference
  (windows every ``stride``, the last shifted back, sums padded into place, divided by ``count_mat``).

Its ``state_dict()`` has the key layout of mmseg's published checkpoints (``tests/fixtures/setr/
mmseg_setr_state_dicts.txt``, printed from mmseg 1.2.2, is checked key for key in
``tests/models/setr/test_setr_mmseg.py``).
"""
from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def resize(x: Tensor, size: Sequence[int], mode: str = "bilinear", align_corners: bool | None = False) -> Tensor:
    """mmseg's ``resize`` (a thin ``F.interpolate``)."""
    return F.interpolate(x, size=tuple(int(s) for s in size), mode=mode, align_corners=align_corners)


class ConvModule(nn.Module):
    """mmcv's ``ConvModule`` with ``norm_cfg=BN/SyncBN`` and ``act_cfg=ReLU``: the conv has no bias."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, padding: int = 0) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=padding, bias=False)
        self.bn = nn.BatchNorm2d(out_channels)
        self.activate = nn.ReLU(inplace=True)

    def forward(self, x: Tensor) -> Tensor:
        return self.activate(self.bn(self.conv(x)))


class Upsample(nn.Module):
    """mmseg's ``Upsample``: the output size is ``int(side * scale_factor)``, then ``resize``."""

    def __init__(self, scale_factor: float, mode: str = "bilinear", align_corners: bool = False) -> None:
        super().__init__()
        self.scale_factor = float(scale_factor)
        self.mode = mode
        self.align_corners = align_corners

    def forward(self, x: Tensor) -> Tensor:
        return resize(x, [int(t * self.scale_factor) for t in x.shape[-2:]], self.mode, self.align_corners)


# ---------------------------------------------------------------------------------------- backbone
class PatchEmbed(nn.Module):
    """mmseg's ``PatchEmbed(padding="corner")``: zero-pad bottom/right to the kernel, strided conv."""

    def __init__(self, in_channels: int, embed_dims: int, patch_size: int, bias: bool) -> None:
        super().__init__()
        self.patch_size = patch_size
        self.projection = nn.Conv2d(in_channels, embed_dims, patch_size, stride=patch_size, bias=bias)

    def forward(self, x: Tensor) -> tuple[Tensor, tuple[int, int]]:
        p = self.patch_size
        pad_h = (-(-x.shape[-2] // p)) * p - x.shape[-2]
        pad_w = (-(-x.shape[-1] // p)) * p - x.shape[-1]
        if pad_h > 0 or pad_w > 0:
            x = F.pad(x, [0, pad_w, 0, pad_h])
        x = self.projection(x)
        hw = (x.shape[2], x.shape[3])
        return x.flatten(2).transpose(1, 2), hw


class MultiheadAttention(nn.Module):
    """mmcv's ``MultiheadAttention(batch_first=True)``: ``nn.MultiheadAttention`` on sequence-first tensors,
    the residual added inside (``identity + out``)."""

    def __init__(self, embed_dims: int, num_heads: int, bias: bool = True) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(embed_dims, num_heads, bias=bias)

    def forward(self, x: Tensor, identity: Tensor) -> Tensor:
        q = x.transpose(0, 1)
        out = self.attn(query=q, key=q, value=q)[0]
        return identity + out.transpose(0, 1)


class FFN(nn.Module):
    """mmcv's ``FFN(num_fcs=2, act_cfg=GELU)``: ``layers = [[Linear, GELU, Dropout], Linear, Dropout]`` plus the residual."""

    def __init__(self, embed_dims: int, feedforward_channels: int) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Sequential(nn.Linear(embed_dims, feedforward_channels), nn.GELU(), nn.Dropout(0.0)),
            nn.Linear(feedforward_channels, embed_dims),
            nn.Dropout(0.0),
        )

    def forward(self, x: Tensor, identity: Tensor) -> Tensor:
        return identity + self.layers(x)


class TransformerEncoderLayer(nn.Module):
    """mmseg's pre-norm ViT layer: ``x = attn(ln1(x)) + x; x = ffn(ln2(x)) + x`` (LayerNorm eps 1e-6 in SETR)."""

    def __init__(self, embed_dims: int, num_heads: int, feedforward_channels: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(embed_dims, eps=1e-6)
        self.attn = MultiheadAttention(embed_dims, num_heads)
        self.ln2 = nn.LayerNorm(embed_dims, eps=1e-6)
        self.ffn = FFN(embed_dims, feedforward_channels)

    def forward(self, x: Tensor) -> Tensor:
        x = self.attn(self.ln1(x), identity=x)
        return self.ffn(self.ln2(x), identity=x)


class VisionTransformer(nn.Module):
    """mmseg's ``VisionTransformer`` with SETR's settings (``final_norm=False``, ``output_cls_token=False``)."""

    def __init__(self, img_size: int, patch_size: int = 16, embed_dims: int = 1024, num_layers: int = 24,
                 num_heads: int = 16, mlp_ratio: int = 4, out_indices: Sequence[int] = (9, 14, 19, 23),
                 with_cls_token: bool = True, interpolate_mode: str = "bilinear", patch_bias: bool = False) -> None:
        super().__init__()
        self.img_size = (img_size, img_size)
        self.patch_size = patch_size
        self.interpolate_mode = interpolate_mode
        self.with_cls_token = with_cls_token
        self.out_indices = tuple(out_indices)
        self.patch_embed = PatchEmbed(3, embed_dims, patch_size, bias=patch_bias)
        num_patches = (img_size // patch_size) ** 2
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dims))
        self.pos_embed = nn.Parameter(torch.zeros(1, num_patches + 1, embed_dims))
        self.drop_after_pos = nn.Dropout(0.0)
        self.layers = nn.ModuleList(
            TransformerEncoderLayer(embed_dims, num_heads, mlp_ratio * embed_dims) for _ in range(num_layers)
        )

    @staticmethod
    def resize_pos_embed(pos_embed: Tensor, input_shape: Sequence[int], pos_shape: Sequence[int], mode: str) -> Tensor:
        """The class-token row as it is, the trailing ``pos_h * pos_w`` grid rows interpolated to ``input_shape``."""
        rows, cols = pos_shape
        dim = pos_embed.shape[-1]
        grid = pos_embed[:, pos_embed.shape[1] - rows * cols:].view(1, rows, cols, dim).movedim(-1, 1)
        grid = resize(grid, input_shape, mode=mode, align_corners=False).flatten(2).transpose(1, 2)
        return torch.cat([pos_embed[:, :1], grid], dim=1)

    def _pos_embeding(self, patched_img: Tensor, hw_shape: tuple[int, int], pos_embed: Tensor) -> Tensor:
        # as mmseg: resized only when the token *count* differs from the table's
        if patched_img.shape[1] != pos_embed.shape[1]:
            pos_h, pos_w = self.img_size[0] // self.patch_size, self.img_size[1] // self.patch_size
            pos_embed = self.resize_pos_embed(pos_embed, hw_shape, (pos_h, pos_w), self.interpolate_mode)
        return self.drop_after_pos(patched_img + pos_embed)

    def forward(self, inputs: Tensor) -> tuple[Tensor, ...]:
        B = inputs.shape[0]
        x, hw_shape = self.patch_embed(inputs)
        x = torch.cat((self.cls_token.expand(B, -1, -1), x), dim=1)
        x = self._pos_embeding(x, hw_shape, self.pos_embed)
        if not self.with_cls_token:
            x = x[:, 1:]
        outs = []
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i in self.out_indices:
                out = x[:, 1:] if self.with_cls_token else x
                outs.append(out.reshape(B, hw_shape[0], hw_shape[1], -1).permute(0, 3, 1, 2).contiguous())
        return tuple(outs)


# ---------------------------------------------------------------------------------------- heads
def _norm_map(norm: nn.LayerNorm, x: Tensor) -> Tensor:
    """A LayerNorm over the channels of a (N, C, H, W) map, position by position."""
    return norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2).contiguous()


class BaseDecodeHead(nn.Module):
    """The part of mmseg's ``BaseDecodeHead`` SETR uses: ``conv_seg`` (1x1, with bias), ``in_index``, no dropout."""

    def __init__(self, channels: int, num_classes: int, in_index: int | Sequence[int]) -> None:
        super().__init__()
        self.in_index = in_index
        self.align_corners = False
        self.conv_seg = nn.Conv2d(channels, num_classes, kernel_size=1)

    def cls_seg(self, feat: Tensor) -> Tensor:
        return self.conv_seg(feat)


class SETRUPHead(BaseDecodeHead):
    def __init__(self, in_channels: int, channels: int, num_classes: int, in_index: int, num_convs: int = 1,
                 up_scale: int = 4, kernel_size: int = 3) -> None:
        super().__init__(channels, num_classes, in_index)
        self.norm = nn.LayerNorm(in_channels, eps=1e-6)
        self.up_convs = nn.ModuleList()
        cin = in_channels
        for _ in range(num_convs):
            self.up_convs.append(nn.Sequential(ConvModule(cin, channels, kernel_size, padding=(kernel_size - 1) // 2),
                                               Upsample(up_scale, "bilinear", self.align_corners)))
            cin = channels

    def forward(self, inputs: Sequence[Tensor]) -> Tensor:
        x = _norm_map(self.norm, inputs[self.in_index])  # LayerNorm over channels at every position
        for stage in self.up_convs:
            x = stage(x)
        return self.cls_seg(x)


class SETRMLAHead(BaseDecodeHead):
    def __init__(self, in_channels: Sequence[int], channels: int, num_classes: int, mla_channels: int = 128,
                 up_scale: int = 4) -> None:
        super().__init__(channels, num_classes, tuple(range(len(in_channels))))
        assert channels == len(in_channels) * mla_channels
        self.up_convs = nn.ModuleList(
            nn.Sequential(ConvModule(c, mla_channels, 3, padding=1), ConvModule(mla_channels, mla_channels, 3, padding=1),
                          Upsample(up_scale, "bilinear", self.align_corners))
            for c in in_channels
        )

    def forward(self, inputs: Sequence[Tensor]) -> Tensor:
        inputs = [inputs[i] for i in self.in_index]
        return self.cls_seg(torch.cat([up(x) for x, up in zip(inputs, self.up_convs)], dim=1))


class FCNHead(BaseDecodeHead):
    """``FCNHead(num_convs=0, concat_input=False)``: ``convs`` is an Identity, only ``conv_seg`` remains."""

    def __init__(self, in_channels: int, num_classes: int, in_index: int) -> None:
        super().__init__(in_channels, num_classes, in_index)
        self.convs = nn.Identity()

    def forward(self, inputs: Sequence[Tensor]) -> Tensor:
        return self.cls_seg(self.convs(inputs[self.in_index]))


class MLAModule(nn.Module):
    def __init__(self, in_channels: Sequence[int], out_channels: int) -> None:
        super().__init__()
        self.channel_proj = nn.ModuleList(ConvModule(c, out_channels, 1) for c in in_channels)
        self.feat_extract = nn.ModuleList(ConvModule(out_channels, out_channels, 3, padding=1) for _ in in_channels)

    def forward(self, inputs: Sequence[Tensor]) -> tuple[Tensor, ...]:
        feat_list = [conv(x) for x, conv in zip(inputs, self.channel_proj)][::-1]
        mid_list: list[Tensor] = []
        for feat in feat_list:
            mid_list.append(feat if not mid_list else mid_list[-1] + feat)
        return tuple(conv(mid) for mid, conv in zip(mid_list, self.feat_extract))


class MLANeck(nn.Module):
    def __init__(self, in_channels: Sequence[int], out_channels: int) -> None:
        super().__init__()
        self.norm = nn.ModuleList(nn.LayerNorm(c, eps=1e-6) for c in in_channels)
        self.mla = MLAModule(in_channels, out_channels)

    def forward(self, inputs: Sequence[Tensor]) -> tuple[Tensor, ...]:
        return self.mla([_norm_map(norm, x) for x, norm in zip(inputs, self.norm)])


# ---------------------------------------------------------------------------------------- segmentor
class EncoderDecoder(nn.Module):
    """mmseg's ``EncoderDecoder`` at test time (the data preprocessor excluded: inputs are normalised)."""

    def __init__(self, backbone: VisionTransformer, decode_head: nn.Module, auxiliary_head: Sequence[nn.Module],
                 neck: nn.Module | None = None) -> None:
        super().__init__()
        self.backbone = backbone
        if neck is not None:
            self.neck = neck
        self.decode_head = decode_head
        self.auxiliary_head = nn.ModuleList(auxiliary_head)

    def extract_feat(self, inputs: Tensor) -> tuple[Tensor, ...]:
        x = self.backbone(inputs)
        return self.neck(x) if hasattr(self, "neck") else x

    def encode_decode(self, inputs: Tensor) -> Tensor:
        """Logits of ``decode_head`` resized to the input (``predict_by_feat`` with ``img_shape`` = input shape)."""
        seg_logits = self.decode_head(self.extract_feat(inputs))
        return resize(seg_logits, inputs.shape[2:], "bilinear", self.decode_head.align_corners)

    def whole_inference(self, inputs: Tensor) -> Tensor:
        return self.encode_decode(inputs)

    def slide_inference(self, inputs: Tensor, crop_size: Sequence[int], stride: Sequence[int]) -> Tensor:
        """Windows of ``crop_size`` every ``stride`` pixels from the top-left, the last of each row / column moved back
        to end at the border (a side shorter than the crop: one window of that side); per pixel, the mean of the
        logits of the windows that cover it."""
        height, width = inputs.shape[2:]
        starts_y = _window_starts(height, crop_size[0], stride[0])
        starts_x = _window_starts(width, crop_size[1], stride[1])
        total = inputs.new_zeros((inputs.shape[0], self.decode_head.conv_seg.out_channels, height, width))
        covered = inputs.new_zeros((1, 1, height, width))
        for top in starts_y:
            for left in starts_x:
                rows = slice(top, min(top + crop_size[0], height))
                cols = slice(left, min(left + crop_size[1], width))
                total[:, :, rows, cols] += self.encode_decode(inputs[:, :, rows, cols])
                covered[:, :, rows, cols] += 1
        return total / covered


def _window_starts(side: int, crop: int, stride: int) -> list[int]:
    """Top (left) edges of the windows along one side: every ``stride``, the last clamped to end at ``side``."""
    count = -(-max(side - crop, 0) // stride) + 1  # ceil((side - crop) / stride) + 1
    return [max(min(i * stride, side - crop), 0) for i in range(count)]


# ---------------------------------------------------------------------------------------- configs
#: the model parts of mmseg's configs (setr_vit-l_*_8xb2-160k_ade20k-512x512, setr_vit-l_*_8xb1-80k_cityscapes-768x768)
CONFIGS: dict[str, dict[str, Any]] = {
    "naive_ade20k": dict(img_size=512, num_classes=150, out_indices=(9, 14, 19, 23), with_cls_token=True,
                         decode=dict(num_convs=1, up_scale=4, kernel_size=1),
                         aux=[dict(in_index=i, num_convs=2, up_scale=4, kernel_size=1) for i in range(3)]),
    "pup_ade20k": dict(img_size=512, num_classes=150, out_indices=(9, 14, 19, 23), with_cls_token=True,
                       decode=dict(num_convs=4, up_scale=2, kernel_size=3),
                       aux=[dict(in_index=i, num_convs=2, up_scale=4, kernel_size=3) for i in range(3)]),
    "mla_ade20k": dict(img_size=512, num_classes=150, out_indices=(5, 11, 17, 23), with_cls_token=False,
                       mla=True, aux=[dict(in_index=i) for i in range(4)]),
    "naive_cityscapes": dict(img_size=768, num_classes=19, out_indices=(9, 14, 19, 23), with_cls_token=True,
                             decode=dict(num_convs=1, up_scale=4, kernel_size=1),
                             aux=[dict(in_index=i, num_convs=1, up_scale=4, kernel_size=1) for i in range(3)]),
    "pup_cityscapes": dict(img_size=768, num_classes=19, out_indices=(9, 14, 19, 23), with_cls_token=True,
                           decode=dict(num_convs=4, up_scale=2, kernel_size=3),
                           aux=[dict(in_index=i, num_convs=2, up_scale=4, kernel_size=3) for i in range(3)]),
    "mla_cityscapes": dict(img_size=768, num_classes=19, out_indices=(5, 11, 17, 23), with_cls_token=False,
                           mla=True, aux=[dict(in_index=i) for i in range(4)]),
}


def build_setr(decoder: str, dataset: str = "ade20k", *, num_classes: int | None = None, img_size: int | None = None,
               embed_dims: int = 1024, num_layers: int = 24, num_heads: int = 16, patch_size: int = 16,
               out_indices: Sequence[int] | None = None, channels: int = 256, mla_channels: int = 128,
               patch_bias: bool = False) -> EncoderDecoder:
    """mmseg's SETR ``EncoderDecoder`` for ``decoder`` in naive / pup / mla and ``dataset`` in ade20k / cityscapes.

    The keyword arguments shrink it for cheap tests (fewer / narrower layers, other taps, narrower heads);
    the defaults are mmseg's ViT-L. ``patch_bias=True`` gives the mmseg 0.x backbone (a patch-embedding bias).
    """
    cfg = copy.deepcopy(CONFIGS[f"{decoder}_{dataset}"])
    k = num_classes or cfg["num_classes"]
    taps = tuple(out_indices or cfg["out_indices"])
    backbone = VisionTransformer(img_size or cfg["img_size"], patch_size, embed_dims, num_layers, num_heads,
                                 out_indices=taps, with_cls_token=cfg["with_cls_token"], patch_bias=patch_bias)
    if cfg.get("mla"):
        levels = [channels] * len(taps)
        neck = MLANeck([embed_dims] * len(taps), channels)
        head = SETRMLAHead(levels, len(taps) * mla_channels, k, mla_channels=mla_channels, up_scale=4)
        aux = [FCNHead(channels, k, a["in_index"]) for a in cfg["aux"]]
        return EncoderDecoder(backbone, head, aux, neck)
    head = SETRUPHead(embed_dims, channels, k, in_index=len(taps) - 1, **cfg["decode"])
    aux = [SETRUPHead(embed_dims, channels, k, **a) for a in cfg["aux"]]
    return EncoderDecoder(backbone, head, aux)


def randomize(module: nn.Module, seed: int = 0) -> None:
    """Give every float parameter and buffer a non-trivial value with moderate activations (as a trained
    checkpoint has): LayerNorm/BN affine around 1/0, BN statistics, tables, 1/sqrt(fan-in) weights."""
    g = torch.Generator().manual_seed(seed)

    def normal(t: Tensor, mean: float, std: float) -> Tensor:
        return mean + std * torch.randn(t.shape, generator=g, dtype=t.dtype)

    with torch.no_grad():
        for name, t in list(module.named_parameters()) + list(module.named_buffers()):
            if not t.is_floating_point():
                continue
            if name.endswith("running_var"):
                t.copy_(0.5 + torch.rand(t.shape, generator=g, dtype=t.dtype))
            elif name.endswith("running_mean"):
                t.copy_(normal(t, 0.0, 0.1))
            elif t.dim() == 1 and (".ln" in name or "norm" in name or ".bn." in name):
                t.copy_(normal(t, 1.0 if name.endswith("weight") else 0.0, 0.1))
            elif name.endswith(("pos_embed", "cls_token")):
                t.copy_(normal(t, 0.0, 0.5))
            else:
                fan_in = t[0].numel() if t.dim() > 1 else 16
                t.copy_(normal(t, 0.0, fan_in ** -0.5))
