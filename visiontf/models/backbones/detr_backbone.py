"""DETR's backbone: a torchvision ResNet with frozen BatchNorm, any timm model with ``features_only``,
or a visiontf ViT; a :class:`~visiontf.models.backbones.backbone.Backbone`.

The ResNet keeps torchvision's module names under ``body.``, so the original DETR checkpoint's
``backbone.0.body.<name>`` maps onto ``backbone.body.<name>`` with a prefix rename and ImageNet
weights from torchvision load unchanged. As in the paper, the stem and the first stage (conv1,
bn1, layer1) are never trained and BatchNorm statistics and affine parameters are frozen. timm
models (:mod:`~visiontf.models.backbones.timm_features`: CNNs, Swin's NHWC maps, ViTs at any size) and
visiontf's ViTs (their ``features_only`` form) sit under ``body.`` too.
"""
from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torchvision
from torch import Tensor, nn
from torchvision.models._utils import IntermediateLayerGetter
from torchvision.ops import FrozenBatchNorm2d

from visiontf.io.weights import WeightsError, load_state_dict_file
from visiontf.models._registry import key_mismatch
from visiontf.models.backbones import timm_features
from visiontf.models.backbones.backbone import TIMM_PREFIX, Backbone, check_indices, select_levels
from visiontf.models.backbones.frozen_bn import fold_frozen_batchnorm
from visiontf.models.backbones.registry import register_backbone
from visiontf.models.vit.vit import visiontf_vits

log = logging.getLogger(__name__)

RESNETS = ("resnet18", "resnet34", "resnet50", "resnet101")
#: classifier tensors of ImageNet checkpoints, unused by a feature extractor
_CLASSIFIER_PREFIXES = ("fc.", "head.", "classifier.", "head_dist.")
#: a torchvision ResNet's features in timm's numbering: the stem (stride 2), then layer1..layer4
_RESNET_STRIDES = (2, 4, 8, 16, 32)


class DetrBackbone(Backbone):
    """A torchvision ResNet, a timm ``features_only`` model or a visiontf ViT as a :class:`Backbone`.

    Args:
        name: ``"resnet18" | "resnet34" | "resnet50" | "resnet101"`` (torchvision),
            ``"timm:<model name>"`` (any timm model that supports ``features_only``: CNNs, Swin,
            ViTs), or a registered visiontf ViT / DeiT (``"vit_small_patch16_224"``).
        dilation: DC5, replace the stride of the last stage by dilation (ResNets; for timm
            models ``output_stride=16`` is requested instead).
        train_backbone: False freezes every parameter (the original's ``lr_backbone == 0``);
            True trains everything but the stem and first stage, as the paper.
        pretrained: None, a local ImageNet checkpoint (torchvision / timm / the original release's
            names), or True to download the published weights (torchvision's ``IMAGENET1K_V1``,
            timm's hub).
        channels_last: run the backbone in channels-last memory format (faster convolutions on
            CPUs and tensor cores).
        frozen_bn: FrozenBatchNorm2d (the paper; right for a pretrained backbone). False gives
            ordinary BatchNorm2d, for training a backbone from scratch (small CPU models).
        freeze_stem: keep the stem and first stage (everything before the first stride-8 feature)
            frozen, as the paper does for pretrained weights; a from-scratch backbone should train them.
        out_indices: the features returned by :meth:`forward_features`, timm's numbering of the
            model's ``feature_info`` (ResNet ``layer{i}`` is feature i: 2, 3, 4 have strides 8, 16,
            32; a ViT's features are its blocks). None: :func:`~visiontf.models.backbones.backbone.select_levels`
            with ``num_levels`` (1: the last stage) and ``min_stride``.
        frozen_stages: freeze the stem and the features up to this index (overrides ``freeze_stem``).
        timm_kwargs: more keywords for ``timm.create_model`` / the visiontf ViT (``drop_path_rate``, ...).

    Attributes:
        num_channels: channels of the last returned map; ``channels`` / ``strides``: of each.
    """

    def __init__(
        self,
        name: str = "resnet50",
        dilation: bool = False,
        train_backbone: bool = True,
        pretrained: bool | str | Path | None = None,
        channels_last: bool = False,
        frozen_bn: bool = True,
        freeze_stem: bool = True,
        out_indices: Sequence[int] | None = None,
        *,
        num_levels: int = 1,
        min_stride: int = 8,
        frozen_stages: int | None = None,
        timm_kwargs: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.name = name
        self.channels_last = channels_last
        self.nhwc = False
        if name.startswith(TIMM_PREFIX) or name in visiontf_vits():
            self.body, self.pad_multiple = _features_body(name, out_indices, (num_levels, min_stride), pretrained, dilation,
                                                          timm_kwargs or {})
            if frozen_bn:
                from timm.layers import freeze_batch_norm_2d

                self.body = freeze_batch_norm_2d(self.body)
            self.nhwc = timm_features.is_nhwc(self.body)
            self.channels = list(self.body.feature_info.channels())
            self.strides = list(self.body.feature_info.reduction())
            first_trained = timm_features.first_trained_module(self.body)
            if frozen_stages is not None:
                first_trained = timm_features.module_after_feature(self.body, frozen_stages)
        elif name in RESNETS:
            if timm_kwargs:
                raise ValueError(f"backbone {name!r} (torchvision) takes no further keywords, got {sorted(timm_kwargs)}")
            if dilation and name in ("resnet18", "resnet34"):
                raise ValueError(f"dilation (DC5) needs a bottleneck ResNet (resnet50/resnet101); torchvision's {name} has none")
            resnet = getattr(torchvision.models, name)(
                weights=None,
                replace_stride_with_dilation=[False, False, dilation],
                norm_layer=FrozenBatchNorm2d if frozen_bn else nn.BatchNorm2d,
            )
            if pretrained:
                _load_imagenet(resnet, name, pretrained)
            if frozen_bn:
                # same buffers and state dict; saves the elementwise BN passes (docs/record/speed.md)
                fold_frozen_batchnorm(resnet)
            if out_indices is None:
                stages = tuple(select_levels(_RESNET_STRIDES, num_levels, min_stride))
            else:
                stages = tuple(check_indices(out_indices, _RESNET_STRIDES, f"torchvision {name}"))
                if 0 in stages:
                    raise ValueError(f"out_indices={tuple(out_indices)}: torchvision {name}'s features are layer1..layer4 (1..4)")
            self.body = IntermediateLayerGetter(resnet, return_layers={f"layer{i}": str(k) for k, i in enumerate(stages)})
            self.channels = [_stage_channels(getattr(resnet, f"layer{i}")) for i in stages]
            # DC5: layer4 keeps layer3's stride
            self.strides = [2 ** (i + 1) // (2 if dilation and i == 4 else 1) for i in stages]
            first_trained = "layer2" if frozen_stages is None else (f"layer{frozen_stages + 1}" if frozen_stages < 4 else None)
        else:
            raise ValueError(
                f"unknown backbone {name!r}: use one of {RESNETS}, '{TIMM_PREFIX}<timm model name>' (e.g. 'timm:convnext_tiny'), "
                "a visiontf ViT (e.g. 'vit_small_patch16_224'), 'simplefpn:<ViT>' or a DINO Swin (e.g. 'swin_T_224_1k')"
            )
        if not train_backbone or (frozen_stages is not None and first_trained is None):
            _freeze(self.body, None)
        elif freeze_stem or frozen_stages is not None:
            _freeze(self.body, first_trained, absent_means_all=frozen_stages is not None)
        if channels_last:
            self.body.to(memory_format=torch.channels_last)

    def forward_maps(self, images: Tensor) -> list[Tensor]:
        """Every requested map (B, C_i, h_i, w_i), finest first."""
        if self.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        features = self.body(self.pad(images))
        maps = list(features.values()) if isinstance(features, dict) else list(features)
        return timm_features.to_nchw(maps, self.nhwc)


_TINY_VIT = dict(depth=2, embed_dim=64, num_heads=2)


@register_backbone("resnet", names=RESNETS, examples={"resnet18": {}},
                   summary="torchvision's ResNet with FrozenBN (the original DETR checkpoints' layout)")
@register_backbone("timm", prefix=TIMM_PREFIX, summary="any timm model with features_only: CNNs, Swin (NHWC), ViTs",
                   examples={"timm:convnext_atto": dict(depths=(1, 1, 1, 1), dims=(16, 32, 64, 128)),
                             "timm:swin_tiny_patch4_window7_224": dict(embed_dim=32, depths=(1, 1, 1, 1), num_heads=(1, 2, 4, 8)),
                             "timm:vit_tiny_patch16_224": _TINY_VIT})
@register_backbone("vit", names=visiontf_vits, examples={"vit_tiny_patch16_224": _TINY_VIT},
                   summary="visiontf's ViT / DeiT through its features_only form (stride = the patch)")
def detr_backbone(name: str, *, out_indices: Sequence[int] | None = None, num_levels: int = 1, min_stride: int = 8,
                 pretrained: bool | str | Path | None = None, train_backbone: bool = True, freeze_stem: bool = True,
                 frozen_stages: int | None = None, frozen_bn: bool = True, channels_last: bool = False,
                 dilation: bool = False, **kwargs: Any) -> DetrBackbone:
    """The registry's builder of torchvision ResNets, ``timm:`` models and visiontf ViTs; ``kwargs`` go to timm's
    ``create_model`` or the ViT (:class:`DetrBackbone`)."""
    return DetrBackbone(name, dilation=dilation, train_backbone=train_backbone, pretrained=pretrained, channels_last=channels_last,
                        frozen_bn=frozen_bn, freeze_stem=freeze_stem, out_indices=out_indices, num_levels=num_levels,
                        min_stride=min_stride, frozen_stages=frozen_stages, timm_kwargs=kwargs)


def _features_body(name: str, out_indices: Sequence[int] | None, levels: tuple[int, int], pretrained: bool | str | Path | None,
                   dilation: bool, kwargs: dict[str, Any]) -> tuple[nn.Module, int]:
    """A timm model's or a visiontf ViT's features_only form, and the multiple images are padded to."""
    if name.startswith(TIMM_PREFIX):
        return timm_features.timm_features(name[len(TIMM_PREFIX):], out_indices, levels, pretrained, dilation, **kwargs)
    from visiontf.models._registry import create_model

    if dilation:
        raise ValueError(f"dilation (DC5) is for CNNs; {name} is a ViT (stride = its patch)")
    vit_kwargs = {"dynamic_img_size": True, "dynamic_img_pad": True, **kwargs}
    full = create_model(name, pretrained=pretrained or None, **vit_kwargs)
    depth = len(full.blocks)
    reductions = [max(full.patch_embed.patch_size)] * depth
    indices = select_levels(reductions, *levels) if out_indices is None else check_indices(out_indices, reductions, name)
    from visiontf.models.vit.features import features_only

    return features_only(full, out_indices=indices, name=name), max(full.patch_embed.patch_size)


def _freeze(body: nn.Module, first_trained: str | None, absent_means_all: bool = False) -> None:
    """Freeze parameters registered before module ``first_trained`` (all of them if None). A module not
    there (pruned with the features after the last one kept) freezes all with ``absent_means_all``,
    else nothing (with a warning)."""
    names = [n for n, _ in body.named_parameters()]
    if first_trained is not None:
        # timm's feature wrappers flatten nested stages ("stages.1" -> "stages_1")
        for candidate in (first_trained, first_trained.replace(".", "_")):
            if any(n.startswith(candidate + ".") for n in names):
                first_trained = candidate
                break
        else:
            if not absent_means_all:
                log.warning("backbone: stage %r not found, no backbone parameter frozen", first_trained)
                return
            log.info("backbone: %r is after the last feature kept; every backbone parameter frozen", first_trained)
            first_trained = None
    trained = False
    for pname, p in body.named_parameters():
        if first_trained is not None and pname.startswith(first_trained + "."):
            trained = True
        p.requires_grad_(trained)


def _load_imagenet(resnet: nn.Module, name: str, pretrained: bool | str | Path) -> None:
    if pretrained is True:
        from visiontf.io.downloads import DownloadError, check_torch_hub_download

        weights = torchvision.models.get_model_weights(name).IMAGENET1K_V1
        fix = f"Without network, download the file elsewhere and pass backbone_pretrained='/path/to/{Path(weights.url).name}'."
        check_torch_hub_download(weights.url, f"torchvision {name} ImageNet weights", fix)
        try:
            state = weights.get_state_dict(progress=False)
        except Exception as e:
            raise DownloadError(
                f"could not download torchvision {name} ImageNet weights ({weights.url}; {type(e).__name__}: {e}). {fix}"
            ) from e
        source = weights.url
    else:
        state = load_state_dict_file(pretrained)
        source = str(pretrained)
    _load_backbone_state(resnet, state, source)


def _load_backbone_state(module: nn.Module, state: dict[str, Tensor], source: str) -> None:
    """Strict load except for the ImageNet classifier and BN step counters, both counted in the log."""
    dropped = [k for k in state if k.startswith(_CLASSIFIER_PREFIXES) or k.endswith("num_batches_tracked")]
    state = {k: v for k, v in state.items() if k not in set(dropped)}
    own = module.state_dict()
    missing = [k for k in own if k not in state and not k.startswith(_CLASSIFIER_PREFIXES)]
    unexpected = [k for k in state if k not in own]
    if missing or unexpected:
        raise WeightsError(
            f"{source}: backbone weights do not fit: {key_mismatch(missing, unexpected)}. Expected an ImageNet "
            "checkpoint of the same architecture with torchvision/timm key names."
        )
    module.load_state_dict(state, strict=False)
    log.info("backbone: loaded %d tensors from %s, ignored %d classifier/counter tensors", len(state), source, len(dropped))


def _stage_channels(stage: nn.Sequential) -> int:
    """Output channels of a torchvision ResNet stage (its last block's last BN)."""
    block = stage[-1]
    return (block.bn3 if hasattr(block, "bn3") else block.bn2).weight.numel()
