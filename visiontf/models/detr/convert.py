"""Map foreign DETR state dicts onto :class:`visiontf.models.detr.detr.DETR`.

Recognised layouts (detected from the keys):

* the original facebookresearch/detr checkpoint (``backbone.0.body.*``, ``transformer.*`` with
  ``nn.MultiheadAttention``'s ``in_proj_weight``), also inside a panoptic checkpoint (``detr.``
  prefix; its mask head ``bbox_attention.*``, ``mask_head.*`` loads into a model with one,
  :mod:`visiontf.models.detr.detr_segm`, and is dropped with a warning for a detector without);
* HuggingFace ``DetrForObjectDetection`` with transformers v4 names (``model.backbone.conv_encoder.model.*``,
  separate ``q_proj/k_proj/v_proj``, ``out_proj``, ``fc1``) and the v5 run-time renames
  (``model.backbone.model.*``, ``o_proj``, ``mlp.fc1``, ``model.position_embedding``), with a timm
  or an HF ``ResNetBackbone`` (``embedder``/``encoder.stages``) backbone; ``DetrForSegmentation``'s mask
  head in either version's names (v4 keeps the original's, v5 renames them: :data:`_HF_V5_MASK_HEAD_RULES`);
* visiontf's own names, passed through.

BatchNorm ``num_batches_tracked`` counters are dropped (frozen BatchNorm has none).
"""
from __future__ import annotations

import logging

from torch import Tensor, nn

from visiontf.models.convert import (
    Rules,
    detr_family_format,
    drop_batchnorm_counters,
    fuse_qkv,
    hf_backbone_rules,
    rename,
    rename_state,
    strip_prefix,
)

log = logging.getLogger(__name__)

_LAYER = r"transformer\.(encoder|decoder)\.layers\.(\d+)\."

# the original keeps torch.nn.Transformer's names; visiontf's layers use timm's
_ORIGINAL_RULES: Rules = [
    (r"^backbone\.0\.body\.(.*)$", r"backbone.body.\1"),
    (r"^backbone\.1\.(row_embed|col_embed)\.(.*)$", r"position_embedding.\1.\2"),
    (r"^transformer\.encoder\.layers\.(\d+)\.self_attn\.in_proj_(weight|bias)$", r"transformer.encoder.layers.\1.attn.qkv.\2"),
    (r"^transformer\.encoder\.layers\.(\d+)\.self_attn\.out_proj\.(.*)$", r"transformer.encoder.layers.\1.attn.proj.\2"),
    (r"^transformer\.decoder\.layers\.(\d+)\.self_attn\.in_proj_(weight|bias)$", r"transformer.decoder.layers.\1.self_attn.qkv.\2"),
    (r"^transformer\.decoder\.layers\.(\d+)\.self_attn\.out_proj\.(.*)$", r"transformer.decoder.layers.\1.self_attn.proj.\2"),
    (r"^transformer\.decoder\.layers\.(\d+)\.multihead_attn\.in_proj_(weight|bias)$", r"transformer.decoder.layers.\1.cross_attn.qkv.\2"),
    (r"^transformer\.decoder\.layers\.(\d+)\.multihead_attn\.out_proj\.(.*)$", r"transformer.decoder.layers.\1.cross_attn.proj.\2"),
    (r"^" + _LAYER + r"linear1\.(.*)$", r"transformer.\1.layers.\2.mlp.fc1.\3"),
    (r"^" + _LAYER + r"linear2\.(.*)$", r"transformer.\1.layers.\2.mlp.fc2.\3"),
    (r"^" + _LAYER + r"(norm[123])\.(.*)$", r"transformer.\1.layers.\2.\3.\4"),
    (r"^transformer\.decoder\.norm\.(.*)$", r"transformer.decoder.norm.\1"),
    (r"^(input_proj|query_embed|class_embed|bbox_embed)\.(.*)$", r"\1.\2"),
]


_HF_LAYER = r"^model\.(encoder|decoder)\.layers\.(\d+)\."

_HF_RULES: Rules = [
    *hf_backbone_rules(),
    (r"^model\.(?:backbone\.)?position_embedding\.row_embeddings\.(.*)$", r"position_embedding.row_embed.\1"),
    (r"^model\.(?:backbone\.)?position_embedding\.column_embeddings\.(.*)$", r"position_embedding.col_embed.\1"),
    (r"^model\.input_projection\.(.*)$", r"input_proj.\1"),
    (r"^model\.query_position_embeddings\.(.*)$", r"query_embed.\1"),
    (r"^model\.encoder\.layers\.(\d+)\.self_attn\.([qkv])_proj\.(.*)$", r"transformer.encoder.layers.\1.attn.\2_proj.\3"),
    (r"^model\.encoder\.layers\.(\d+)\.self_attn\.(?:out|o)_proj\.(.*)$", r"transformer.encoder.layers.\1.attn.proj.\2"),
    (r"^model\.encoder\.layers\.(\d+)\.self_attn_layer_norm\.(.*)$", r"transformer.encoder.layers.\1.norm1.\2"),
    (r"^model\.encoder\.layers\.(\d+)\.final_layer_norm\.(.*)$", r"transformer.encoder.layers.\1.norm2.\2"),
    (r"^model\.decoder\.layers\.(\d+)\.self_attn\.([qkv])_proj\.(.*)$", r"transformer.decoder.layers.\1.self_attn.\2_proj.\3"),
    (r"^model\.decoder\.layers\.(\d+)\.self_attn\.(?:out|o)_proj\.(.*)$", r"transformer.decoder.layers.\1.self_attn.proj.\2"),
    (r"^model\.decoder\.layers\.(\d+)\.encoder_attn\.([qkv])_proj\.(.*)$", r"transformer.decoder.layers.\1.cross_attn.\2_proj.\3"),
    (r"^model\.decoder\.layers\.(\d+)\.encoder_attn\.(?:out|o)_proj\.(.*)$", r"transformer.decoder.layers.\1.cross_attn.proj.\2"),
    (r"^model\.decoder\.layers\.(\d+)\.self_attn_layer_norm\.(.*)$", r"transformer.decoder.layers.\1.norm1.\2"),
    (r"^model\.decoder\.layers\.(\d+)\.encoder_attn_layer_norm\.(.*)$", r"transformer.decoder.layers.\1.norm2.\2"),
    (r"^model\.decoder\.layers\.(\d+)\.final_layer_norm\.(.*)$", r"transformer.decoder.layers.\1.norm3.\2"),
    (_HF_LAYER + r"(?:mlp\.)?(fc[12])\.(.*)$", r"transformer.\1.layers.\2.mlp.\3.\4"),
    (r"^model\.decoder\.layernorm\.(.*)$", r"transformer.decoder.norm.\1"),
    (r"^class_labels_classifier\.(.*)$", r"class_embed.\1"),
    (r"^bbox_predictor\.(.*)$", r"bbox_embed.\1"),
]

#: heads of the segmentation variants (original panoptic, HF DetrForSegmentation), not part of DETR
_SEGMENTATION_PREFIXES = ("bbox_attention.", "mask_head.")

# transformers v5 renames the mask head at run time (its conversion_mapping "DetrForSegmentation"); the
# original's names, which Hub checkpoints keep, are visiontf's
_HF_V5_MASK_HEAD_RULES: Rules = [
    (r"^bbox_attention\.([qk])_proj\.(.*)$", r"bbox_attention.\1_linear.\2"),
    (r"^mask_head\.conv([12])\.conv\.(.*)$", r"mask_head.lay\1.\2"),
    (r"^mask_head\.conv([12])\.norm\.(.*)$", r"mask_head.gn\1.\2"),
    (r"^mask_head\.fpn_stages\.(\d)\.fpn_adapter\.(.*)$", lambda m: f"mask_head.adapter{int(m.group(1)) + 1}.{m.group(2)}"),
    (r"^mask_head\.fpn_stages\.(\d)\.refine\.conv\.(.*)$", lambda m: f"mask_head.lay{int(m.group(1)) + 3}.{m.group(2)}"),
    (r"^mask_head\.fpn_stages\.(\d)\.refine\.norm\.(.*)$", lambda m: f"mask_head.gn{int(m.group(1)) + 3}.{m.group(2)}"),
    (r"^mask_head\.output_conv\.(.*)$", r"mask_head.out_lay.\1"),
    (r"^(bbox_attention|mask_head)\.(.*)$", r"\1.\2"),  # the original's names
]


def _mask_head_state(seg: dict[str, Tensor], model: nn.Module) -> dict[str, Tensor]:
    """The mask head's tensors for ``model``: the weights' (renamed to the original's names) when the
    model has a head; none, with a warning, when it has not; the model's own initial ones, logged, when
    the weights have none (a detector's weights under a new head: train it with ``freeze_detector``)."""
    own = [k for k in model.state_dict() if k.startswith(_SEGMENTATION_PREFIXES)]
    if not own:
        if seg:
            log.warning("dropped %d tensors of the segmentation head (%s...): %s has no mask head (detection only; "
                        "a *_panoptic or *_masks model keeps them)", len(seg), next(iter(seg)), type(model).__name__)
        return {}
    if not seg:
        log.warning("the weights have no mask head: %d tensors of %s's mask head (bbox_attention, mask_head) start "
                    "from their initialisation (train them, e.g. on the frozen detector: freeze_detector=True)",
                    len(own), type(model).__name__)
        state = model.state_dict()
        return {k: state[k] for k in own}
    out, unmatched = {}, []
    for key, value in seg.items():
        new = rename(key, _HF_V5_MASK_HEAD_RULES)
        if new is None:
            unmatched.append(key)
        else:
            out[new] = value
    if unmatched:
        raise ValueError(f"DETR mask head: {len(unmatched)} tensors have no counterpart in visiontf's, e.g. {unmatched[:8]}")
    return out


def detect_format(state: dict[str, Tensor]) -> str:
    """``"original"``, ``"hf"`` or ``"visiontf"`` (may be unrecognised; checked by the caller)."""
    return detr_family_format(state, ("model.backbone.", "model.encoder.layers.", "class_labels_classifier."))


def convert_state_dict(state: dict[str, Tensor], model: nn.Module) -> dict[str, Tensor]:
    """Return ``state`` renamed (and q/k/v fused) to ``model``'s DETR layout; own keys pass through.

    Raises:
        ValueError: the layout is none of the known ones (the message lists unmatched keys).
    """
    # without DDP's ``module.`` and the segmentation wrapper's ``detr.`` (its heads keep their names)
    state = strip_prefix(strip_prefix(dict(state), "module.", _SEGMENTATION_PREFIXES), "detr.", _SEGMENTATION_PREFIXES)
    state, counters = drop_batchnorm_counters(state)
    seg = {k: state.pop(k) for k in [k for k in state if k.startswith(_SEGMENTATION_PREFIXES)]}
    fmt = detect_format(state)
    own = model.state_dict()
    if fmt == "visiontf":
        unmatched = [k for k in state if k not in own]
        if len(unmatched) > len(state) / 2:
            raise ValueError(
                f"unrecognised DETR checkpoint layout: {len(unmatched)} of {len(state)} keys match neither the original "
                f"facebookresearch/detr names, HuggingFace DetrForObjectDetection names nor visiontf's, e.g. {unmatched[:8]}"
            )
        return {**state, **_mask_head_state(seg, model)}
    rules = _ORIGINAL_RULES if fmt == "original" else _HF_RULES
    out, unmatched = rename_state(state, rules)
    if unmatched:
        raise ValueError(
            f"{fmt} DETR checkpoint: {len(unmatched)} keys have no counterpart in visiontf's DETR, e.g. {unmatched[:8]}"
        )
    if fmt == "hf":
        out = fuse_qkv(out, "HF DETR checkpoint")
    out.update(_mask_head_state(seg, model))
    log.info("converted %d tensors from the %s DETR layout (%d BatchNorm counters dropped)", len(out), fmt, counters)
    return out
