"""What every model declares to the layers above it: one pretrained config shape and one base per kind.

The upper layers (adapters, tasks, detection, inference, checkpoints) read a model's attributes by
name. Those names and their defaults are declared once here, as timm declares ``PretrainedCfg`` and
its models' ``default_cfg``:

* :class:`PretrainedCfg`: a frozen, typed record of a variant's published eval settings (input size,
  normalisation, crop, a detector's resize bounds, a segmenter's sliding window, a restorer's tiles,
  a tokenizer's code book), the same shape for every family. A model holds its own as
  ``model.pretrained_cfg``; the adapters turn it into eval preprocessing (:meth:`PretrainedCfg.to_dict`).
* :class:`ModelCfg`: one registered name's entry of a family's ``DEFAULT_CFGS``: the constructor
  keyword arguments and the :class:`PretrainedCfg` of that variant.
* :class:`VisionModel` and one subclass per kind (:class:`Classifier`, :class:`Detector`,
  :class:`Segmenter`, :class:`Restorer`, :class:`Tokenizer`, :class:`Generator`,
  :class:`DepthEstimator`): the attributes the layers above read, with their defaults. A family subclasses its kind and overrides what differs.
* :class:`AttentionRollout`: an optional capability (a ViT's ``forward_attention``), checked with
  ``isinstance``.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor, nn

from visiontf.models.mask_options import MaskOptions
from visiontf.models.postprocess_options import PostprocessOptions


@dataclass(frozen=True)
class PretrainedCfg:
    """A variant's published settings, in one shape for every family (timm's ``PretrainedCfg`` idea).

    Every field is optional (None: the family has no such setting); :meth:`to_dict` gives the
    ``pretrained_cfg`` keys the adapters, checkpoints and exports read, without the unset ones.
    """

    # where the published weights are: a direct download or the page that has them; timm's weight name
    url: str | None = None
    hf_hub_id: str | None = None
    # normalisation of [0, 1] RGB input
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    # classifiers and tokenizers: (C, H, W) the model was trained at, the centre crop, the resize's filter
    input_size: tuple[int, int, int] | None = None
    crop_pct: float | None = None
    interpolation: str | None = None
    # detectors: shorter side resized to min_size, longer side at most max_size
    min_size: int | None = None
    max_size: int | None = None
    # segmenters: "whole" or "slide" windows of crop_size every stride; keep-ratio resize (long, short) first
    test_mode: str | None = None
    crop_size: tuple[int, int] | None = None
    stride: tuple[int, int] | None = None
    resize: tuple[int, int] | None = None
    # restorers: the value range the network works in, its tasks and scales, its window tiling, scoring
    rgb_range: float | None = None
    input_range: tuple[float, float] | None = None
    tasks: tuple[str, ...] | None = None
    scale: int | tuple[int, ...] | None = None
    tile_size: int | None = None
    tile_stride: int | None = None
    shave: int | None = None
    crop_batch_size: int | None = None
    self_ensemble: bool | None = None
    psnr: str | None = None
    # tokenizers: code book size, pixels per code along each side
    num_codes: int | None = None
    downsample_factor: int | None = None

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @classmethod
    def coerce(cls, value: PretrainedCfg | Mapping[str, Any] | None, where: str = "pretrained_cfg") -> PretrainedCfg:
        """``value`` as a PretrainedCfg: a config file's mapping (lists become tuples) or None (all unset)."""
        if value is None:
            return cls()
        if isinstance(value, PretrainedCfg):
            return value
        if not isinstance(value, Mapping):
            raise TypeError(f"{where}: expected a mapping of pretrained_cfg keys or a PretrainedCfg, got {type(value).__name__}")
        unknown = sorted(set(value) - set(cls.field_names()))
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {unknown}; a pretrained_cfg takes {', '.join(cls.field_names())}")
        return cls(**{k: _frozen(v) for k, v in value.items()})

    def merged(self, overrides: PretrainedCfg | Mapping[str, Any] | None) -> PretrainedCfg:
        """This config with every setting ``overrides`` sets (not None) on top."""
        given = PretrainedCfg.coerce(overrides)
        return dataclasses.replace(self, **{k: v for k, v in given.to_dict().items()})

    def to_dict(self) -> dict[str, Any]:
        """The settings that are set, as ``pretrained_cfg`` keys (what adapters and checkpoints read)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}


def _frozen(value: Any) -> Any:
    """Lists from a config file as tuples, so a config equals the one built in code."""
    return tuple(_frozen(v) for v in value) if isinstance(value, list) else value


@dataclass(frozen=True)
class ModelCfg:
    """One entry of a family's ``DEFAULT_CFGS``: constructor keyword arguments and the variant's settings."""

    kwargs: Mapping[str, Any]
    pretrained_cfg: PretrainedCfg = field(default_factory=PretrainedCfg)


def build_model(cls: Callable[..., nn.Module], cfg: ModelCfg, **kwargs: Any) -> nn.Module:
    """``cls(**cfg.kwargs, **kwargs)`` with ``pretrained_cfg`` = the entry's, the caller's on top."""
    pretrained = cfg.pretrained_cfg.merged(kwargs.pop("pretrained_cfg", None))
    return cls(**{**cfg.kwargs, **kwargs}, pretrained_cfg=pretrained)


class VisionModel(nn.Module):
    """What every registered model declares (kinds below add theirs). Defaults hold for a model that
    does not override them."""

    #: the model's eval settings; each family sets its own in ``__init__``
    pretrained_cfg: PretrainedCfg = PretrainedCfg()
    #: tensors whose shape follows the class count: left at init when fine-tuning to other classes
    head_prefixes: tuple[str, ...] = ()
    #: object classes of the head, None for models without classes
    num_classes: int | None = None
    #: set by ``create_model``: the registered name and the keyword arguments it was built with
    model_name: str | None = None
    model_kwargs: Mapping[str, Any] = MappingProxyType({})
    #: ``state -> {setting: value}`` read from a state dict in the model's names (the DETR family), so that
    #: weights of another architecture are refused by the setting that differs; None: shapes judge
    weights_settings: Callable[[Mapping[str, Tensor]], dict[str, int]] | None = None
    #: the config section that holds those settings (the refusal spells the fix in it); None: top-level keywords
    weights_settings_section: str | None = None

    def no_weight_decay(self) -> set[str]:
        """Parameter names trained without weight decay besides biases and norms (timm's convention)."""
        return set()

    def param_group(self, name: str) -> str:
        """The learning-rate group of a parameter; the tasks map group names to learning rates."""
        return "default"

    def layer_depth(self, name: str) -> tuple[int, int] | None:
        """(layer id, number of layers) of a parameter for layer-wise learning-rate decay (ViTDet's
        ``lr * decay ** (layers + 1 - id)``); None (the default): no decay for it."""
        return None


class Classifier(VisionModel):
    """Images (B, 3, H, W) -> logits (B, K)."""

    num_classes: int = 0
    head_prefixes = ("head.",)
    #: a DeiT distillation head: training returns (class, distillation) logits
    distilled: bool = False
    #: tokens before the patch tokens (class, distillation): attention rollout drops them
    num_prefix_tokens: int = 1

    def input_size_error(self, size: tuple[int, int]) -> str | None:
        """Why the model cannot take images of ``size`` (H, W), in words, or None when it can (the default: any
        size). The inference tools check the eval settings' ``input_size`` with it before any image is read."""
        return None


class Detector(VisionModel):
    """Images (B, 3, H, W), padding mask (B, H, W) -> ``{"pred_logits", "pred_boxes", ...}``."""

    num_classes: int = 0
    #: how logits become scores: "softmax" (K + 1, the last "no object") or "sigmoid" (K, focal loss);
    #: picks the matcher, the loss and the post-processing (visiontf.set_prediction)
    class_head: str = "softmax"
    #: training steps pass the batch's targets (denoising queries are built from them)
    forward_takes_targets: bool = False
    #: which attention picture ``tools/predict.py --attention`` draws: "maps" or "sampling_points"
    attention_picture: str = "maps"
    #: post-processing settings (replaced at evaluation by visiontf.set_prediction.set_postprocess)
    postprocess_options: PostprocessOptions = PostprocessOptions()
    #: a mask head's post-processing settings; None: the detector predicts no masks (``pred_masks``)
    mask_options: MaskOptions | None = None

    def transformer_modules(self) -> tuple[nn.Module, ...]:
        """The encoder-decoder, the part a task's ``compile: transformer`` compiles (the backbone and the
        post-processing stay eager)."""
        raise NotImplementedError(f"{type(self).__name__} does not say which modules are its transformer "
                                  "(transformer_modules()): compile the whole model (compile: true) instead")


def check_detection_targets(targets: Sequence[Mapping[str, Tensor]], batch_size: int, who: str) -> None:
    """The targets a :class:`Detector` trains on: one mapping per image, with ``labels`` (N,) and ``boxes`` (N, 4),
    normalised ``(cx, cy, w, h)`` in [0, 1] (the data modules' transforms give them so). Boxes in pixels, of negative
    size or not finite trained without a word on losses a thousand times too large, or were blamed on the model
    (its denoising queries, built from a NaN box, spread it to the others)."""
    if len(targets) != batch_size:
        raise ValueError(f"{who}: {len(targets)} target dict(s) for a batch of {batch_size} images; give one per image "
                         "(an image without objects has empty 'labels' and 'boxes')")
    boxes = []
    for i, target in enumerate(targets):
        if "labels" not in target or "boxes" not in target:
            raise KeyError(f"{who}: target {i} needs 'labels' and 'boxes', got keys {sorted(target)}")
        boxes.append(target["boxes"].reshape(-1, 4) if target["boxes"].numel() else target["boxes"].reshape(0, 4))
        if boxes[-1].shape[0] != len(target["labels"]):
            raise ValueError(f"{who}: target {i} has {len(target['labels'])} labels but {boxes[-1].shape[0]} boxes")
    if not any(b.shape[0] for b in boxes):
        return
    # one test of every box, one device sync a step; the image and its values only once something is wrong
    every = torch.cat(boxes).detach()
    wrong = ~torch.isfinite(every).all(1) | (every < -0.01).any(1) | (every > 1.01).any(1) | (every[:, 2:] < 0).any(1)
    if not bool(wrong.any()):
        return
    i = next(i for i, rows in enumerate(torch.split(wrong, [b.shape[0] for b in boxes])) if rows.any())
    finite = bool(torch.isfinite(boxes[i]).all())
    low, high = (float(v) for v in torch.aminmax(boxes[i].detach().float())) if finite else (0.0, 0.0)
    raise ValueError(
        f"{who}: target {i}'s boxes are not normalised (cx, cy, w, h) in [0, 1] with w, h >= 0 (values "
        f"{'not finite' if not finite else f'from {low:g} to {high:g}'}); divide pixel boxes by the image's width "
        "and height, and fix or drop boxes of NaN or negative size")


class Segmenter(VisionModel):
    """Images (B, 3, H, W) -> per-pixel logits (B, K, H, W) (training may add auxiliary outputs)."""

    num_classes: int = 0
    #: weight of the auxiliary heads' loss
    aux_weight: float = 0.4

    def inference(self, images: Tensor, mode: str | None = None, crop: Any = None, stride: Any = None) -> Tensor:
        """Main-head logits at the input size, as evaluation runs the model: ``mode`` "whole" (the default
        here) or, for models that override this, "slide" windows of ``crop`` every ``stride``."""
        if mode not in (None, "whole"):
            raise ValueError(f"{type(self).__name__} runs whole images only, not inference mode {mode!r}")
        return self(images)


class Restorer(VisionModel):
    """Images (B, 3, H, W) in [0, 1] and a task -> restored images (B, 3, H*s, W*s) in [0, 1]."""

    #: the restoration tasks the model has heads for, and each one's upscaling factor
    tasks: tuple[str, ...] = ("restore",)
    scales: tuple[int, ...] = (1,)
    #: the window the model works on (larger images are tiled); the ONNX export's size
    tile_size: int = 48
    #: average the x8 flips and transposes at inference
    self_ensemble: bool = False


class Tokenizer(VisionModel):
    """An image tokenizer: images (B, 3, H, W) in [-1, 1] <-> codes (B, H/f, W/f)."""

    num_codes: int = 0
    downsample_factor: int = 1

    def tokenize(self, images: Tensor) -> Tensor:
        raise NotImplementedError(f"{type(self).__name__} does not define tokenize(images)")

    def detokenize(self, codes: Tensor) -> Tensor:
        raise NotImplementedError(f"{type(self).__name__} does not define detokenize(codes)")

    def last_layer(self) -> Tensor:
        """The weight the adversarial loss is balanced at (taming's adaptive weight)."""
        raise NotImplementedError(f"{type(self).__name__} does not define last_layer()")


class Generator(VisionModel):
    """A second stage over a tokenizer's codes: samples codes, which its first stage decodes."""

    def sample(self, batch: int, latent_shape: tuple[int, int], labels: Tensor | None = None, **kwargs: Any) -> Tensor:
        raise NotImplementedError(f"{type(self).__name__} does not define sample(...)")

    def decode_to_img(self, indices: Tensor) -> Tensor:
        raise NotImplementedError(f"{type(self).__name__} does not define decode_to_img(indices)")


class DepthEstimator(VisionModel):
    """Images (B, 3, H, W) -> depth (B, 1, H, W) in metres, in (0, ``max_depth``)."""

    #: the largest depth the model predicts (its output's range)
    max_depth: float = 10.0


#: every kind (each base above), for checks and error messages
MODEL_KINDS: tuple[type[VisionModel], ...] = tuple(VisionModel.__subclasses__())


@runtime_checkable
class AttentionRollout(Protocol):
    """A model whose attention rollout can be drawn (a ViT): per-block (B, N, N) attention weights."""

    num_prefix_tokens: int

    def forward_attention(self, x: Tensor) -> Sequence[Tensor]: ...


__all__ = ["AttentionRollout", "Classifier", "DepthEstimator", "Detector", "Generator", "MODEL_KINDS", "ModelCfg", "PretrainedCfg",
           "Restorer", "Segmenter", "Tokenizer", "VisionModel", "build_model", "check_detection_targets"]
