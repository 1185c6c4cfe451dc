"""Map checkpoints onto :class:`visiontf.models.setr.setr.SETR`: mmsegmentation's SETR, bare ViTs, visiontf's own.

Recognised layouts (detected from the keys):

* mmsegmentation's SETR checkpoints (``{"meta", "state_dict"}`` files of its model zoo, keys
  ``backbone.layers.N.attn.attn.in_proj_weight``, ``decode_head.*``, ``auxiliary_head.N.*``, ``neck.*``):
  the backbone is renamed to timm's ViT names, ``conv_seg`` to ``cls_seg`` and ``auxiliary_head`` to
  ``aux_heads``; every other decoder name is already mmseg's;
* a bare timm / visiontf ViT (``patch_embed.proj.weight``, ``blocks.N.*``): it initialises the encoder,
  its classifier and final norm are dropped;
* visiontf's own SETR names, passed through.

In every case ``pos_embed`` is resized to the model's crop grid (bilinearly, as mmseg's
``init_weights``), and a patch-embedding bias is folded into ``pos_embed`` when the model has none:
the bias is added to every patch token before the position table, so ``pos_embed[:, 1:] + bias``
gives the same tokens (mmseg 0.x trained its published SETR weights with a bias; 1.x builds its ViT
without one and drops it on load).

Refused, with the reason and the fix: mmseg 0.x / original SETR (fudan-zvg) layouts
(``backbone.blocks.*``), a checkpoint of another decoder or auxiliary-head layout (the message names the
registered variant it fits), and a class count that differs from the model's unless the model was
built with ``new_classifier=True`` (then the registry leaves the classifiers at init).
"""
from __future__ import annotations

import functools
import logging
import re
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from visiontf.models.convert import rename_state
from visiontf.nn.precision import at_least_float32

log = logging.getLogger(__name__)

_MMSEG_RULES: list[tuple[str, str]] = [
    (r"^backbone\.(cls_token|pos_embed)$", r"encoder.\1"),
    (r"^backbone\.patch_embed\.projection\.(weight|bias)$", r"encoder.patch_embed.proj.\1"),
    (r"^backbone\.layers\.(\d+)\.ln1\.(weight|bias)$", r"encoder.blocks.\1.norm1.\2"),
    (r"^backbone\.layers\.(\d+)\.ln2\.(weight|bias)$", r"encoder.blocks.\1.norm2.\2"),
    (r"^backbone\.layers\.(\d+)\.attn\.attn\.in_proj_(weight|bias)$", r"encoder.blocks.\1.attn.qkv.\2"),
    (r"^backbone\.layers\.(\d+)\.attn\.attn\.out_proj\.(weight|bias)$", r"encoder.blocks.\1.attn.proj.\2"),
    (r"^backbone\.layers\.(\d+)\.ffn\.layers\.0\.0\.(weight|bias)$", r"encoder.blocks.\1.mlp.fc1.\2"),
    (r"^backbone\.layers\.(\d+)\.ffn\.layers\.1\.(weight|bias)$", r"encoder.blocks.\1.mlp.fc2.\2"),
    (r"^decode_head\.conv_seg\.(weight|bias)$", r"decode_head.cls_seg.\1"),
    (r"^decode_head\.((?:norm|up_convs)\..*)$", r"decode_head.\1"),
    (r"^auxiliary_head\.(\d+)\.conv_seg\.(weight|bias)$", r"aux_heads.\1.cls_seg.\2"),
    (r"^auxiliary_head\.(\d+)\.((?:norm|up_convs)\..*)$", r"aux_heads.\1.\2"),
    (r"^neck\.((?:norm|mla)\..*)$", r"neck.\1"),
]
_DECODER_PREFIXES = ("decode_head.", "aux_heads.", "neck.")
_VIT_DROP = ("head.", "head_dist.", "norm.", "fc_norm.", "pre_logits.")
ZOO = "the SETR checkpoints of mmsegmentation's model zoo (configs/setr/README.md; see docs/segmentation.md)"


# ---------------------------------------------------------------------------------------- tensors
def resize_pos_embed(pos_embed: Tensor, old_grid: tuple[int, int], new_grid: tuple[int, int], mode: str = "bilinear") -> Tensor:
    """mmseg's ``VisionTransformer.resize_pos_embed``: the class-token row kept, the grid rows interpolated.

    (1, 1 + old_h*old_w, C) -> (1, 1 + new_h*new_w, C); ``F.interpolate`` with ``align_corners=False``
    and no antialiasing, as mmseg.
    """
    (oh, ow), (nh, nw) = tuple(old_grid), tuple(new_grid)
    cls, grid = pos_embed[:, :1], pos_embed[:, -oh * ow:]
    grid = grid.reshape(1, oh, ow, -1).permute(0, 3, 1, 2)
    grid = F.interpolate(at_least_float32(grid), size=(nh, nw), mode=mode, align_corners=False).to(pos_embed.dtype)
    return torch.cat([cls, grid.flatten(2).transpose(1, 2)], dim=1)


def _fit_encoder(state: dict[str, Tensor], encoder: nn.Module, prefix: str, mode: str, what: str) -> dict[str, Tensor]:
    """Resize ``pos_embed`` to the encoder's grid and fold / zero-fill the patch-embedding bias."""
    key, bias_key = prefix + "pos_embed", prefix + "patch_embed.proj.bias"
    if key in state:
        table = state[key]
        n = table.shape[1] - 1
        side = int(round(n ** 0.5))
        grid = tuple(encoder.grid_size)
        if side * side != n:
            raise ValueError(f"{what}: {key} has {n} grid tokens, not a square grid; cannot tell its crop size")
        if (side, side) != grid:
            log.info("%s: %s resized from a %dx%d to a %dx%d grid (%s)", what, key, side, side, *grid, mode)
            state[key] = resize_pos_embed(table, (side, side), grid, mode)
    own_bias = encoder.patch_embed.proj.bias
    if bias_key in state and own_bias is None:
        bias = state.pop(bias_key)
        if key not in state:
            raise ValueError(f"{what}: a patch-embedding bias without {key} cannot be folded into the position table")
        table = state[key].clone()
        table[:, 1:] += bias.to(table.dtype)
        state[key] = table
        log.info("%s: patch-embedding bias folded into %s (this encoder has no patch bias, as mmseg 1.x)", what, key)
    elif bias_key not in state and own_bias is not None and prefix + "patch_embed.proj.weight" in state:
        state[bias_key] = torch.zeros_like(own_bias, device="cpu")
    return state


def encoder_state_from_vit(state: dict[str, Tensor], model: nn.Module, source: str = "ViT checkpoint") -> dict[str, Tensor]:
    """A bare timm / visiontf ViT state dict fitted to ``model.encoder`` (names without the ``encoder.`` prefix)."""
    kept = {k: v for k, v in state.items() if not k.startswith(_VIT_DROP)}
    dropped = sorted(set(state) - set(kept))
    if dropped:
        log.info("%s: %d classifier / final-norm tensors not used by SETR's encoder: %s", source, len(dropped), ", ".join(dropped))
    return _fit_encoder(kept, model.encoder, "", model.pos_embed_interp, source)


# ---------------------------------------------------------------------------------------- layouts
def detect_format(state: Mapping[str, Any]) -> str:
    """``"mmseg"``, ``"mmseg0"`` (0.x / fudan-zvg names), ``"vit"`` (bare ViT), ``"visiontf"`` or ``"unknown"``."""
    keys = list(state)
    if any(k.startswith("backbone.layers.") for k in keys):
        return "mmseg"
    if any(k.startswith("backbone.") for k in keys):
        return "mmseg0"
    if any(k.startswith(("encoder.",) + _DECODER_PREFIXES) for k in keys):
        return "visiontf"
    if "patch_embed.proj.weight" in state and any(k.startswith("blocks.") for k in keys):
        return "vit"
    return "unknown"


def _structure(state: Mapping[str, Tensor]) -> dict[str, tuple[int, ...]]:
    """Shapes of every decoder tensor but the classifiers, plus the encoder's width and depth."""
    out = {k: tuple(v.shape) for k, v in state.items() if k.startswith(_DECODER_PREFIXES) and ".cls_seg." not in k}
    depth = {int(m.group(1)) for k in state if (m := re.match(r"^encoder\.blocks\.(\d+)\.", k))}
    out["auxiliary heads"] = (len({m.group(1) for k in state if (m := re.match(r"^aux_heads\.(\d+)\.", k))}),)
    out["encoder depth"] = (len(depth),)
    if "encoder.cls_token" in state:
        out["encoder width"] = (int(state["encoder.cls_token"].shape[-1]),)
    return out


def _num_classes(state: Mapping[str, Tensor]) -> int | None:
    w = state.get("decode_head.cls_seg.weight")
    return None if w is None else int(w.shape[0])


def _up_head(state: Mapping[str, Tensor], prefix: str) -> tuple[int, int]:
    convs = sorted(k for k in state if k.startswith(prefix + "up_convs.") and k.endswith(".0.conv.weight"))
    return len(convs), int(state[convs[0]].shape[-1]) if convs else 0


def describe(state: Mapping[str, Tensor]) -> str:
    """A one-line human description of a visiontf-layout SETR state dict."""
    aux = sorted({int(m.group(1)) for k in state if (m := re.match(r"^aux_heads\.(\d+)\.", k))})
    if any(k.startswith("neck.") for k in state):
        head = "MLA"
        aux_text = f"{len(aux)} auxiliary 1x1 classifiers"
    else:
        n, k = _up_head(state, "decode_head.")
        head = {(1, 1): "Naive", (4, 3): "PUP"}.get((n, k), "up-head") + f" (decode head {n} x {k}x{k} conv)"
        kinds = sorted({_up_head(state, f"aux_heads.{i}.") for i in aux})
        aux_text = f"{len(aux)} auxiliary heads of " + " / ".join(f"{n} x {k}x{k} conv" for n, k in kinds) if aux else "no auxiliary heads"
    s = _structure(state)
    parts = [f"SETR-{head}", aux_text]
    if "encoder width" in s:
        parts.append(f"ViT {s['encoder width'][0]} dims x {s['encoder depth'][0]} blocks")
    if (k := _num_classes(state)) is not None:
        parts.append(f"{k} classes")
    if "encoder.pos_embed" in state:
        n = state["encoder.pos_embed"].shape[1] - 1
        parts.append(f"{int(round(n ** 0.5))}x{int(round(n ** 0.5))} patch grid")
    return ", ".join(parts)


@functools.lru_cache(maxsize=1)
def _registered_layouts() -> dict[str, tuple[dict[str, tuple[int, ...]], int | None]]:
    """Decoder structure and class count of every registered SETR, built on the meta device (no memory, fast)."""
    from visiontf.models._registry import create_model, list_models

    out = {}
    for name in list_models("setr_*"):
        with torch.device("meta"):
            state = create_model(name).state_dict()
        out[name] = (_structure(state), _num_classes(state))
    return out


def fitting_variants(state: Mapping[str, Tensor]) -> list[str]:
    """Registered SETR names whose layout fits ``state`` (visiontf names), those with its class count first."""
    structure, classes = _structure(state), _num_classes(state)
    fits = [n for n, (s, _) in _registered_layouts().items() if s == structure]
    return sorted(fits, key=lambda n: _registered_layouts()[n][1] != classes)


def _check_fits(state: dict[str, Tensor], model: nn.Module, what: str) -> None:
    """Refuse another decoder / auxiliary layout, and a class count change nobody asked for."""
    if not any(k.startswith(_DECODER_PREFIXES) for k in state):
        return  # encoder weights only: the decoder starts at init
    own = model.state_dict()
    name = model.model_name or type(model).__name__
    if _structure(state) != _structure(own):
        fits = fitting_variants(state)
        fix = (f"it fits {fits[0]}: create_model({fits[0]!r}, pretrained=...)" if fits else
               "no registered SETR variant has this layout; pass the matching decode_head / aux_heads sections")
        raise ValueError(f"{what} is {describe(state)}, but {name} is {describe(own)}; {fix}")
    theirs, ours = _num_classes(state), _num_classes(own)
    if theirs is not None and theirs != ours and not model.new_classifier:
        fits = [n for n in fitting_variants(state) if _registered_layouts()[n][1] == theirs]
        use = f"for its own classes use create_model({fits[0]!r}, pretrained=...)" if fits else \
            f"for its own classes pass num_classes={theirs}"
        raise ValueError(
            f"{what} has {theirs} classes (decode-head classifier {list(state['decode_head.cls_seg.weight'].shape)}) but "
            f"{name} has {ours}: {use}; to fine-tune it on {ours} classes with new classifiers pass new_classifier=True"
        )


# ---------------------------------------------------------------------------------------- filter
def _unwrap(state: Mapping[str, Any]) -> dict[str, Tensor]:
    if "state_dict" in state and isinstance(state["state_dict"], Mapping):  # an mmseg {"meta", "state_dict"} dict
        state = state["state_dict"]
    return {k: v for k, v in state.items() if isinstance(v, Tensor)}


def rename_mmseg_keys(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """mmseg SETR names -> visiontf's (no tensor is changed); unknown keys are an error."""
    out, unmatched = rename_state(state, _MMSEG_RULES)
    if unmatched:
        raise ValueError(
            f"mmsegmentation checkpoint: {len(unmatched)} keys have no counterpart in SETR, e.g. {unmatched[:6]} "
            "(a final_norm / pre_norm ViT or another segmentor: not one of mmseg's SETR configs); use " + ZOO
        )
    return out


def convert_state_dict(state: Mapping[str, Any], model: nn.Module, strict: bool = True) -> dict[str, Tensor]:
    """The registry's ``filter_fn`` for every SETR: ``state`` in visiontf's names, fitted to ``model``.

    ``strict`` is the loader's (``False``: keep what fits).

    Raises:
        ValueError: an mmseg 0.x / original SETR layout, another decoder or auxiliary layout, a class
            count the model was not asked to adapt to, or an unrecognised layout.
    """
    state = _unwrap(state)
    mode = model.pos_embed_interp
    fmt = detect_format(state)
    if fmt == "mmseg0":
        sample = [k for k in state if k.startswith("backbone.")][:3]
        raise ValueError(
            f"an mmsegmentation 0.x / original SETR (fudan-zvg/SETR) layout (e.g. {sample}): visiontf reads the "
            "layout of mmseg >= 0.15 (backbone.layers.N.attn.attn.in_proj_weight, decode_head.up_convs...), which "
            "is that of " + ZOO + "; download one of those files"
        )
    if fmt == "unknown":
        raise ValueError(
            f"unrecognised SETR checkpoint layout, e.g. keys {list(state)[:6]}: expected an mmsegmentation SETR "
            "(backbone.layers.*, decode_head.*), a timm / visiontf ViT (patch_embed.proj.weight, blocks.*) or a visiontf SETR"
        )
    if fmt == "vit":
        return {f"encoder.{k}": v for k, v in encoder_state_from_vit(state, model, "bare ViT checkpoint").items()}
    what = "this visiontf SETR checkpoint"
    if fmt == "mmseg":
        state = rename_mmseg_keys(state)
        what = "this mmsegmentation checkpoint"
    _check_fits(state, model, what)  # before fitting, so messages describe the checkpoint's own crop
    state = _fit_encoder(state, model.encoder, "encoder.", mode, what)
    if fmt == "mmseg":
        missing = sorted(set(model.state_dict()) - set(state))
        if missing:
            raise ValueError(f"{what} lacks {len(missing)} tensors of {describe(model.state_dict())}, e.g. {missing[:6]}")
        log.info("converted %d tensors from the mmsegmentation SETR layout (%s)", len(state), describe(state))
    return state
