"""SETR from typed sections: the torchvision-style builder of the family.

:class:`~visiontf.models.setr.setr.SETR` takes its parts (the encoder, the decode head, the auxiliary heads and,
for MLA, the neck), as torchvision's ``FCOS(backbone, ...)`` takes its backbone. :func:`build_setr` makes them from
three sections named after the model's own attributes, so a config reads as the object graph::

    model_kwargs:
      encoder: {name: vit_large_patch16_384, img_size: 512, kwargs: {patch_bias: false}}   # SetrEncoderOptions
      decode_head: {kind: pup, num_convs: 4, up_scale: 2, kernel_size: 3, norm: syncbn}   # SetrHeadOptions
      aux_heads: {in_index: [0, 1, 2], num_convs: 2, kernel_size: 3, weight: 0.4}          # SetrAuxOptions

Each section is its dataclass or a mapping of its fields, read by name on top of the variant's ``DEFAULT_CFGS``
entry (a variant config sets only what differs; another encoder name keeps none of the variant's encoder
``kwargs``, the same name merges them). ``encoder`` may also be a name (``encoder: "timm:convnext_tiny"``) or an
injected :class:`~visiontf.models.backbones.backbone.Backbone`. The 25 flat keywords of before the sections
(``decoder=``, ``img_size=``, ``aux_in_index=``, ``encoder_kwargs=``, ...: old configs and checkpoints' saved
hyper-parameters) still build the same model, moved into their sections by name (:data:`FLAT_SETR_KEYWORDS`) with
one ``FutureWarning`` naming the nested spelling.

The encoder is one of two kinds, which only this builder tells apart: a visiontf ViT name builds mmseg's
encoder (exact to mmsegmentation: no final norm, LayerNorm eps 1e-6, block taps ``out_indices``); any other
backbone goes through :mod:`~visiontf.models.setr.setr_backbone` (its own maps, ``out_indices`` being its
feature indices).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

from torch import nn

from visiontf.models._registry import create_model
from visiontf.models.backbones.backbone import Backbone
from visiontf.models.contract import PretrainedCfg
from visiontf.models.sections import Sections
from visiontf.models.setr.heads import ClassifierHead, MLAHead, MLANeck, UpHead, norm_layer
from visiontf.models.setr.setr_backbone import is_setr_vit, setr_backbone

__all__ = ["FLAT_SETR_KEYWORDS", "SETR_SECTIONS", "SetrAuxOptions", "SetrEncoderOptions", "SetrHeadOptions", "build_setr",
           "default_out_indices"]

#: SETR or a subclass (bound loosely: the model module imports this one)
M = TypeVar("M", bound=nn.Module)

DECODERS = ("naive", "pup", "mla")


def _tuple(value: Sequence[int] | None) -> tuple[int, ...] | None:
    return None if value is None else tuple(int(i) for i in value)


@dataclass(frozen=True)
class SetrEncoderOptions:
    """SETR's encoder (``encoder:`` in a config).

    Args:
        name: a visiontf ViT name (mmseg's encoder, exact), any other backbone name (``"timm:<name>"``, a DINO Swin:
            :mod:`~visiontf.models.setr.setr_backbone`), or an injected :class:`Backbone`.
        img_size: the training crop: the ViT's ``pos_embed`` grid, and the model's ``pretrained_cfg`` crop.
        out_indices: the ViT blocks (0-based) whose tokens the heads read (mmseg's ``out_indices``), or another
            backbone's feature indices; None: :func:`default_out_indices` (a ViT), the backbone's default (others).
        with_cls_token: keep the class token in the ViT's attention; None: mmseg's (False for MLA only).
        pos_embed_interp: how ``pos_embed`` is resized to other grids (mmseg's ``interpolate_mode``).
        drop_path_rate: stochastic depth of the encoder.
        pretrained: a timm / visiontf ViT checkpoint for a ViT encoder (classifier and final norm dropped,
            ``pos_embed`` resized to the crop grid); for another backbone, its own ``pretrained``.
        kwargs: the encoder's own keywords (``patch_bias``, ``depth``, ``patch_size``; timm's ``create_model`` keywords).
    """

    name: str | Backbone = "vit_large_patch16_384"
    img_size: int | tuple[int, int] = 512
    out_indices: tuple[int, ...] | None = None
    with_cls_token: bool | None = None
    pos_embed_interp: str = "bilinear"
    drop_path_rate: float = 0.0
    pretrained: str | Path | None = None
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.name, Backbone) and (not isinstance(self.name, str) or not self.name):
            raise TypeError(f"encoder.name must be a ViT or backbone name such as 'vit_large_patch16_384' or "
                            f"'timm:convnext_tiny', got {self.name!r}")
        object.__setattr__(self, "out_indices", _tuple(self.out_indices))
        if not isinstance(self.img_size, int):
            object.__setattr__(self, "img_size", tuple(int(s) for s in self.img_size))
        object.__setattr__(self, "kwargs", dict(self.kwargs or {}))


@dataclass(frozen=True)
class SetrHeadOptions:
    """SETR's decode head (``decode_head:`` in a config); ``norm`` and ``align_corners`` hold for every head.

    Args:
        kind: ``"naive"`` | ``"pup"`` (mmseg's ``SETRUPHead``) or ``"mla"`` (``MLANeck`` + ``SETRMLAHead``).
        in_index: which of the encoder's ``out_indices`` the Naive/PUP head reads.
        num_convs, up_scale, kernel_size: the up-head (Naive 1/4/1, PUP 4/2/3); MLA uses ``up_scale`` only.
        channels: conv width of the up-heads and of the MLA neck (256).
        mla_channels: per-level width of the MLA head (128).
        norm: ``"bn"`` or ``"syncbn"`` (mmseg's SyncBN across GPUs).
        align_corners: of every bilinear resize of logits.
    """

    kind: Literal["naive", "pup", "mla"] = "naive"
    in_index: int = -1
    num_convs: int = 1
    up_scale: int = 4
    kernel_size: int = 1
    channels: int = 256
    mla_channels: int = 128
    norm: Literal["bn", "syncbn"] = "bn"
    align_corners: bool = False

    def __post_init__(self) -> None:
        if self.kind not in DECODERS:
            raise ValueError(f"decode_head.kind={self.kind!r}: SETR's decoder is 'naive', 'pup' or 'mla'")


@dataclass(frozen=True)
class SetrAuxOptions:
    """SETR's auxiliary heads, training only (``aux_heads:`` in a config); MLA's are 1x1 classifiers.

    Args:
        in_index: the taps (Naive/PUP) or MLA outputs read, one head each; None: every tap but the last (Naive/PUP),
            every MLA output.
        num_convs, up_scale, kernel_size: each Naive/PUP auxiliary up-head.
        weight: the auxiliary loss weight the task reads (mmseg's 0.4).
    """

    in_index: tuple[int, ...] | None = None
    num_convs: int = 2
    up_scale: int = 4
    kernel_size: int = 1
    weight: float = 0.4

    def __post_init__(self) -> None:
        object.__setattr__(self, "in_index", _tuple(self.in_index))


#: the flat keywords of ``SETR(...)`` before the sections -> (section, field), by name
FLAT_SETR_KEYWORDS: dict[str, tuple[str, str]] = {
    "img_size": ("encoder", "img_size"), "out_indices": ("encoder", "out_indices"),
    "with_cls_token": ("encoder", "with_cls_token"), "pos_embed_interp": ("encoder", "pos_embed_interp"),
    "drop_path_rate": ("encoder", "drop_path_rate"), "encoder_pretrained": ("encoder", "pretrained"),
    "encoder_kwargs": ("encoder", "kwargs"),
    "decoder": ("decode_head", "kind"), "in_index": ("decode_head", "in_index"), "num_convs": ("decode_head", "num_convs"),
    "up_scale": ("decode_head", "up_scale"), "kernel_size": ("decode_head", "kernel_size"),
    "channels": ("decode_head", "channels"), "mla_channels": ("decode_head", "mla_channels"),
    "norm": ("decode_head", "norm"), "align_corners": ("decode_head", "align_corners"),
    "aux_in_index": ("aux_heads", "in_index"), "aux_num_convs": ("aux_heads", "num_convs"),
    "aux_up_scale": ("aux_heads", "up_scale"), "aux_kernel_size": ("aux_heads", "kernel_size"),
    "aux_weight": ("aux_heads", "weight"),
}


def _fields(value: Any) -> Any:
    """A section as a mapping of its fields; an encoder name or injected backbone as ``{name: ...}``."""
    if isinstance(value, (str, Backbone)):
        return {"name": value}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    return value


@dataclass(frozen=True)
class SetrSections(Sections):
    """:class:`~visiontf.models.sections.Sections` with SETR's flat keywords (:data:`FLAT_SETR_KEYWORDS`) and an
    ``encoder`` section that may be a name and merges its ``kwargs`` as a backbone spec does."""

    def flat_keywords(self) -> dict[str, tuple[str, str]]:
        return dict(FLAT_SETR_KEYWORDS)

    def merge(self, base: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
        overrides = dict(overrides)
        if "encoder" in overrides:
            old, new = _fields(base.get("encoder")), _fields(overrides["encoder"])
            if isinstance(old, Mapping) and isinstance(new, Mapping):
                if new.get("name", old.get("name")) != old.get("name"):
                    old = {k: v for k, v in old.items() if k != "kwargs"}  # another encoder: none of the old one's kwargs
                elif isinstance(old.get("kwargs"), Mapping) and isinstance(new.get("kwargs"), Mapping):
                    new = {**new, "kwargs": {**old["kwargs"], **new["kwargs"]}}
                base, overrides["encoder"] = {**base, "encoder": old}, {**old, **new}
        return super().merge(base, overrides)

    def section(self, name: str, value: Any) -> Any:
        if name == "encoder" and isinstance(value, (str, Backbone)):
            value = {"name": value}
        return super().section(name, value)


#: the builder's typed sections
SETR_SECTIONS = SetrSections(
    {"encoder": SetrEncoderOptions, "decode_head": SetrHeadOptions, "aux_heads": SetrAuxOptions},
    {"encoder": SetrEncoderOptions(), "decode_head": SetrHeadOptions(), "aux_heads": SetrAuxOptions()},
)


def default_out_indices(depth: int, decoder: str) -> tuple[int, ...]:
    """mmseg's taps for ViT-L (24 blocks); quarters of the depth otherwise (ViT-B: blocks 3/6/9/12)."""
    if depth == 24:
        return (5, 11, 17, 23) if decoder == "mla" else (9, 14, 19, 23)
    if depth % 4 == 0:
        q = depth // 4
        return (q - 1, 2 * q - 1, 3 * q - 1, depth - 1)
    raise ValueError(f"no default taps for a {depth}-block encoder; pass encoder.out_indices")


def build_encoder(options: SetrEncoderOptions, kind: str) -> tuple[nn.Module, tuple[int, ...] | None, list[int]]:
    """(the encoder, its ViT block taps or None for another backbone, the channels of each tap)."""
    if not is_setr_vit(options.name):  # any other backbone: visiontf.models.setr.setr_backbone
        extra = {"drop_path_rate": options.drop_path_rate} if options.drop_path_rate else {}
        encoder = setr_backbone(options.name, options.out_indices, kind, options.pretrained, {**options.kwargs, **extra})
        return encoder, None, list(encoder.channels)
    encoder = create_model(options.name, num_classes=0, img_size=options.img_size, drop_path_rate=options.drop_path_rate,
                           norm_eps=1e-6, **options.kwargs)
    if encoder.distilled:
        raise ValueError(f"encoder.name={options.name!r} has a distillation token; SETR's encoder has the class token only")
    # the heads normalise their own taps (mmseg's final_norm=False): the encoder's final LN would be unused
    encoder.norm = nn.Identity()
    depth = len(encoder.blocks)
    taps = default_out_indices(depth, kind) if options.out_indices is None else options.out_indices
    taps = tuple(int(i) % depth for i in taps)
    return encoder, taps, [encoder.embed_dim] * len(taps)


def build_setr(
    model_cls: type[M],
    /,
    num_classes: int = 150,
    encoder: SetrEncoderOptions | Mapping[str, Any] | str | Backbone | None = None,
    decode_head: SetrHeadOptions | Mapping[str, Any] | None = None,
    aux_heads: SetrAuxOptions | Mapping[str, Any] | None = None,
    new_classifier: bool = False,
    pretrained_cfg: PretrainedCfg | Mapping[str, Any] | None = None,
    **flat: Any,
) -> M:
    """``model_cls`` (:class:`~visiontf.models.setr.setr.SETR` or a subclass) from its sections (module doc);
    ``flat``: the keywords of before the sections, read into them by name with one ``FutureWarning``.

    The parts are made in the order SETR made them itself (encoder; MLA neck; decode head; auxiliary heads), so a
    seed gives the same weights.
    """
    S = SETR_SECTIONS
    given, rest = S.migrate({"encoder": encoder, "decode_head": decode_head, "aux_heads": aux_heads}, flat)
    if rest:
        raise TypeError(f"build_setr: unknown keyword(s) {sorted(rest)}; SETR takes num_classes, encoder, decode_head, "
                        f"aux_heads, new_classifier, pretrained_cfg (or the flat keywords {sorted(FLAT_SETR_KEYWORDS)})")
    enc, head, aux = (S.section(k, given[k]) for k in ("encoder", "decode_head", "aux_heads"))
    if num_classes < 1:
        raise ValueError(f"num_classes={num_classes}; a segmentation model needs at least one class")
    body, taps, dims = build_encoder(enc, head.kind)
    n = len(dims)
    aux_index = aux.in_index if aux.in_index is not None else tuple(range(n)) if head.kind == "mla" else tuple(range(n - 1))
    aux_index = tuple(int(i) % n for i in aux_index)
    in_index = int(head.in_index) % n
    bn = norm_layer(head.norm)
    neck: nn.Module | None = None
    if head.kind == "mla":
        if n < 2:
            raise ValueError(f"MLA aggregates several blocks; got encoder.out_indices={taps if taps is not None else enc.out_indices}")
        neck = MLANeck(dims[0], head.channels, n, bn)
        decoder: nn.Module = MLAHead(head.channels, head.mla_channels, num_classes, n, head.up_scale, bn, head.align_corners)
        auxiliary = nn.ModuleList(ClassifierHead(head.channels, num_classes) for _ in aux_index)
    else:
        decoder = UpHead(dims[in_index], head.channels, num_classes, head.num_convs, head.up_scale, head.kernel_size, bn,
                         head.align_corners)
        auxiliary = nn.ModuleList(UpHead(dims[i], head.channels, num_classes, aux.num_convs, aux.up_scale, aux.kernel_size,
                                         bn, head.align_corners) for i in aux_index)
    with_cls_token = (head.kind != "mla") if enc.with_cls_token is None else bool(enc.with_cls_token)
    model = model_cls(body, decoder, auxiliary, neck, num_classes=num_classes, out_indices=taps, in_index=in_index,
                 aux_in_index=aux_index, with_cls_token=with_cls_token, pos_embed_interp=enc.pos_embed_interp,
                 aux_weight=aux.weight, align_corners=head.align_corners, crop_size=enc.img_size,
                 new_classifier=new_classifier, pretrained_cfg=pretrained_cfg)
    if enc.pretrained and taps is not None:
        model.load_encoder(enc.pretrained)
    return model
