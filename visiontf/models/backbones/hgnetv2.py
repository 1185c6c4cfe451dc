"""HGNetv2 (PaddlePaddle's PP-HGNetV2), the backbone of D-FINE and DEIM (B0 to B6).

A stem of five convolutions (two 2x2 ones on a branch beside a 2x2 max-pool, strides 4 in all) and four stages of
HG blocks: each block runs ``layers`` convolutions in a chain (3x3, or in the "light" stages a 1x1 and a depthwise
5x5), concatenates its input with every intermediate output, and aggregates them with two 1x1 convolutions
(squeeze to half the output width, then excite to it); every block but a stage's first adds its input back. Stages
2-4 start with a depthwise 3x3 stride-2 convolution. ``use_lab`` puts a learnable scale and shift after every
activation (B0-B3 in their ImageNet training).

timm builds the same network (``timm.models.hgnet.HighPerfGpuNet``, its ``hgnetv2_b*`` names; the stage tables
here are timm's) with the same module names as D-FINE's ``HGNetv2`` (``stem.stem1.conv``, ``stages.2.blocks.1.
layers.0.conv1.bn``, ``...aggregation.0.lab.scale``), so the original's ImageNet files
(``PPHGNetV2_B*_stage1.pth``) and the ``backbone.`` part of its detectors load under ``body.`` unchanged.
transformers' ``HGNetV2Backbone`` names the same tensors otherwise (``embedder.stem1.convolution``,
``encoder.stages.0.blocks.0.layers.0.normalization``): :func:`transformers_hgnetv2_to_timm` maps them.
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

__all__ = ["HGNETV2_NAMES", "HGNetV2Backbone", "hgnetv2_arch", "hgnetv2_backbone", "hgnetv2_state", "transformers_hgnetv2_to_timm"]

#: the names ``build_backbone`` takes (any detector's ``backbone=``) -> the architecture
HGNETV2_NAMES = {f"hgnetv2_b{i}": f"B{i}" for i in range(7)}
#: the architectures trained with the learnable affine blocks (D-FINE's N/S/M configs and timm's b0-b3)
USE_LAB = ("B0", "B1", "B2", "B3")


def hgnetv2_arch(name: str) -> tuple[tuple[int, int], tuple[tuple, ...]]:
    """``(stem (mid, out) widths, four stage rows)`` of architecture ``"B0"``..``"B6"``; a stage row is
    ``(in, mid, out, blocks, downsample, light, kernel, layers)`` (timm's and D-FINE's tables, one and the same)."""
    from timm.models.hgnet import model_cfgs

    key = f"hgnetv2_{name.lower()}"
    if key not in model_cfgs:
        raise ValueError(f"HGNetv2 architecture must be one of B0..B6, got {name!r}")
    cfg = model_cfgs[key]
    return tuple(cfg["stem_chs"]), tuple(tuple(cfg[f"stage{i}"]) for i in range(1, 5))


class HGNetV2Backbone(Backbone):
    """HGNetv2 as a :class:`~visiontf.models.backbones.backbone.Backbone` (timm's ``HighPerfGpuNet`` under ``body.``).

    Args:
        arch: ``"B0"``..``"B6"`` (D-FINE N/S: B0, M: B2, L: B4, X: B5).
        out_stages: the stages whose outputs are returned, 1..4 (strides 4, 8, 16, 32); D-FINE uses (2, 3, 4) (its
            ``return_idx`` [1, 2, 3]), its N model (3, 4).
        use_lab: learnable affine blocks after the activations (D-FINE N/S/M: True; L/X: False).
        frozen_bn: FrozenBatchNorm everywhere (D-FINE L/X, ``freeze_norm``); False trains ordinary BatchNorm.
        freeze_at: -1 trains every parameter (D-FINE N/S/M), 0 freezes the stem (L/X), k > 0 also the first k stages.
        stem, stages: an architecture of other widths (the tests' toy networks): the stem's (mid, out) widths and
            four stage rows as in :func:`hgnetv2_arch`; None: ``arch``'s.
        pretrained: a local ImageNet file in D-FINE's layout (``PPHGNetV2_B4_stage1.pth``; also timm's, the same
            names) or transformers'; True is refused (the originals' files are GitHub release assets).
        channels_last: run in channels-last memory format (faster convolutions on CPUs); inference on the CPU runs
            in it anyway (:func:`~visiontf.nn.cpu_convolution.conv_layout`).
    """

    def __init__(
        self,
        arch: str = "B4",
        out_stages: Sequence[int] = (2, 3, 4),
        use_lab: bool = False,
        frozen_bn: bool = True,
        freeze_at: int = 0,
        stem: Sequence[int] | None = None,
        stages: Sequence[Sequence] | None = None,
        pretrained: bool | str | Path | None = None,
        channels_last: bool = False,
    ) -> None:
        super().__init__()
        from timm.models.hgnet import HighPerfGpuNet

        default_stem, default_stages = hgnetv2_arch(arch)
        stem = tuple(int(c) for c in (default_stem if stem is None else stem))
        rows = tuple(tuple(r) for r in (default_stages if stages is None else stages))
        picked = tuple(int(s) for s in out_stages)
        if len(stem) != 2 or len(rows) != 4 or any(len(r) != 8 for r in rows):
            raise ValueError(f"HGNetv2 takes a stem of 2 widths and 4 stage rows of 8 fields, got {stem} and {rows}")
        if not picked or picked != tuple(sorted(set(picked))) or not set(picked) <= {1, 2, 3, 4}:
            raise ValueError(f"out_stages must be increasing stages among 1..4 (strides 4..32), got {tuple(out_stages)}")
        if not -1 <= freeze_at <= 4:
            raise ValueError(f"freeze_at must be -1 (nothing frozen), 0 (the stem) or 1..4 (the stem and that many stages), got {freeze_at}")
        cfg = {"stem_type": "v2", "stem_chs": list(stem), **{f"stage{i + 1}": list(r) for i, r in enumerate(rows)}}
        body = HighPerfGpuNet(cfg, num_classes=0, head_hidden_size=None, use_lab=use_lab)
        del body.head
        body.stages = body.stages[: max(picked)]  # stages after the last one returned are never run
        self.arch, self.stages = arch, picked
        strides, stride = [], 4
        for row in rows:
            stride *= 2 if row[4] else 1
            strides.append(stride)
        self.channels = [int(rows[i - 1][2]) for i in picked]
        self.strides = [strides[i - 1] for i in picked]
        # a detector that fuses levels by 2x upsampling (D-FINE's encoder) needs sizes divisible by the coarsest stride
        self.pad_multiple = self.strides[-1]
        self.channels_last = channels_last
        if frozen_bn:
            from timm.layers import freeze_batch_norm_2d  # torchvision's FrozenBatchNorm2d, statistics kept

            body = freeze_batch_norm_2d(body)
        self.body = body
        if pretrained:
            if pretrained is True:
                raise ValueError("HGNetv2 ImageNet weights are D-FINE's release files (Peterande/storage dfinev1.0, "
                                 "PPHGNetV2_B*_stage1.pth): download one and pass its path")
            self.load_imagenet(pretrained)
        if frozen_bn:
            fold_frozen_batchnorm(body)  # the same buffers and state dict; each frozen BN rides on its convolution
        if freeze_at >= 0:
            frozen = ["stem."] + [f"stages.{i}." for i in range(freeze_at)]
            for name, p in body.named_parameters():
                if name.startswith(tuple(frozen)):
                    p.requires_grad_(False)
        replace_max_pool(body.stem, "pool")  # the same values, faster in inference (fast_pool)
        use_onednn_convolutions(body)  # oneDNN for every float32 convolution in inference on the CPU
        if channels_last:
            body.to(memory_format=torch.channels_last)

    def forward_maps(self, images: Tensor) -> list[Tensor]:
        """The maps of ``out_stages``, finest first (``images`` padded by the caller, :meth:`pad`)."""
        images = conv_layout(images, self.channels_last, self.training)
        x = self.body.stem(images)
        maps = []
        for i, stage in enumerate(self.body.stages, start=1):
            x = stage(x)
            if i in self.stages:
                maps.append(x)
        return maps

    def fuse_for_inference(self) -> int:
        """Fold every BatchNorm (ordinary or frozen) into the convolution before it, for inference; returns the folds
        made (0 when called again). The outputs equal the unfolded network's up to float rounding; the state dict
        changes (the BatchNorms are gone), so load weights before folding."""
        from timm.models.hgnet import ConvBNAct

        from visiontf.nn.fold_bn import fold_batchnorms

        return fold_batchnorms(self.body, {ConvBNAct: [("conv", "bn")]})  # timm's ConvBNAct: conv, bn, act, lab in that order

    def load_imagenet(self, path: str | Path) -> None:
        """ImageNet weights from a local file in D-FINE's (timm's) or transformers' layout; its classifier is dropped."""
        state = hgnetv2_state(load_state_dict_file(path))
        kept_stages = len(self.body.stages)
        unused = [k for k in state if k.startswith(("head.", "fc.")) or k.endswith("num_batches_tracked")
                  or (re.match(r"stages\.(\d+)\.", k) and int(k.split(".")[1]) >= kept_stages)]
        state = {k: v for k, v in state.items() if k not in set(unused)}
        loaded = load_fitting_imagenet(self.body, state, path, "HGNetv2", self.arch,
                                       "D-FINE's PPHGNetV2 file of this architecture (or transformers' / timm's layout)")
        log.info("HGNetv2 %s: loaded %d tensors from %s", self.arch, loaded, path)


@register_backbone("hgnetv2", names=HGNETV2_NAMES, examples={"hgnetv2_b0": {}},
                   summary="D-FINE's HGNetv2 (its ImageNet files load)")
def hgnetv2_backbone(name: str, *, out_indices: Sequence[int] | None = None, num_levels: int = 3, min_stride: int = 8,
                     pretrained: bool | str | Path | None = None, train_backbone: bool = True, freeze_stem: bool = True,
                     frozen_stages: int | None = None, frozen_bn: bool = True, channels_last: bool = False,
                     dilation: bool = False, **kwargs) -> HGNetV2Backbone:
    """``build_backbone``'s reading of ``"hgnetv2_b0"``..``"hgnetv2_b6"``: stages numbered 1..4 (strides 4..32), the
    DETR papers' frozen stem (``freeze_stem``) or ``frozen_stages``; ``train_backbone=False`` freezes all; the
    learnable affine blocks where the architecture was trained with them (B0-B3)."""
    if dilation:
        raise ValueError(f"dilation (DC5) is not built for {name}")
    from visiontf.models.backbones.backbone import check_indices, select_levels

    strides = (2, 4, 8, 16, 32)
    indices = select_levels(strides, num_levels, min_stride) if out_indices is None else check_indices(out_indices, strides, name)
    if 0 in indices:
        raise ValueError(f"out_indices={tuple(out_indices or ())}: {name}'s features are its stages 1..4")
    arch = HGNETV2_NAMES[name]
    freeze_at = 4 if not train_backbone else frozen_stages if frozen_stages is not None else (0 if freeze_stem else -1)
    kwargs.setdefault("use_lab", arch in USE_LAB)
    return HGNetV2Backbone(arch, tuple(indices), frozen_bn=frozen_bn, freeze_at=freeze_at, pretrained=pretrained,
                           channels_last=channels_last, **kwargs)


# ------------------------------------------------------------------------------------ foreign layouts
_HF_PARTS = {"convolution": "conv", "normalization": "bn"}


def transformers_hgnetv2_to_timm(key: str) -> str | None:
    """A key of transformers' ``HGNetV2Backbone`` (after ``model.``) as timm's (and D-FINE's) names, or None."""
    if key.startswith("embedder."):
        rest = "stem." + key[len("embedder."):]
    elif key.startswith("encoder.stages."):
        rest = key[len("encoder."):]
    else:
        return None
    parts = rest.split(".")
    return ".".join(_HF_PARTS.get(p, p) for p in parts)


def hgnetv2_state(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """An HGNetv2 state dict in timm's names, from D-FINE's (the same names), timm's or transformers' layout."""
    state = dict(state.get("model", state)) if isinstance(state.get("model"), Mapping) else dict(state)
    if not any(k.startswith(("embedder.", "encoder.stages.")) for k in state):
        return state
    out, unknown = {}, []
    for key, value in state.items():
        new = transformers_hgnetv2_to_timm(key)
        (unknown.append(key) if new is None else out.__setitem__(new, value))
    if unknown:
        raise WeightsError(f"HGNetv2 weights: keys of no known HGNetv2 layout: {', '.join(unknown[:5])}")
    return out
