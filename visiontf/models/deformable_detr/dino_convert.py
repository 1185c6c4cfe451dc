"""Map IDEA-Research/DINO's checkpoints onto :class:`~visiontf.models.deformable_detr.deformable_detr.DeformableDETR` (the DINO models).

DINO's files (``checkpoint0011_4scale.pth``, ...) hold ``{"model": state_dict, "optimizer": ..., "args": ...}``;
the state dict keeps Deformable DETR's names for the backbone, projections, encoder and decoder layers
(renamed by :mod:`~visiontf.models.deformable_detr.convert`'s rules) and adds:

* ``transformer.tgt_embed`` (the learned content queries) -> ``tgt_embed``;
* ``transformer.decoder.ref_point_head`` -> ``ref_point_head``. DINO's sine embedding of an anchor
  box is ordered (y, x, w, h), visiontf's (x, y, w, h): the first layer's input columns of the y and
  x blocks are swapped, which gives the same function;
* ``transformer.decoder.norm`` -> ``decoder_norm``;
* ``class_embed.{0..5}`` / ``bbox_embed.{0..5}``: one shared head repeated per decoder layer
  (``dec_pred_*_embed_share``), kept once; their second registration under ``transformer.decoder.``
  is dropped; ``transformer.enc_out_class_embed`` / ``enc_out_bbox_embed`` (the proposal heads) ->
  the last ``class_embed`` / ``bbox_embed``;
* ``label_enc`` (the denoising label book, Embedding(dn_labelbook_size + 1, d)): DINO draws labels
  below ``num_classes`` and pads its denoising groups with zero vectors, so rows from
  ``num_classes`` on are never read; visiontf's book is ``num_classes`` rows plus a zero padding row
  (``padding_idx=num_classes``), so the first ``num_classes`` rows are kept and a zero row appended.

A checkpoint with another number of feature levels or queries than the model is refused with a
message that names the difference and the model (or argument) it fits; so is a Deformable DETR
checkpoint (fundamentalvision or HuggingFace layout). visiontf's own state dicts pass through.
"""
from __future__ import annotations

import logging
import re

import torch
from torch import Tensor, nn

from visiontf.models.convert import Rules, drop_batchnorm_counters, rename, strip_prefix
from visiontf.models.deformable_detr import convert as deformable_detr_convert
from visiontf.models.deformable_detr.convert import ORIGINAL_RULES

log = logging.getLogger(__name__)

#: the registered DINO model of each number of feature levels, named in errors
DINO_MODELS = {4: "dino_resnet50_4scale", 5: "dino_resnet50_5scale"}

_DINO_RULES: Rules = [
    (r"^transformer\.tgt_embed\.(.*)$", r"tgt_embed.\1"),
    (r"^transformer\.decoder\.ref_point_head\.(.*)$", r"ref_point_head.\1"),
    (r"^transformer\.decoder\.norm\.(.*)$", r"decoder_norm.\1"),
    (r"^label_enc\.(.*)$", r"label_enc.\1"),
    *ORIGINAL_RULES,
    # a Swin backbone (DINO_4scale_swin.py) sits directly at backbone.0, without torchvision's body
    (r"^backbone\.0\.((?:patch_embed|layers|norm\d)\..*)$", r"backbone.body.\1"),
]
#: the heads' second registration inside the decoder (the same tensors as class_embed / bbox_embed)
_DUPLICATE_HEADS = re.compile(r"^transformer\.decoder\.(bbox_embed|class_embed)\.")
_PROPOSAL_HEADS = re.compile(r"^transformer\.enc_out_(class|bbox)_embed\.(.*)$")
_DECODER_HEADS = re.compile(r"^(class_embed|bbox_embed)\.(\d+)\.(.*)$")


def is_dino_checkpoint(state: dict[str, Tensor]) -> bool:
    """True for IDEA-Research/DINO's layout (its proposal heads and anchor MLP live under ``transformer.``)."""
    return any(k.startswith(("transformer.enc_out_class_embed.", "transformer.decoder.ref_point_head.")) for k in state)


def _model_name(model: nn.Module) -> str:
    return repr(model.model_name or DINO_MODELS.get(model.arch_options.num_feature_levels, "the DINO model"))


def check_fits(state: dict[str, Tensor], model: nn.Module) -> None:
    """Refuse a DINO checkpoint whose feature levels, queries or architecture differ from ``model``'s, naming the fix."""
    if not (model.dino_options.mixed_query_selection and model.arch_options.two_stage):
        raise ValueError(
            f"this is an IDEA-Research/DINO checkpoint (mixed query selection: transformer.tgt_embed, ref_point_head), but the "
            f"model being loaded ({_model_name(model)}) is a Deformable DETR without mixed query selection; use "
            f"create_model({DINO_MODELS[4]!r} or {DINO_MODELS[5]!r}, pretrained=...)"
        )
    levels = state["transformer.level_embed"].shape[0] if "transformer.level_embed" in state else None
    if levels is not None and levels != model.arch_options.num_feature_levels:
        fits = DINO_MODELS.get(levels)
        hint = f"use create_model({fits!r}, pretrained=...)" if fits else f"build the model with num_feature_levels={levels}"
        raise ValueError(
            f"this DINO checkpoint has {levels} feature levels (transformer.level_embed {tuple(state['transformer.level_embed'].shape)}"
            f"{f'; it fits {fits!r}' if fits else ''}), but the model being loaded ({_model_name(model)}) has "
            f"{model.arch_options.num_feature_levels}; {hint} for these weights"
        )
    queries = state["transformer.tgt_embed.weight"].shape[0] if "transformer.tgt_embed.weight" in state else None
    if queries is not None and queries != model.arch_options.num_queries:
        raise ValueError(
            f"this DINO checkpoint has {queries} queries (transformer.tgt_embed.weight {tuple(state['transformer.tgt_embed.weight'].shape)}), "
            f"but the model being loaded ({_model_name(model)}) has {model.arch_options.num_queries}; build it with num_queries={queries} "
            f"(DINO's R50 configs: 900), e.g. create_model({_model_name(model)}, num_queries={queries}, pretrained=...)"
        )


def convert_state_dict(state: dict[str, Tensor], model: nn.Module) -> dict[str, Tensor]:
    """``state`` (IDEA-Research/DINO's layout, or any layout of the Deformable DETR family) in ``model``'s names.

    Raises:
        ValueError: the checkpoint's feature levels, queries or heads do not fit ``model`` (the
            message names what differs and the model or argument that fits), a Deformable DETR
            checkpoint given to a DINO model, or unknown keys.
    """
    state = strip_prefix(dict(state))
    if not is_dino_checkpoint(state):
        if deformable_detr_convert.detect_format(state) != "visiontf":
            raise ValueError(
                f"this is a Deformable DETR checkpoint (fundamentalvision or HuggingFace layout), not an IDEA-Research/DINO one; "
                f"load it with create_model('deformable_detr_resnet50_two_stage', pretrained=...) (or the variant it fits), "
                f"not into {_model_name(model)}"
            )
        return state  # visiontf's own names (strict loading then names any key that does not fit)
    check_fits(state, model)
    state, _ = drop_batchnorm_counters(state)
    proposal_index = len(model.class_embed) - 1
    shared = model.dino_options.share_decoder_heads
    out: dict[str, Tensor] = {}
    unmatched, duplicates = [], 0
    for key, value in state.items():
        if _DUPLICATE_HEADS.match(key):
            duplicates += 1
            continue
        proposal = _PROPOSAL_HEADS.match(key)
        head = _DECODER_HEADS.match(key)
        if proposal:
            out[f"{proposal.group(1)}_embed.{proposal_index}.{proposal.group(2)}"] = value
        elif head:
            if shared and head.group(2) != "0":
                _check_shared(state, key, head)
                duplicates += 1
            elif int(head.group(2)) >= model.arch_options.dec_layers:
                unmatched.append(key)
            else:
                out[key] = value
        else:
            new = rename(key, _DINO_RULES)
            if new is None:
                unmatched.append(key)
            else:
                out[new] = value
    if unmatched:
        raise ValueError(f"DINO checkpoint: {len(unmatched)} keys have no counterpart in visiontf's DINO, e.g. {unmatched[:8]}")
    _reorder_anchor_embedding(out)
    _pad_label_book(out)
    log.info(
        "converted %d tensors from IDEA-Research/DINO's layout (%d duplicate head tensors dropped; ref_point_head's input "
        "reordered from (y, x, w, h) to (x, y, w, h); label_enc's padding row zeroed)", len(out), duplicates,
    )
    return out


def _check_shared(state: dict[str, Tensor], key: str, head: re.Match) -> None:
    """A model with one shared decoder head takes only checkpoints whose per-layer heads are that one head."""
    first = state.get(f"{head.group(1)}.0.{head.group(3)}")
    value = state[key]
    if first is None or first.shape != value.shape or not (value.is_meta or torch.equal(first, value)):
        raise ValueError(
            f"this DINO checkpoint has a separate {head.group(1)} per decoder layer ({key} differs from "
            f"{head.group(1)}.0, dec_pred_*_embed_share=False), but the model shares one; build it with share_decoder_heads=False"
        )


def _reorder_anchor_embedding(out: dict[str, Tensor]) -> None:
    """DINO's ``gen_sineembed_for_position`` concatenates (y, x, w, h), visiontf's ``sine_embedding`` (x, y, w, h)."""
    key = "ref_point_head.layers.0.weight"
    if key in out:
        weight = out[key]
        block = weight.shape[1] // 4
        out[key] = torch.cat([weight[:, block:2 * block], weight[:, :block], weight[:, 2 * block:]], dim=1)


def _pad_label_book(out: dict[str, Tensor]) -> None:
    """The first ``num_classes`` rows of DINO's label book, then visiontf's zero padding row (see the module doc)."""
    book, classes = out.get("label_enc.weight"), out.get("class_embed.0.weight")
    if book is None or classes is None or book.shape[0] <= classes.shape[0]:
        return
    num_classes = classes.shape[0]
    out["label_enc.weight"] = torch.cat([book[:num_classes], book.new_zeros(1, book.shape[1])])
