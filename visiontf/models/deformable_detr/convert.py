"""Map foreign Deformable DETR state dicts onto :class:`visiontf.models.deformable_detr.deformable_detr.DeformableDETR`.

Recognised layouts (detected from the keys):

* the original fundamentalvision/Deformable-DETR checkpoints (``{"model": state_dict}``;
  ``backbone.0.body.*``, ``transformer.*`` with ``nn.MultiheadAttention``'s ``in_proj_weight`` in
  the decoder). The plain model repeats its one shared head under ``class_embed.0``..``5``; the
  refinement and two-stage models register their heads a second time under
  ``transformer.decoder.bbox_embed`` / ``class_embed``: the duplicates are dropped;
* HuggingFace ``DeformableDetrForObjectDetection`` with transformers v4 names
  (``model.backbone.conv_encoder.model.*``, ``out_proj``, ``fc1``) and the v5 run-time renames
  (``model.backbone.model.*``, ``o_proj``, ``mlp.fc1``); the decoder's separate q/k/v projections
  are fused. A timm or an HF ``ResNetBackbone`` (``embedder``/``encoder.stages``) backbone;
* visiontf's own names, passed through.

Each checkpoint is one of three variants (plain, box refinement, two-stage). Loading one into a
model of another variant is refused with the name of the model it fits.
"""
from __future__ import annotations

import logging
import re

import torch
from torch import Tensor, nn

from visiontf.models.convert import (
    Rules,
    detr_family_format,
    drop_batchnorm_counters,
    fuse_qkv,
    hf_backbone_rules,
    rename,
    strip_prefix,
)

log = logging.getLogger(__name__)

#: the registered model of each variant, named in errors
VARIANT_MODELS = {
    "plain": "deformable_detr_resnet50",
    "box_refine": "deformable_detr_resnet50_box_refine",
    "two_stage": "deformable_detr_resnet50_two_stage",
}

_ENC = r"^transformer\.encoder\.layers\.(\d+)\."
_DEC = r"^transformer\.decoder\.layers\.(\d+)\."
# the original decoder layer's norm1 follows the cross-attention and norm2 the self-attention;
# visiontf numbers norms in order (norm1 after self-attention), as its DETR decoder layer
ORIGINAL_RULES: Rules = [
    (r"^backbone\.0\.body\.(.*)$", r"backbone.body.\1"),
    (_ENC + r"linear([12])\.(.*)$", r"transformer.encoder.layers.\1.mlp.fc\2.\3"),
    (_ENC + r"(self_attn|norm[12])\.(.*)$", r"transformer.encoder.layers.\1.\2.\3"),
    (_DEC + r"self_attn\.in_proj_(weight|bias)$", r"transformer.decoder.layers.\1.self_attn.qkv.\2"),
    (_DEC + r"self_attn\.out_proj\.(.*)$", r"transformer.decoder.layers.\1.self_attn.proj.\2"),
    (_DEC + r"norm2\.(.*)$", r"transformer.decoder.layers.\1.norm1.\2"),
    (_DEC + r"norm1\.(.*)$", r"transformer.decoder.layers.\1.norm2.\2"),
    (_DEC + r"(cross_attn|norm3)\.(.*)$", r"transformer.decoder.layers.\1.\2.\3"),
    (_DEC + r"linear([12])\.(.*)$", r"transformer.decoder.layers.\1.mlp.fc\2.\3"),
    (r"^transformer\.(level_embed|reference_points\..*|enc_output\..*|enc_output_norm\..*|pos_trans\..*|pos_trans_norm\..*)$", r"transformer.\1"),
    (r"^(input_proj|query_embed|class_embed|bbox_embed)\.(.*)$", r"\1.\2"),
]

_HF_ENC = r"^model\.encoder\.layers\.(\d+)\."
_HF_DEC = r"^model\.decoder\.layers\.(\d+)\."
_HF_RULES: Rules = [
    *hf_backbone_rules(),
    (r"^model\.input_proj\.(.*)$", r"input_proj.\1"),
    (r"^model\.query_position_embeddings\.(.*)$", r"query_embed.\1"),
    (r"^model\.(level_embed|reference_points\..*|enc_output\..*|enc_output_norm\..*|pos_trans\..*|pos_trans_norm\..*)$", r"transformer.\1"),
    (_HF_ENC + r"self_attn\.(.*)$", r"transformer.encoder.layers.\1.self_attn.\2"),
    (_HF_ENC + r"self_attn_layer_norm\.(.*)$", r"transformer.encoder.layers.\1.norm1.\2"),
    (_HF_ENC + r"(?:mlp\.)?(fc[12])\.(.*)$", r"transformer.encoder.layers.\1.mlp.\2.\3"),
    (_HF_ENC + r"final_layer_norm\.(.*)$", r"transformer.encoder.layers.\1.norm2.\2"),
    (_HF_DEC + r"self_attn\.([qkv])_proj\.(.*)$", r"transformer.decoder.layers.\1.self_attn.\2_proj.\3"),
    (_HF_DEC + r"self_attn\.(?:out|o)_proj\.(.*)$", r"transformer.decoder.layers.\1.self_attn.proj.\2"),
    (_HF_DEC + r"self_attn_layer_norm\.(.*)$", r"transformer.decoder.layers.\1.norm1.\2"),
    (_HF_DEC + r"encoder_attn\.(.*)$", r"transformer.decoder.layers.\1.cross_attn.\2"),
    (_HF_DEC + r"encoder_attn_layer_norm\.(.*)$", r"transformer.decoder.layers.\1.norm2.\2"),
    (_HF_DEC + r"(?:mlp\.)?(fc[12])\.(.*)$", r"transformer.decoder.layers.\1.mlp.\2.\3"),
    (_HF_DEC + r"final_layer_norm\.(.*)$", r"transformer.decoder.layers.\1.norm3.\2"),
    (r"^(class_embed|bbox_embed)\.(.*)$", r"\1.\2"),
]

#: second registrations of the heads inside the decoder (same tensors as class_embed / bbox_embed)
_DUPLICATE_HEADS = re.compile(r"^(transformer|model)\.decoder\.(bbox_embed|class_embed)\.")


def detect_format(state: dict[str, Tensor]) -> str:
    """``"original"``, ``"hf"`` or ``"visiontf"``."""
    return detr_family_format(state, ("model.backbone.", "model.encoder.layers.", "model.input_proj."))


def checkpoint_variant(state: dict[str, Tensor]) -> str:
    """``"two_stage"``, ``"box_refine"`` or ``"plain"``, from the keys of any known layout.

    Refinement shows as the heads' second registration in the decoder (original; HF unless a
    de-duplicating save dropped it) or, in any layout, as per-layer box heads that differ (the plain
    model's are one head, repeated or tied).
    """
    if any(re.match(r"^(transformer|model)\.enc_output\.", k) for k in state):
        return "two_stage"
    if any(re.match(r"^(transformer|model)\.decoder\.bbox_embed\.", k) for k in state):
        return "box_refine"
    first = {k[len("bbox_embed.0."):]: v for k, v in state.items() if k.startswith("bbox_embed.0.")}
    second = {k[len("bbox_embed.1."):]: v for k, v in state.items() if k.startswith("bbox_embed.1.")}
    if second and (detect_format(state) == "visiontf" or any(not _same(v, first.get(k)) for k, v in second.items())):
        return "box_refine"
    return "plain"


def _same(a: Tensor, b: Tensor | None) -> bool:
    if b is None or a.shape != b.shape:
        return False
    # tensors without data (meta device: key-layout checks) cannot differ in value
    return a.is_meta or b.is_meta or torch.equal(a, b)


def model_variant(model: nn.Module) -> str:
    arch = model.arch_options
    return "two_stage" if arch.two_stage else "box_refine" if arch.with_box_refine else "plain"


def convert_state_dict(state: dict[str, Tensor], model: nn.Module) -> dict[str, Tensor]:
    """Return ``state`` renamed (decoder q/k/v fused) to ``model``'s layout; own keys pass through.

    Raises:
        ValueError: the checkpoint is another variant than ``model`` (the message names the
            model it fits), or its layout is unknown (the message lists unmatched keys).
    """
    state = strip_prefix(dict(state))
    if any(k.startswith(("transformer.enc_out_class_embed.", "transformer.decoder.ref_point_head.")) for k in state):
        raise ValueError(
            "this is an IDEA-Research/DINO checkpoint (transformer.enc_out_class_embed, ref_point_head), not a Deformable DETR "
            "one; use create_model('dino_resnet50_4scale' or 'dino_resnet50_5scale', pretrained=...)"
        )
    state, counters = drop_batchnorm_counters(state)
    fmt = detect_format(state)
    if fmt == "visiontf":
        own = model.state_dict()
        unmatched = [k for k in state if k not in own]
        if len(unmatched) > len(state) / 2:
            raise ValueError(
                f"unrecognised Deformable DETR checkpoint layout: {len(unmatched)} of {len(state)} keys match neither the original "
                f"fundamentalvision/Deformable-DETR names, HuggingFace DeformableDetrForObjectDetection names nor visiontf's, "
                f"e.g. {unmatched[:8]}"
            )
    found, expected = checkpoint_variant(state), model_variant(model)
    if found != expected:
        flags = f"with_box_refine={found != 'plain'}, two_stage={found == 'two_stage'}"
        raise ValueError(
            f"this {fmt} checkpoint is a {found.replace('_', '-')} Deformable DETR (it fits {VARIANT_MODELS[found]!r}), but the "
            f"model being loaded is {expected.replace('_', '-')} ({model.model_name or VARIANT_MODELS[expected]!r}); "
            f"use create_model({VARIANT_MODELS[found]!r}, pretrained=...) for these weights (or build the model with {flags})"
        )
    if fmt == "visiontf":
        return state
    rules = ORIGINAL_RULES if fmt == "original" else _HF_RULES
    out: dict[str, Tensor] = {}
    unmatched, duplicates = [], 0
    second_copies: dict[str, Tensor] = {}
    shared_heads = len(model.class_embed) == 1
    for key, value in state.items():
        dup = _DUPLICATE_HEADS.match(key)
        if dup:
            second_copies[key[dup.end(1) + len(".decoder."):]] = value
            duplicates += 1
            continue
        new = rename(key, rules)
        if new is None:
            unmatched.append(key)
            continue
        head = re.match(r"^(class_embed|bbox_embed)\.(\d+)\.", new)
        if head and shared_heads and head.group(2) != "0":
            # the plain model's one head, repeated per decoder layer in the checkpoint
            duplicates += 1
            continue
        out[new] = value
    if unmatched:
        raise ValueError(
            f"{fmt} Deformable DETR checkpoint: {len(unmatched)} keys have no counterpart in visiontf's DeformableDETR, e.g. {unmatched[:8]}"
        )
    if fmt == "hf":
        out = fuse_qkv(out, "HF Deformable DETR checkpoint")
    _fill_tied_heads(out, second_copies, model)
    log.info(
        "converted %d tensors from the %s Deformable DETR layout (%d duplicate head tensors and %d BatchNorm counters dropped)",
        len(out), fmt, duplicates, counters,
    )
    return out


def _fill_tied_heads(out: dict[str, Tensor], second_copies: dict[str, Tensor], model: nn.Module) -> None:
    """Heads a file stores once because they are tied (HF's ``save_pretrained`` drops tied copies).

    A missing ``class_embed.i`` / ``bbox_embed.i`` comes from its second registration in the
    decoder when the file has that one, else from head 0, to which HuggingFace ties the others.
    """
    filled = []
    for key in model.state_dict():
        m = re.match(r"^(class_embed|bbox_embed)\.(\d+)\.(.*)$", key)
        if m is None or key in out:
            continue
        source = second_copies.get(key, out.get(f"{m.group(1)}.0.{m.group(3)}"))
        if source is not None:
            out[key] = source
            filled.append(key)
    if filled:
        log.info("filled %d tied head tensors from their shared copy (e.g. %s)", len(filled), filled[0])
