"""visiontf's own SETR checkpoints from before SETR was rebuilt as mmsegmentation's (commit d173670 and
earlier): their tensors in today's names, and where that structure has an equivalent in today's
:class:`~visiontf.models.setr.SETR`.

The former layout, told apart by its keys (``decode_head.convs.*``, ``neck.norms.*``, ``decode_head.streams.*``):

* ``encoder.*``: the same ViT in timm's names. ViT-L then had a patch-embedding bias; mmseg's ViT-L has
  none, and :mod:`~visiontf.models.setr_convert` folds it into ``pos_embed`` (exact).
* Naive / PUP heads (``decode_head``, ``aux_heads.N``): ``norm.norm`` (LayerNorm), ``convs.J.0`` (a conv
  *with* a bias) and ``convs.J.1`` (BatchNorm), ``cls_seg``. The bias sits right before the BatchNorm,
  so it is folded into its running mean (``running_mean - bias``): exact in eval mode, and batch
  statistics cancel it in training. Naive: one 1x1 conv, no upsampling, classifier, logits resized to
  the input; its auxiliary heads the same on blocks 10/15/20 (quarters of the depth for 12 blocks).
  PUP: log2(patch) 3x3 convs with x2 after all but the last, classifier, then x2: the same logits as
  x2 after every conv, as the classifier is 1x1 (linear) and bilinear weights sum to one. Its
  auxiliary heads: one 3x3 conv, x4, classifier, on blocks 10/15/20/24.
* MLA: ``neck.norms.I``, ``neck.proj.I``, ``neck.smooth.I`` and ``decode_head.streams.I`` ordered by
  level (shallowest first; mmseg's outputs and heads run deepest first, so they are reversed); a
  3x3 classifier upsampled with ``align_corners=True`` (mmseg: 1x1, ``align_corners=False``: no
  equivalent); auxiliary 1x1 classifiers without a bias (a zero bias is exact); the class token kept
  in the encoder's attention (``with_cls_token=True``; mmseg drops it for MLA).

Taps are not stored in a state dict; the former defaults for the checkpoint's depth are assumed.
:mod:`~visiontf.models.setr_convert`'s ``filter_fn`` calls :func:`rename_legacy_state`, fits the encoder
(``pos_embed``, patch bias), then :func:`check_legacy_state`.
"""
from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from visiontf.models._registry import WeightsLayoutError

log = logging.getLogger(__name__)

_MARKER = re.compile(r"^(?:decode_head|aux_heads\.\d+)\.(?:convs|streams)\.|^neck\.(?:norms|proj|smooth)\.")
_PARTS = {"encoder.": "encoder", "neck.": "MLA neck", "decode_head.": "decode head", "aux_heads.": "auxiliary heads"}


def is_legacy_layout(state: Mapping[str, Any]) -> bool:
    """Whether ``state`` is a visiontf SETR state dict from before the mmseg layout."""
    return any(_MARKER.match(k) for k in state)


@dataclass
class LegacySETR:
    """What a former visiontf SETR state dict was, in today's :class:`SETR` terms."""

    decoder: str
    depth: int
    #: (num_convs, kernel_size, up_scale) of the Naive/PUP decode head and auxiliary heads, as today's UpHead
    head: tuple[int, int, int] | None = None
    aux_head: tuple[int, int, int] | None = None
    main_block: int | None = None
    aux_blocks: tuple[int, ...] = ()
    mla_taps: tuple[int, ...] = ()
    notes: list[str] = field(default_factory=list)

    def describe(self) -> str:
        if self.decoder == "mla":
            return (f"SETR-MLA on blocks {_blocks(self.mla_taps)} with a 3x3 classifier, {len(self.mla_taps)} auxiliary "
                    f"1x1 classifiers, the class token in the encoder, {self.depth} blocks")
        return (f"SETR-{'Naive' if self.decoder == 'naive' else 'PUP'} (decode head {_up(self.head)}), "
                f"{len(self.aux_blocks)} auxiliary heads of {_up(self.aux_head)} on blocks {_blocks(self.aux_blocks)}, "
                f"{self.depth} blocks")


def _blocks(idx: tuple[int, ...]) -> str:
    return "/".join(str(i + 1) for i in idx)


def _up(head: tuple[int, int, int] | None) -> str:
    if head is None:
        return "none"
    n, k, up = head
    return f"{n} x ({k}x{k} conv{f', x{up}' if up != 1 else ', no upsampling'})"


def _legacy_taps(depth: int, decoder: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(main, auxiliary) 0-based blocks of the former defaults (``default_indices`` of the old ``setr.py``)."""
    if depth == 24:
        mla, aux = (5, 11, 17, 23), (9, 14, 19)
    elif depth % 4 == 0:
        q = depth // 4
        mla, aux = (q - 1, 2 * q - 1, 3 * q - 1, depth - 1), (q - 1, 2 * q - 1, 3 * q - 1)
    else:
        raise WeightsLayoutError(f"a former visiontf SETR checkpoint with {depth} blocks: its taps were not defaults "
                                 "and are not stored in the weights; build SETR with its out_indices and pass strict=False")
    if decoder == "mla":
        return mla, mla
    return (depth - 1,), aux + ((depth - 1,) if decoder == "pup" else ())


def _describe(state: Mapping[str, Tensor]) -> LegacySETR:
    depth = len({m.group(1) for k in state if (m := re.match(r"^encoder\.blocks\.(\d+)\.", k))})
    if any(k.startswith("neck.") for k in state):
        main, _ = _legacy_taps(depth, "mla")
        return LegacySETR("mla", depth, mla_taps=main)
    convs = sorted({int(m.group(1)) for k in state if (m := re.match(r"^decode_head\.convs\.(\d+)\.0\.weight$", k))})
    kernel = int(state["decode_head.convs.0.0.weight"].shape[-1])
    decoder = "pup" if kernel == 3 else "naive"
    main, aux = _legacy_taps(depth, decoder)
    aux_heads = {m.group(1) for k in state if (m := re.match(r"^aux_heads\.(\d+)\.", k))}
    # Naive: one conv and no upsampling anywhere; PUP: x2 after every conv (see the module docstring), aux x4
    head = (len(convs), kernel, 1 if decoder == "naive" else 2)
    aux_head = (1, kernel, 1 if decoder == "naive" else 4)
    return LegacySETR(decoder, depth, head, aux_head, main[0], aux[: len(aux_heads)])


def _rename(state: Mapping[str, Tensor], levels: int) -> dict[str, Tensor]:
    """Former names -> today's; conv biases folded into the following BatchNorm's running mean."""
    out: dict[str, Tensor] = {}
    biases: dict[str, Tensor] = {}
    rev = lambda i: str(levels - 1 - int(i))  # noqa: E731  (MLA levels: shallowest first -> deepest first)
    rules: list[tuple[str, Any]] = [
        (r"^(decode_head|aux_heads\.\d+)\.norm\.norm\.(.+)$", lambda m: f"{m[1]}.norm.{m[2]}"),
        (r"^(decode_head|aux_heads\.\d+)\.convs\.(\d+)\.0\.weight$", lambda m: f"{m[1]}.up_convs.{m[2]}.0.conv.weight"),
        (r"^(decode_head|aux_heads\.\d+)\.convs\.(\d+)\.1\.(.+)$", lambda m: f"{m[1]}.up_convs.{m[2]}.0.bn.{m[3]}"),
        (r"^neck\.norms\.(\d+)\.norm\.(.+)$", lambda m: f"neck.norm.{m[1]}.{m[2]}"),
        (r"^neck\.proj\.(\d+)\.0\.weight$", lambda m: f"neck.mla.channel_proj.{m[1]}.conv.weight"),
        (r"^neck\.proj\.(\d+)\.1\.(.+)$", lambda m: f"neck.mla.channel_proj.{m[1]}.bn.{m[2]}"),
        (r"^neck\.smooth\.(\d+)\.0\.weight$", lambda m: f"neck.mla.feat_extract.{rev(m[1])}.conv.weight"),
        (r"^neck\.smooth\.(\d+)\.1\.(.+)$", lambda m: f"neck.mla.feat_extract.{rev(m[1])}.bn.{m[2]}"),
        (r"^decode_head\.streams\.(\d+)\.(\d+)\.0\.weight$", lambda m: f"decode_head.up_convs.{rev(m[1])}.{m[2]}.conv.weight"),
        (r"^decode_head\.streams\.(\d+)\.(\d+)\.1\.(.+)$", lambda m: f"decode_head.up_convs.{rev(m[1])}.{m[2]}.bn.{m[3]}"),
        (r"^(decode_head)\.cls_seg\.(weight|bias)$", lambda m: f"{m[1]}.cls_seg.{m[2]}"),
        (r"^aux_heads\.(\d+)\.cls_seg\.(weight|bias)$",
         lambda m: f"aux_heads.{rev(m[1]) if levels else m[1]}.cls_seg.{m[2]}"),
        (r"^(encoder\..+)$", lambda m: m[1]),
    ]
    unmatched = []
    for key, value in state.items():
        bias = re.match(r"^(decode_head|aux_heads\.\d+)\.convs\.(\d+)\.0\.bias$", key)
        if bias:
            biases[f"{bias[1]}.up_convs.{bias[2]}.0.bn.running_mean"] = value
            continue
        for pattern, new in rules:
            m = re.match(pattern, key)
            if m:
                out[new(m)] = value
                break
        else:
            unmatched.append(key)
    if unmatched:
        raise WeightsLayoutError(f"a former visiontf SETR checkpoint with {len(unmatched)} unknown keys, e.g. "
                                 f"{unmatched[:6]}; it is not a SETR saved by visiontf")
    for key, bias in biases.items():
        out[key] = out[key] - bias.to(out[key].dtype)
    if levels:
        w = out.get("decode_head.cls_seg.weight")
        if w is not None:  # the classifier's input channels follow the head's order, deepest level first now
            out["decode_head.cls_seg.weight"] = w.reshape(w.shape[0], levels, -1, *w.shape[2:]).flip(1).flatten(1, 2)
        for i in range(levels):
            w = out.get(f"aux_heads.{i}.cls_seg.weight")
            if w is not None and f"aux_heads.{i}.cls_seg.bias" not in out:
                out[f"aux_heads.{i}.cls_seg.bias"] = torch.zeros(w.shape[0], dtype=w.dtype)
    return out


def _model_head(head: nn.Module) -> tuple[int, int, int] | None:
    """(num_convs, kernel_size, up_scale) of today's UpHead."""
    convs = getattr(head, "up_convs", None)
    if convs is None or not hasattr(head, "norm"):
        return None
    return len(convs), int(convs[0][0].conv.kernel_size[0]), int(round(float(convs[0][1].scale_factor)))


def _differences(old: LegacySETR, model: nn.Module) -> tuple[dict[str, str], dict[str, Any]]:
    """Per part, how the model computes otherwise than the former one; and the arguments that remove that."""
    diffs: dict[str, str] = {}
    fix: dict[str, Any] = {}
    if model.decoder != old.decoder:
        diffs["decode head"] = (f"the checkpoint is SETR-{old.decoder}, the model SETR-{model.decoder}; load it into "
                                f"a setr_{old.decoder}_* model")
        return diffs, {}
    taps = tuple(model.out_indices)
    if old.decoder == "mla":
        if model.with_cls_token is not True:
            diffs["encoder"] = ("the former MLA kept the class token in the encoder's attention; this model drops it "
                                "before the first block (mmseg's with_cls_token=False)")
            fix["with_cls_token"] = True
        if taps != old.mla_taps:
            diffs["MLA neck"] = f"taps blocks {_blocks(old.mla_taps)}, this model {_blocks(taps)}"
            fix["out_indices"] = old.mla_taps
        diffs["decode head"] = ("the former MLA head had a 3x3 classifier and upsampled x4 with align_corners=True; "
                                "mmseg's (this one) has a 1x1 classifier and align_corners=False: no equivalent")
        return diffs, fix
    needed = set(old.aux_blocks) | {old.main_block}
    if not needed <= set(taps):
        taps = fix["out_indices"] = tuple(sorted(needed))
    main = model.out_indices[model.in_index]
    if main != old.main_block or "out_indices" in fix:
        fix["in_index"] = taps.index(old.main_block)
    own_aux = tuple(model.out_indices[i] for i in model.aux_in_index)
    if own_aux != old.aux_blocks or "out_indices" in fix:
        fix["aux_in_index"] = tuple(taps.index(b) for b in old.aux_blocks)
    head, notes = _model_head(model.decode_head), []
    if main != old.main_block:
        notes.append(f"reads block {old.main_block + 1}, this model block {main + 1}")
    if head != old.head:
        notes.append(f"the former head was {_up(old.head)}, this model's {_up(head)}")
        fix.update(_changed(("num_convs", "kernel_size", "up_scale"), old.head, head))
    if notes:
        diffs["decode head"] = "; ".join(notes)
    aux_head = _model_head(model.aux_heads[0]) if len(model.aux_heads) else None
    if own_aux != old.aux_blocks or aux_head != old.aux_head:
        diffs["auxiliary heads"] = (f"the former {len(old.aux_blocks)} were {_up(old.aux_head)} on blocks "
                                    f"{_blocks(old.aux_blocks)}, this model's {len(own_aux)} are {_up(aux_head)} "
                                    f"on blocks {_blocks(own_aux) or '-'}")
        fix.update(_changed(("aux_num_convs", "aux_kernel_size", "aux_up_scale"), old.aux_head, aux_head))
    return diffs, fix


def _changed(names: tuple[str, ...], old: tuple[int, ...], own: tuple[int, ...] | None) -> dict[str, int]:
    return {n: o for n, o, c in zip(names, old, own or (None,) * len(names)) if o != c}


def _part(key: str) -> str:
    return next((name for prefix, name in _PARTS.items() if key.startswith(prefix)), "other")


def _shape_differences(state: Mapping[str, Tensor], model: nn.Module) -> dict[str, str]:
    """Parts whose tensors do not map one to one onto the model's (classifier class counts aside)."""
    own = model.state_dict()
    diffs: dict[str, str] = {}
    for key in sorted(set(state) | set(own)):
        part = _part(key)
        if part in diffs or key.endswith("num_batches_tracked"):
            continue
        if key not in own or key not in state:
            side = "the model has no" if key not in own else "the checkpoint lacks"
            diffs[part] = f"{side} {key}"
        elif state[key].shape != own[key].shape and not (".cls_seg." in key and state[key].shape[1:] == own[key].shape[1:]):
            diffs[part] = f"{key} is {list(state[key].shape)} in the checkpoint, {list(own[key].shape)} in the model"
    return diffs


def _at_init(own: Mapping[str, Tensor], kept: Mapping[str, Tensor]) -> str:
    """The model's parts (or modules of a part) that ``kept`` does not fill, for messages."""
    missing = [k for k in own if k not in kept and not k.endswith("num_batches_tracked")]
    out = []
    for part in dict.fromkeys(_part(k) for k in missing):
        every = [k for k in own if _part(k) == part and not k.endswith("num_batches_tracked")]
        modules = list(dict.fromkeys(re.sub(r"(\.up_convs\.\d+)\..*$|\.(conv|bn)$", r"\1", k.rsplit(".", 1)[0])
                                     for k in missing if _part(k) == part))
        whole = len(every) == len([k for k in missing if _part(k) == part])
        out.append(f"the {part}" if whole else f"{', '.join(modules[:3])}{' ...' if len(modules) > 3 else ''}")
    return ", ".join(out) or "nothing"


def _fits_exactly(old: LegacySETR, state: Mapping[str, Tensor], model: nn.Module) -> bool:
    diffs, _ = _differences(old, model)
    return not diffs and not _shape_differences(state, model)


def _rebuild_kwargs(old: LegacySETR, state: Mapping[str, Tensor], model: nn.Module, fix: dict[str, Any]) -> dict | None:
    """``fix`` if the registered model built with it takes ``state`` exactly (checked on the meta device)."""
    name, kwargs = getattr(model, "model_name", None), getattr(model, "model_kwargs", None)
    if not fix or name is None or kwargs is None:
        return None
    from visiontf.models._registry import create_model

    kwargs = {k: v for k, v in kwargs.items() if k not in ("encoder_pretrained", "pretrained")}
    try:
        with torch.device("meta"):
            rebuilt = create_model(name, **{**kwargs, **fix})
    except (TypeError, ValueError):
        return None
    return fix if _fits_exactly(old, state, rebuilt) else None


def rename_legacy_state(state: Mapping[str, Tensor]) -> tuple[LegacySETR, dict[str, Tensor]]:
    """What a former visiontf SETR state dict was, and its tensors in today's names (no shape changed but
    the folded conv biases and the reordered MLA classifier)."""
    old = _describe(state)
    return old, _rename(state, len(old.mla_taps) if old.decoder == "mla" else 0)


def check_legacy_state(old: LegacySETR, state: dict[str, Tensor], model: nn.Module, strict: bool = True) -> dict[str, Tensor]:
    """``state`` (renamed, encoder fitted) for ``model``, or why not.

    ``strict``: every part must compute as the former model did (same structure and taps), else
    :class:`~visiontf.models._registry.WeightsLayoutError` says what differs and how to go on, with the
    arguments that rebuild the former structure where today's SETR has it (``fits_kwargs``). With
    ``strict=False`` the tensors that fit are returned (the rest stays at init) and the differences are
    logged.
    """
    name = getattr(model, "model_name", type(model).__name__)
    what = f"a visiontf SETR checkpoint from before the mmseg layout ({old.describe()})"
    theirs, ours = state["decode_head.cls_seg.weight"].shape[0], model.num_classes
    if theirs != ours and not getattr(model, "new_classifier", False):
        raise WeightsLayoutError(f"{what} has {theirs} classes but {name} has {ours}: pass num_classes={theirs}, or "
                                 f"new_classifier=True to fine-tune it on {ours} classes with new classifiers")
    diffs, fix = _differences(old, model)
    for part, why in _shape_differences(state, model).items():
        diffs.setdefault(part, why)
    if not diffs:
        log.info("%s: converted %d tensors for %s, outputs unchanged", what, len(state), name)
        return state
    own = model.state_dict()
    # same shapes, and classifiers of another class count (the registry leaves those at init when asked to)
    kept = {k: v for k, v in state.items() if k in own and (v.shape == own[k].shape or (
        ".cls_seg." in k and v.shape[1:] == own[k].shape[1:]))}
    at_init = _at_init(own, kept)
    detail = "; ".join(f"{part}: {why}" for part, why in diffs.items())
    if not strict:
        log.warning("%s into %s, strict=False: %s. Loaded %d tensors; left at init: %s. Fine-tune before use.",
                    what, name, detail, len(kept), at_init)
        return kept
    fits = _rebuild_kwargs(old, state, model, fix)
    ways = []
    if fits:
        args = ", ".join(f"{k}={v!r}" for k, v in fits.items())
        ways.append(f"build it with {args} for the former structure and its outputs (create_model({name!r}, {args}, "
                    "pretrained=...); visiontf.load_model and visiontf.checkpoints.load_checkpoint_model do so by themselves)")
    keep = " with with_cls_token=True, which keeps the former encoder," if "encoder" in diffs else ""
    only_aux = set(diffs) == {"auxiliary heads"}
    ways.append(f"pass strict=False{keep} to load what fits and leave {at_init} at init, then "
                "fine-tune" + (" (auxiliary heads are used in training only: the eval logits are the former ones)"
                               if only_aux else ""))
    raise WeightsLayoutError(f"{what} has no exact equivalent in {name}: {detail}. To continue, " + "; or ".join(ways),
                             fits_kwargs=fits)
