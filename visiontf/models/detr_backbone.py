"""DETR's convolutional backbone: a torchvision ResNet with frozen BatchNorm, or any timm CNN.

The ResNet keeps torchvision's module names under ``body.``, so the original DETR checkpoint's
``backbone.0.body.<name>`` maps onto ``backbone.body.<name>`` with a prefix rename and ImageNet
weights from torchvision load unchanged. As in the paper, the stem and the first stage (conv1,
bn1, layer1) are never trained and BatchNorm statistics and affine parameters are frozen.
"""
from __future__ import annotations

import logging
from pathlib import Path

import torch
import torch.nn.functional as F
import torchvision
from torch import Tensor, nn
from torchvision.models._utils import IntermediateLayerGetter
from torchvision.ops import FrozenBatchNorm2d

from visiontf.models.frozen_bn import fold_frozen_batchnorm
from visiontf.weights import load_state_dict_file

log = logging.getLogger(__name__)

RESNETS = ("resnet18", "resnet34", "resnet50", "resnet101")
#: prefix selecting a timm model as backbone, e.g. ``"timm:resnet18"``
TIMM_PREFIX = "timm:"
#: classifier tensors of ImageNet checkpoints, unused by a feature extractor
_CLASSIFIER_PREFIXES = ("fc.", "head.", "classifier.", "head_dist.")


class DetrBackbone(nn.Module):
    """Feature extractor returning the last feature map and the padding mask resized to it.

    With ``out_indices`` it also serves multi-scale detectors (Deformable DETR: ``(2, 3, 4)``,
    strides 8/16/32): :meth:`forward_features` returns every requested map with its mask.

    Args:
        name: ``"resnet18" | "resnet34" | "resnet50" | "resnet101"`` (torchvision) or
            ``"timm:<model name>"`` for any timm CNN that supports ``features_only``.
        dilation: DC5, replace the stride of the last stage by dilation (ResNets; for timm
            models ``output_stride=16`` is requested instead).
        train_backbone: False freezes every parameter (the original's ``lr_backbone == 0``);
            True trains everything but the stem and first stage, as the paper.
        pretrained: None, a local ImageNet checkpoint (torchvision / timm names), or True to
            download torchvision's ``IMAGENET1K_V1`` weights (ResNets only).
        channels_last: run the backbone in channels-last memory format (faster convolutions on
            CPUs and tensor cores).
        frozen_bn: FrozenBatchNorm2d (the paper; right for a pretrained backbone). False gives
            ordinary BatchNorm2d, for training a backbone from scratch (small CPU models).
        freeze_stem: keep the stem and first stage frozen, as the paper does for pretrained
            weights; a from-scratch backbone should train them.
        out_indices: stages returned by :meth:`forward_features`, timm's numbering (ResNet
            ``layer{i}`` is stage i: 2, 3, 4 have strides 8, 16, 32). None: the last stage only.

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
        out_indices: tuple[int, ...] | None = None,
    ) -> None:
        super().__init__()
        self.name = name
        self.channels_last = channels_last
        if name.startswith(TIMM_PREFIX):
            self.body = _timm_body(name[len(TIMM_PREFIX):], dilation, pretrained, frozen_bn, out_indices)
            self.channels = list(self.body.feature_info.channels())
            self.strides = list(self.body.feature_info.reduction())
            first_trained = _timm_first_trained_module(self.body)
        elif name in RESNETS:
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
                # same buffers and state dict; saves the elementwise BN passes (docs/benchmarks.md)
                fold_frozen_batchnorm(resnet)
            stages = (4,) if out_indices is None else tuple(out_indices)
            if not stages or any(i not in (1, 2, 3, 4) for i in stages) or list(stages) != sorted(set(stages)):
                raise ValueError(f"out_indices must be increasing ResNet stages among 1..4 (layer1..layer4), got {out_indices}")
            self.body = IntermediateLayerGetter(resnet, return_layers={f"layer{i}": str(k) for k, i in enumerate(stages)})
            self.channels = [_stage_channels(getattr(resnet, f"layer{i}")) for i in stages]
            # DC5: layer4 keeps layer3's stride
            self.strides = [2 ** (i + 1) // (2 if dilation and i == 4 else 1) for i in stages]
            first_trained = "layer2"
        else:
            raise ValueError(
                f"unknown DETR backbone {name!r}: use one of {RESNETS} or '{TIMM_PREFIX}<timm model name>' (e.g. 'timm:resnet18')"
            )
        if not train_backbone:
            _freeze(self.body, None)
        elif freeze_stem:
            _freeze(self.body, first_trained)
        self.num_channels = self.channels[-1]
        if channels_last:
            self.body.to(memory_format=torch.channels_last)

    def forward(self, images: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        """images (B, 3, H, W), mask (B, H, W) True on padding -> features (B, C, h, w), mask (B, h, w)."""
        maps, masks = self.forward_features(images, mask)
        return maps[-1], masks[-1]

    def forward_features(self, images: Tensor, mask: Tensor) -> tuple[list[Tensor], list[Tensor]]:
        """Every requested map (B, C_i, h_i, w_i), finest first, and the padding mask resized to each."""
        if self.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        features = self.body(images)
        maps = list(features.values()) if isinstance(features, dict) else list(features)
        # nearest resize of the padding mask, exactly as the original (default mode, no align)
        masks = [F.interpolate(mask[None].float(), size=x.shape[-2:]).to(torch.bool)[0] for x in maps]
        return maps, masks


def _freeze(body: nn.Module, first_trained: str | None) -> None:
    """Freeze parameters registered before module ``first_trained`` (all of them if None)."""
    names = [n for n, _ in body.named_parameters()]
    if first_trained is not None:
        # timm's feature wrappers flatten nested stages ("stages.1" -> "stages_1")
        for candidate in (first_trained, first_trained.replace(".", "_")):
            if any(n.startswith(candidate + ".") for n in names):
                first_trained = candidate
                break
        else:
            log.warning("backbone: stage %r not found, no backbone parameter frozen", first_trained)
            return
    trained = False
    for pname, p in body.named_parameters():
        if first_trained is not None and pname.startswith(first_trained + "."):
            trained = True
        p.requires_grad_(trained)


def _load_imagenet(resnet: nn.Module, name: str, pretrained: bool | str | Path) -> None:
    if pretrained is True:
        from visiontf.downloads import DownloadError, check_torch_hub_download

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
        raise RuntimeError(
            f"{source}: backbone weights do not fit: missing {len(missing)} keys (e.g. {missing[:5]}), "
            f"unexpected {len(unexpected)} (e.g. {unexpected[:5]}). Expected an ImageNet checkpoint of the same "
            "architecture with torchvision/timm key names."
        )
    module.load_state_dict(state, strict=False)
    log.info("backbone: loaded %d tensors from %s, ignored %d classifier/counter tensors", len(state), source, len(dropped))


def _stage_channels(stage: nn.Sequential) -> int:
    """Output channels of a torchvision ResNet stage (its last block's last BN)."""
    block = stage[-1]
    return (block.bn3 if hasattr(block, "bn3") else block.bn2).weight.numel()


def _timm_body(
    name: str, dilation: bool, pretrained: bool | str | Path | None, frozen_bn: bool = True, out_indices: tuple[int, ...] | None = None
) -> nn.Module:
    import timm
    from timm.layers import freeze_batch_norm_2d

    kwargs = {"output_stride": 16} if dilation else {}
    if pretrained is True:
        raise ValueError(
            f"backbone_pretrained=True is only for torchvision ResNets; for timm:{name} save "
            f"timm.create_model('{name}', pretrained=True).state_dict() and pass its path"
        )
    indices = (-1,) if out_indices is None else tuple(out_indices)
    body = timm.create_model(name, features_only=True, out_indices=indices, pretrained=False, **kwargs)
    if pretrained:
        _load_backbone_state(body, load_state_dict_file(pretrained), str(pretrained))
    if frozen_bn:
        body = freeze_batch_norm_2d(body)
    return body


def _timm_first_trained_module(body: nn.Module) -> str | None:
    """Module of the stride-8 stage: everything before it (stem + first stage) stays frozen."""
    for info in body.feature_info.info:
        if info["reduction"] >= 8:
            return info["module"]
    return None
