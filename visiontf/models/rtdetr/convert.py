"""RT-DETR checkpoints of other layouts -> :class:`~visiontf.models.rtdetr.rtdetr.RTDETR` (the registry's ``filter_fn``).

Layouts read:

* lyuwenyu/RT-DETR, ``rtdetr_pytorch`` (v1) and ``rtdetrv2_pytorch`` (v2): the ``model`` or the ``ema``
  (``{"module": ..., "updates": ...}``) entry of a released ``.pth``. v1 names its sequential sub-modules by
  index (``encoder.input_proj.0.0``, ``decoder.enc_output.0``), v2 by name (``.conv``, ``.proj``); v2 also stores
  its fixed anchors and point scales as buffers (``decoder.anchors``, ``decoder.valid_mask``,
  ``cross_attn.num_points_scale``), which visiontf computes and drops here.
* transformers' ``RTDetrForObjectDetection`` and ``RTDetrV2ForObjectDetection`` (``model.backbone.model.*``,
  ``model.encoder.*``, ``model.decoder.*``, the heads twice, under ``model.decoder.`` and at the top), under the names
  of its modules (``state_dict()``) or of its files (the hub's and ``save_pretrained``'s: ``fc1``, ``out_proj``,
  ``encoder.encoder``).

Attention projections: the originals' ``nn.MultiheadAttention`` ``in_proj_weight`` is visiontf's ``qkv``;
transformers' separate ``q_proj``, ``k_proj``, ``v_proj`` are concatenated in that order.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Mapping

import torch
from torch import Tensor, nn

from visiontf.models._registry import WeightsLayoutError
from visiontf.models.backbones.resnet_vd import presnet_to_timm, transformers_resnet_to_timm

__all__ = ["checkpoint_entry", "convert_state_dict", "finish_conversion", "layout_of", "original_key", "original_to_visiontf",
           "transformers_key", "transformers_module_names", "transformers_to_visiontf"]

#: buffers of the originals that visiontf computes instead of storing
_COMPUTED = ("decoder.anchors", "decoder.valid_mask")


def checkpoint_entry(checkpoint: Mapping, entry: str = "ema") -> dict[str, Tensor]:
    """The state dict of a released RT-DETR ``.pth`` (its ``ema`` or ``model`` entry; ``ema`` holds ``module``)."""
    if entry not in ("ema", "model"):
        raise ValueError(f"entry must be 'ema' or 'model', got {entry!r}")
    if entry not in checkpoint:
        raise KeyError(f"the checkpoint has no {entry!r} entry; its entries: {sorted(map(str, checkpoint))}")
    state = checkpoint[entry]
    return dict(state["module"] if entry == "ema" else state)


def layout_of(state: Mapping[str, Tensor]) -> str:
    """``"visiontf"``, ``"original"`` (lyuwenyu's v1 or v2) or ``"transformers"``."""
    keys = list(state)
    if any(k.startswith("model.backbone.model.") or k.startswith("model.decoder.layers.") for k in keys):
        return "transformers"
    if any(k.startswith(("backbone.res_layers.", "backbone.conv1.conv1_", "decoder.decoder.layers.", "decoder.dec_score_head."))
           for k in keys):
        return "original"
    return "visiontf"


# ------------------------------------------------------------------------------------ the originals'
def _attention(rest: str, prefix: str) -> str | None:
    """``nn.MultiheadAttention`` and FFN names of a post-norm layer -> visiontf's."""
    table = {"self_attn.in_proj_weight": "self_attn.qkv.weight", "self_attn.in_proj_bias": "self_attn.qkv.bias",
             "self_attn.out_proj.weight": "self_attn.proj.weight", "self_attn.out_proj.bias": "self_attn.proj.bias",
             "linear1.weight": "mlp.fc1.weight", "linear1.bias": "mlp.fc1.bias",
             "linear2.weight": "mlp.fc2.weight", "linear2.bias": "mlp.fc2.bias"}
    if rest in table:
        return prefix + table[rest]
    if re.fullmatch(r"norm[123]\.(weight|bias)|cross_attn\.\w+\.(weight|bias)", rest):
        return prefix + rest
    return None


def original_key(key: str) -> str | None:
    if key.startswith("backbone."):
        new = presnet_to_timm(key[len("backbone."):])
        return None if new is None else "backbone.body." + new
    m = re.fullmatch(r"(encoder|decoder)\.input_proj\.(\d+)\.(0|1|conv|norm)\.(\w+)", key)
    if m:
        return f"{m[1]}.input_proj.{m[2]}.{ {'0': 'conv', '1': 'norm'}.get(m[3], m[3]) }.{m[4]}"
    m = re.fullmatch(r"encoder\.encoder\.(\d+)\.layers\.(\d+)\.(.+)", key)
    if m:
        new = _attention(m[3], f"encoder.aifi.{m[1]}.{m[2]}.")
        return None if new is None else new.replace(".self_attn.", ".attn.")
    if re.match(r"encoder\.(lateral_convs|fpn_blocks|downsample_convs|pan_blocks)\.", key):
        return key
    m = re.fullmatch(r"decoder\.decoder\.layers\.(\d+)\.(.+)", key)
    if m:
        return _attention(m[2], f"decoder.layers.{m[1]}.")
    m = re.fullmatch(r"decoder\.enc_output\.(0|1|proj|norm)\.(\w+)", key)
    if m:
        return f"decoder.enc_output.{ {'0': 'proj', '1': 'norm'}.get(m[1], m[1]) }.{m[2]}"
    m = re.fullmatch(r"decoder\.dec_(score|bbox)_head\.(.+)", key)
    if m:
        return f"decoder.{m[1]}_heads.{m[2]}"
    if re.match(r"decoder\.(enc_score_head|enc_bbox_head|query_pos_head|denoising_class_embed|tgt_embed)\.", key):
        return key
    return None


def original_to_visiontf(state: Mapping[str, Tensor], key_fn: Callable[[str], str | None] | None = None) -> tuple[dict[str, Tensor], list[str]]:
    """lyuwenyu's v1/v2 layout -> visiontf's names; returns the converted tensors and the keys of no known place.
    ``key_fn`` renames one key (a family built on RT-DETR's names: D-FINE's); None: RT-DETR's."""
    rename = key_fn or original_key
    out, unknown = {}, []
    for key, value in state.items():
        if key in _COMPUTED or key.endswith(".num_points_scale"):
            continue
        new = rename(key)
        (unknown.append(key) if new is None else out.__setitem__(new, value))
    return out, unknown


# ------------------------------------------------------------------------------------ transformers'
#: transformers 5 renamed modules of these models and renames the tensors of a file as it loads it; its files (the
#: hub's, and what ``save_pretrained`` writes) keep the earlier names. Earlier name -> module name, as regular
#: expressions; ``{fc1}`` and ``{fc2}`` are the family's feed-forward names (RT-DETR ``mlp.fc1``, D-FINE ``mlp.layers.0``).
_HF_FILE_NAMES = ((r"\.self_attn\.out_proj\.", ".self_attn.o_proj."),
                  (r"\.layers\.(\d+)\.fc1\.", r".layers.\1.{fc1}."),
                  (r"\.layers\.(\d+)\.fc2\.", r".layers.\1.{fc2}."),
                  (r"^model\.encoder\.encoder\.(\d+)\.layers\.", r"model.encoder.aifi.\1.layers."))


def transformers_module_names(state: Mapping[str, Tensor], fc1: str = "mlp.fc1", fc2: str = "mlp.fc2") -> dict[str, Tensor]:
    """A transformers file's tensors under the names of transformers' modules (the names ``state_dict()`` gives):
    the file's earlier names renamed, the others kept."""
    rules = [(re.compile(pattern), name.format(fc1=fc1, fc2=fc2)) for pattern, name in _HF_FILE_NAMES]
    out = {}
    for key, value in state.items():
        for pattern, name in rules:
            key = pattern.sub(name, key)
        out[key] = value
    return out


_HF_LAYER = {"self_attn_layer_norm": "norm1", "encoder_attn_layer_norm": "norm2", "final_layer_norm": "norm3",
             "self_attn.o_proj": "self_attn.proj", "mlp.fc1": "mlp.fc1", "mlp.fc2": "mlp.fc2"}


def transformers_to_visiontf(state: Mapping[str, Tensor], key_fn: Callable[[str], str | tuple[str, str] | None] | None = None,
                             ) -> tuple[dict[str, Tensor], list[str]]:
    """transformers' ``RTDetr(V2)ForObjectDetection`` layout -> visiontf's names (q/k/v fused into ``qkv``); ``key_fn``
    renames one key (a name, a (fused name, "q" | "k" | "v") pair, or None: no place), RT-DETR's by default."""
    rename = key_fn or transformers_key
    out, unknown = {}, []
    split: dict[str, dict[str, Tensor]] = {}
    for key, value in state.items():
        if key.endswith((".n_points_scale", ".num_points_scale")) or key in ("model.anchors", "model.valid_mask"):
            continue  # computed by visiontf
        new = rename(key)
        if new is None:
            unknown.append(key)
        elif isinstance(new, tuple):  # (fused name, "q" | "k" | "v")
            split.setdefault(new[0], {})[new[1]] = value
        else:
            out[new] = value
    for name, parts in split.items():
        if set(parts) != {"q", "k", "v"}:
            unknown.append(f"{name} (q/k/v incomplete: {sorted(parts)})")
            continue
        out[name] = torch.cat([parts["q"], parts["k"], parts["v"]])
    return out, unknown


def transformers_key(key: str) -> str | tuple[str, str] | None:
    if key.startswith("model.backbone.model."):
        new = transformers_resnet_to_timm(key[len("model.backbone.model."):])
        return None if new is None else "backbone.body." + new
    m = re.fullmatch(r"model\.(encoder|decoder)_input_proj\.(\d+)\.([01])\.(\w+)", key)
    if m:
        return f"{m[1]}.input_proj.{m[2]}.{'conv' if m[3] == '0' else 'norm'}.{m[4]}"
    m = re.fullmatch(r"model\.encoder\.aifi\.(\d+)\.layers\.(\d+)\.(.+)", key)
    if m:
        prefix, rest = f"encoder.aifi.{m[1]}.{m[2]}.", m[3]
        qkv = re.fullmatch(r"self_attn\.([qkv])_proj\.(weight|bias)", rest)
        if qkv:
            return (f"{prefix}attn.qkv.{qkv[2]}", qkv[1])
        table = {"self_attn.o_proj": "attn.proj", "self_attn_layer_norm": "norm1", "final_layer_norm": "norm2",
                 "mlp.fc1": "mlp.fc1", "mlp.fc2": "mlp.fc2"}
        module, _, tensor = rest.rpartition(".")
        return prefix + table[module] + "." + tensor if module in table else None
    if re.match(r"model\.encoder\.(lateral_convs|fpn_blocks|downsample_convs|pan_blocks)\.", key):
        return key[len("model."):]
    m = re.fullmatch(r"model\.decoder\.layers\.(\d+)\.(.+)", key)
    if m:
        prefix, rest = f"decoder.layers.{m[1]}.", m[2]
        qkv = re.fullmatch(r"self_attn\.([qkv])_proj\.(weight|bias)", rest)
        if qkv:
            return (f"{prefix}self_attn.qkv.{qkv[2]}", qkv[1])
        if rest.startswith("encoder_attn.") and not rest.endswith("n_points_scale") and not rest.startswith("encoder_attn_"):
            return prefix + "cross_attn." + rest[len("encoder_attn."):]
        module, _, tensor = rest.rpartition(".")
        return prefix + _HF_LAYER[module] + "." + tensor if module in _HF_LAYER else None
    m = re.fullmatch(r"(?:model\.decoder\.)?(class|bbox)_embed\.(.+)", key)
    if m:
        return f"decoder.{'score' if m[1] == 'class' else 'bbox'}_heads.{m[2]}"
    m = re.fullmatch(r"model\.enc_output\.([01])\.(\w+)", key)
    if m:
        return f"decoder.enc_output.{'proj' if m[1] == '0' else 'norm'}.{m[2]}"
    m = re.fullmatch(r"model\.decoder\.query_pos_head\.(.+)", key)
    if m:
        return "decoder.query_pos_head." + m[1]
    m = re.fullmatch(r"model\.(enc_score_head|enc_bbox_head|denoising_class_embed)\.(.+)", key)
    if m:
        return f"decoder.{m[1]}.{m[2]}"
    if key == "model.weight_embedding.weight":
        return "decoder.tgt_embed.weight"
    return None


# ------------------------------------------------------------------------------------ filter_fn
def convert_state_dict(state: Mapping[str, Tensor], model: nn.Module, strict: bool = True) -> dict[str, Tensor]:
    """Any of the layouts above -> the model's names. Step counters of BatchNorms (``num_batches_tracked``) follow
    the model: dropped where its norms are frozen, filled where a file has none; everything else must have a place."""
    layout = layout_of(state)
    if layout == "visiontf":
        return dict(state)
    if layout == "original":
        converted, unknown = original_to_visiontf(state)
        source = "lyuwenyu/RT-DETR"
    else:
        converted, unknown = transformers_to_visiontf(transformers_module_names(state))
        source = "transformers' RTDetr(V2)ForObjectDetection"
    return finish_conversion(converted, unknown, model, f"this {source} checkpoint has tensors visiontf's RT-DETR has no place for",
                             strict)


def finish_conversion(converted: dict[str, Tensor], unknown: list[str], model: nn.Module, message: str, strict: bool = True,
                      ) -> dict[str, Tensor]:
    """Refuse ``unknown`` keys (``strict``; ``message`` then the keys), and make BatchNorm step counters
    (``num_batches_tracked``) follow the model: dropped where its norms are frozen, filled where a file has none."""
    if unknown and strict:
        raise WeightsLayoutError(f"{message}: {', '.join(unknown[:6])}{' ...' if len(unknown) > 6 else ''}")
    own = model.state_dict()
    converted = {k: v for k, v in converted.items() if not k.endswith("num_batches_tracked") or k in own}
    for key, value in own.items():
        if key.endswith("num_batches_tracked") and key not in converted:
            converted[key] = torch.zeros_like(value)
    return converted
