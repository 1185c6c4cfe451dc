"""ResNet-vd (He et al., "Bag of Tricks", 2019, variant D), the backbone of RT-DETR ("PResNet" there).

Two changes from the plain ResNet: a deep stem (three 3x3 convolutions, the first of stride 2, instead
of one 7x7) and projection shortcuts that average-pool 2x2 before their 1x1 convolution instead of
striding it. timm builds the same network as ``resnet{18,34,50,101}d`` (``stem_type="deep"``,
``avg_down=True``); it is used here with one difference added for the basic-block depths: RT-DETR's
first block of every stage has a projection shortcut, also where its input and output widths are
equal (R18's and R34's first stage, 64 -> 64 at stride 1), where timm's ResNet has none. That
shortcut is put in timm's own ``downsample`` slot (an identity pool, a 1x1 convolution and its
BatchNorm), so every tensor keeps timm's name.

The state-dict layouts of RT-DETR's ``PResNet`` (its ImageNet files
``ResNet{18,34}_vd_pretrained_from_paddle.pth``, ``ResNet50_vd_ssld_v2_pretrained_from_paddle.pth``,
``ResNet101_vd_ssld_pretrained_from_paddle.pth``, and the ``backbone.`` part of its detector
checkpoints) and of transformers' ``RTDetrResNet`` map onto timm's with :func:`presnet_to_timm` and
:func:`transformers_resnet_to_timm`; :class:`ResNetVdBackbone` takes either as ``pretrained=``.
"""
from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
from torch import Tensor

from visiontf.io.weights import WeightsError, load_state_dict_file
from visiontf.models.backbones.backbone import Backbone, load_fitting_imagenet
from visiontf.models.backbones.fast_pool import replace_max_pool
from visiontf.models.backbones.frozen_bn import fold_frozen_batchnorm
from visiontf.models.backbones.registry import register_backbone
from visiontf.nn.cpu_convolution import conv_layout, use_onednn_convolutions

log = logging.getLogger(__name__)

__all__ = ["RESNET_VD_DEPTHS", "RESNET_VD_NAMES", "ResNetVdBackbone", "presnet_to_timm", "resnet_vd_backbone", "resnet_vd_state",
           "transformers_resnet_to_timm"]

#: depth -> (block kind, blocks per stage), RT-DETR's ``ResNet_cfg``
RESNET_VD_DEPTHS: dict[int, tuple[str, tuple[int, int, int, int]]] = {
    18: ("basic", (2, 2, 2, 2)),
    34: ("basic", (3, 4, 6, 3)),
    50: ("bottleneck", (3, 4, 6, 3)),
    101: ("bottleneck", (3, 4, 23, 3)),
}


#: the names ``build_backbone`` takes for it (any detector's ``backbone=``)
RESNET_VD_NAMES = {f"resnet{depth}vd": depth for depth in RESNET_VD_DEPTHS}


class ResNetVdBackbone(Backbone):
    """RT-DETR's ResNet-vd as a :class:`~visiontf.models.backbones.backbone.Backbone` (timm's ResNet under ``body.``).

    Args:
        depth: 18, 34, 50 or 101.
        out_stages: the stages whose outputs are returned, 1..4 (``layer1``..``layer4``, strides 4..32); RT-DETR
            uses (2, 3, 4) (its ``return_idx`` [1, 2, 3]).
        frozen_bn: FrozenBatchNorm2d everywhere (RT-DETR's R50/R101, ``freeze_norm``); False trains ordinary
            BatchNorm (its R18/R34).
        freeze_at: -1 trains every parameter (R18/R34); 0 freezes the stem (R50/R101); k > 0 also the first k stages.
        stem_width, widths, blocks: the stem's first width (its output is twice it), the four stages' widths
            (before the bottleneck's 4x) and blocks per stage; the defaults are the depth's. Narrower values give
            the small networks of the tests.
        pretrained: a local ImageNet file in RT-DETR's ``PResNet`` layout, transformers' ``RTDetrResNet`` layout or
            timm's (``resnet50d``/``resnet101d``: the same network); True is refused (the originals' files are
            GitHub release assets: download one and pass its path).
        channels_last: run in channels-last memory format (faster convolutions on CPUs); inference on the CPU runs
            in it anyway (:func:`~visiontf.nn.cpu_convolution.conv_layout`).
    """

    def __init__(
        self,
        depth: int = 50,
        out_stages: Sequence[int] = (2, 3, 4),
        frozen_bn: bool = True,
        freeze_at: int = -1,
        stem_width: int = 32,
        widths: Sequence[int] = (64, 128, 256, 512),
        blocks: Sequence[int] | None = None,
        pretrained: bool | str | Path | None = None,
        channels_last: bool = False,
    ) -> None:
        super().__init__()
        from timm.models.resnet import BasicBlock, Bottleneck, ResNet, downsample_avg

        if depth not in RESNET_VD_DEPTHS:
            raise ValueError(f"ResNet-vd depth must be one of {sorted(RESNET_VD_DEPTHS)}, got {depth}")
        kind, default_blocks = RESNET_VD_DEPTHS[depth]
        blocks = tuple(int(b) for b in (default_blocks if blocks is None else blocks))
        widths = tuple(int(w) for w in widths)
        stages = tuple(int(s) for s in out_stages)
        if len(blocks) != 4 or len(widths) != 4 or min(blocks) < 1:
            raise ValueError(f"ResNet-vd takes 4 stages: blocks {blocks} and widths {widths}")
        if not stages or stages != tuple(sorted(set(stages))) or not set(stages) <= {1, 2, 3, 4}:
            raise ValueError(f"out_stages must be increasing stages among 1..4 (strides 4..32), got {tuple(out_stages)}")
        if not -1 <= freeze_at <= 4:
            raise ValueError(f"freeze_at must be -1 (nothing frozen), 0 (the stem) or 1..4 (the stem and that many stages), got {freeze_at}")
        block = BasicBlock if kind == "basic" else Bottleneck
        body = ResNet(block, list(blocks), channels=widths, stem_width=stem_width, stem_type="deep", avg_down=True, num_classes=0,
                      global_pool="")
        first = body.layer1[0]
        if first.downsample is None:  # RT-DETR's first block always projects its shortcut
            first.downsample = downsample_avg(2 * stem_width, widths[0] * block.expansion, 1, stride=1)
        del body.fc, body.global_pool
        for i in range(max(stages) + 1, 5):  # stages after the last one returned are never run
            delattr(body, f"layer{i}")
        self.depth, self.stages = depth, stages
        self.channels = [widths[i - 1] * block.expansion for i in stages]
        self.strides = [2 ** (i + 1) for i in stages]
        # a detector that fuses levels by 2x upsampling (RT-DETR's encoder) needs sizes divisible by the coarsest stride
        self.pad_multiple = self.strides[-1]
        self.channels_last = channels_last
        if frozen_bn:
            from timm.layers import freeze_batch_norm_2d  # torchvision's FrozenBatchNorm2d, statistics kept

            body = freeze_batch_norm_2d(body)
        self.body = body
        if pretrained:
            if pretrained is True:
                raise ValueError("ResNet-vd ImageNet weights are the originals' release files (RT-DETR's "
                                 "ResNet{18,34}_vd_pretrained_from_paddle.pth, ResNet50_vd_ssld_v2_...): download one and pass its path")
            self.load_imagenet(pretrained)
        if frozen_bn:
            # the same buffers and state dict; the frozen BN rides on its convolution (docs/record/speed.md)
            fold_frozen_batchnorm(body)
        if freeze_at >= 0:
            frozen = ["conv1.", "bn1."] + [f"layer{i}." for i in range(1, freeze_at + 1)]
            for name, p in body.named_parameters():
                if name.startswith(tuple(frozen)):
                    p.requires_grad_(False)
        replace_max_pool(body, "maxpool")  # the same values, faster in inference (fast_pool)
        use_onednn_convolutions(body)  # oneDNN for every float32 convolution in inference on the CPU
        if channels_last:
            body.to(memory_format=torch.channels_last)

    def forward_maps(self, images: Tensor) -> list[Tensor]:
        """The maps of ``out_stages``, finest first (``images`` padded by the caller, :meth:`pad`)."""
        images = conv_layout(images, self.channels_last, self.training)
        body = self.body
        x = body.maxpool(body.act1(body.bn1(body.conv1(images))))
        maps = []
        for i in range(1, max(self.stages) + 1):
            x = getattr(body, f"layer{i}")(x)
            if i in self.stages:
                maps.append(x)
        return maps

    def fuse_for_inference(self) -> int:
        """Fold every BatchNorm (ordinary or frozen) into the convolution before it, for inference; returns the folds
        made (0 when called again). The outputs equal the unfolded network's up to float rounding; the state dict
        changes (the BatchNorms are gone), so load weights before folding."""
        from timm.models.resnet import BasicBlock, Bottleneck, ResNet

        from visiontf.nn.fold_bn import fold_batchnorms

        # timm's forwards apply each bnN straight to convN's output (the stem's conv1 is a Sequential ending in a convolution)
        return fold_batchnorms(self.body, {ResNet: [("conv1", "bn1")], BasicBlock: [("conv1", "bn1"), ("conv2", "bn2")],
                                           Bottleneck: [("conv1", "bn1"), ("conv2", "bn2"), ("conv3", "bn3")]})

    def load_imagenet(self, path: str | Path) -> None:
        """ImageNet weights from a local file in RT-DETR's, transformers' or timm's layout (classifier dropped)."""
        state = resnet_vd_state(load_state_dict_file(path))
        own = self.body.state_dict()
        dropped = [k for k in state if k.startswith(("fc.", "head.")) or k.endswith("num_batches_tracked") or re.match(r"layer[1-4]\.", k)
                   and k not in own and int(k[5]) > max(self.stages)]
        state = {k: v for k, v in state.items() if k not in set(dropped)}
        loaded = load_fitting_imagenet(self.body, state, path, "ResNet-vd", f"R{self.depth}vd",
                                       "RT-DETR's PResNet file of this depth (or transformers' / timm's layout)")
        log.info("ResNet-vd R%d: loaded %d tensors from %s", self.depth, loaded, path)


@register_backbone("resnet_vd", names=RESNET_VD_NAMES, examples={"resnet18vd": {}},
                   summary="RT-DETR's ResNet-vd (its ImageNet files load)")
def resnet_vd_backbone(name: str, *, out_indices: Sequence[int] | None = None, num_levels: int = 3, min_stride: int = 8,
                       pretrained: bool | str | Path | None = None, train_backbone: bool = True, freeze_stem: bool = True,
                       frozen_stages: int | None = None, frozen_bn: bool = True, channels_last: bool = False, dilation: bool = False, **kwargs) -> ResNetVdBackbone:
    """``build_backbone``'s reading of ``"resnet{18,34,50,101}vd"``: its feature numbering (1..4 = layer1..layer4), the
    DETR papers' frozen stem and first stage (``freeze_stem``) or ``frozen_stages``; ``train_backbone=False`` freezes all."""
    if dilation:
        raise ValueError(f"dilation (DC5) is not built for {name}")
    from visiontf.models.backbones.backbone import check_indices, select_levels

    strides = (2, 4, 8, 16, 32)
    indices = select_levels(strides, num_levels, min_stride) if out_indices is None else check_indices(out_indices, strides, name)
    if 0 in indices:
        raise ValueError(f"out_indices={tuple(out_indices or ())}: {name}'s features are layer1..layer4 (1..4)")
    freeze_at = 4 if not train_backbone else frozen_stages if frozen_stages is not None else (1 if freeze_stem else -1)
    return ResNetVdBackbone(RESNET_VD_NAMES[name], tuple(indices), frozen_bn=frozen_bn, freeze_at=freeze_at, pretrained=pretrained,
                            channels_last=channels_last, **kwargs)


# ------------------------------------------------------------------------------------ foreign layouts
_NORM_TENSORS = ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")


def _stem(index: int, part: str) -> str:
    """The timm name of stem convolution ``index`` (0..2) and its norm (``part`` "conv" or "norm")."""
    if part == "conv":
        return f"conv1.{3 * index}"
    return "bn1" if index == 2 else f"conv1.{3 * index + 1}"


def presnet_to_timm(key: str) -> str | None:
    """A key of RT-DETR's ``PResNet`` state dict (no ``backbone.`` prefix) as timm's ResNet names, or None."""
    m = re.fullmatch(r"conv1\.conv1_([123])\.(conv|norm)\.(\w+)", key)
    if m:
        return f"{_stem(int(m[1]) - 1, m[2])}.{m[3]}"
    m = re.fullmatch(r"res_layers\.(\d)\.blocks\.(\d+)\.(.+)", key)
    if not m:
        return None
    block, rest = f"layer{int(m[1]) + 1}.{m[2]}", m[3]
    m = re.fullmatch(r"branch2([abc])\.(conv|norm)\.(\w+)", rest)
    if m:
        n = "abc".index(m[1]) + 1
        return f"{block}.{'conv' if m[2] == 'conv' else 'bn'}{n}.{m[3]}"
    # the shortcut: a pool and a ConvNormLayer (short.conv.*) at stride 2, a ConvNormLayer (short.*) at stride 1
    m = re.fullmatch(r"short\.(?:conv\.)?(conv|norm)\.(\w+)", rest)
    if m:
        return f"{block}.downsample.{1 if m[1] == 'conv' else 2}.{m[2]}"
    return None


def transformers_resnet_to_timm(key: str) -> str | None:
    """A key of transformers' ``RTDetrResNetBackbone`` (after ``model.``) as timm's ResNet names, or None."""
    m = re.fullmatch(r"embedder\.embedder\.([012])\.(convolution|normalization)\.(\w+)", key)
    if m:
        return f"{_stem(int(m[1]), 'conv' if m[2] == 'convolution' else 'norm')}.{m[3]}"
    m = re.fullmatch(r"encoder\.stages\.(\d)\.layers\.(\d+)\.(.+)", key)
    if not m:
        return None
    block, rest = f"layer{int(m[1]) + 1}.{m[2]}", m[3]
    m = re.fullmatch(r"layer\.([012])\.(convolution|normalization)\.(\w+)", rest)
    if m:
        n = int(m[1]) + 1
        return f"{block}.{'conv' if m[2] == 'convolution' else 'bn'}{n}.{m[3]}"
    m = re.fullmatch(r"shortcut\.(?:1\.)?(convolution|normalization)\.(\w+)", rest)
    if m:
        return f"{block}.downsample.{1 if m[1] == 'convolution' else 2}.{m[2]}"
    return None


def resnet_vd_state(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """A ResNet-vd state dict in timm's names, from RT-DETR's ``PResNet``, transformers' or timm's own layout."""
    state = dict(state.get("model", state)) if isinstance(state.get("model"), Mapping) else dict(state)
    if any(k.startswith(("res_layers.", "conv1.conv1_")) for k in state):
        rename = presnet_to_timm
    elif any(k.startswith(("embedder.", "encoder.stages.")) for k in state):
        rename = transformers_resnet_to_timm
    else:
        return state
    out, unknown = {}, []
    for key, value in state.items():
        new = rename(key)
        (unknown.append(key) if new is None else out.__setitem__(new, value))
    if unknown:
        raise WeightsError(f"ResNet-vd weights: keys of no known ResNet-vd layout: {', '.join(unknown[:5])}")
    return out
