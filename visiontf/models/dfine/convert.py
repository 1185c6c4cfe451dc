"""D-FINE and DEIM checkpoints of other layouts -> :class:`~visiontf.models.dfine.dfine.DFINE` (the registry's ``filter_fn``).

Layouts read (each strictly: every tensor has a place, or loading fails naming the ones without):

* Peterande/D-FINE and ShihuaHuang95/DEIM (one layout): the ``model`` or the ``ema`` (``{"module": ..., "updates": ...}``)
  entry of a released ``.pth`` (:func:`~visiontf.models.rtdetr.convert.checkpoint_entry`). The backbone's names are
  timm's HGNetv2 names already (``backbone.stem.stem1.conv``); the encoder's are RT-DETR's with D-FINE's blocks
  (``fpn_blocks.0.cv2.0.bottlenecks.0.conv1``; the SCDown of ``downsample_convs.0`` one level deeper, ``.0.cv1``); the
  decoder's layers are under ``decoder.decoder.layers`` with ``linear1``/``linear2`` FFNs and a ``gateway``. The fixed
  ``decoder.up`` and ``decoder.reg_scale`` are stored twice (also under ``decoder.decoder.``; ``reg_scale`` as an
  integer tensor where the config gives an integer), the anchors and the points' scales once (``decoder.anchors``,
  ``cross_attn.num_points_scale``): visiontf keeps one float copy of the first two and computes the others.
* transformers' ``DFineForObjectDetection``: the backbone as ``HGNetV2Backbone`` (``model.backbone.model.embedder``,
  ``...encoder.stages``), the encoder's input projections at the top (``model.encoder_input_proj``), its blocks with
  their own names (``conv1``, ``csp_rep1``, ..., ``conv4``; SCDown's ``conv1``/``conv2``), separate q/k/v projections
  (fused here), FFNs as ``mlp.layers.{0,1}`` and the class and box heads stored twice (``model.decoder.class_embed``
  and ``class_embed``); or its files' names (the hub's, ``save_pretrained``'s: ``fc1``, ``out_proj``, ``encoder.encoder``).
"""
from __future__ import annotations

import re
from collections.abc import Mapping

from torch import Tensor, nn

from visiontf.models.backbones.hgnetv2 import transformers_hgnetv2_to_timm
from visiontf.models.rtdetr.convert import (
    finish_conversion,
    original_key,
    original_to_visiontf,
    transformers_key,
    transformers_module_names,
    transformers_to_visiontf,
)

__all__ = ["convert_state_dict", "dfine_original_key", "dfine_transformers_key", "layout_of"]

#: transformers' names of a CSP-ELAN block's parts -> the original's (and visiontf's)
_HF_ELAN = {"conv1": "cv1", "csp_rep1": "cv2.0", "conv2": "cv2.1", "csp_rep2": "cv3.0", "conv3": "cv3.1", "conv4": "cv4"}
#: the fixed numbers stored twice in the originals' files
_TWICE = ("decoder.decoder.up", "decoder.decoder.reg_scale")


def layout_of(state: Mapping[str, Tensor]) -> str:
    """``"visiontf"``, ``"original"`` (Peterande's D-FINE or DEIM) or ``"transformers"``."""
    keys = list(state)
    if any(k.startswith(("model.backbone.model.", "model.decoder.layers.")) for k in keys):
        return "transformers"
    if any(k.startswith(("backbone.stem.", "backbone.stages.", "decoder.decoder.layers.", "decoder.dec_score_head.")) for k in keys):
        return "original"
    return "visiontf"


def dfine_original_key(key: str) -> str | None:
    """A key of the originals' layout as visiontf's, or None: D-FINE's own parts, then RT-DETR's shared names."""
    if key.startswith("backbone."):
        return "backbone.body." + key[len("backbone."):]
    m = re.fullmatch(r"encoder\.downsample_convs\.(\d+)\.0\.(cv[12]\.(?:conv|norm)\.\w+)", key)
    if m:
        return f"encoder.downsample_convs.{m[1]}.{m[2]}"
    if key in ("decoder.up", "decoder.reg_scale") or re.match(r"decoder\.(pre_bbox_head|input_proj)\.", key):
        return key
    m = re.fullmatch(r"decoder\.decoder\.lqe_layers\.(.+)", key)
    if m:
        return "decoder.lqe_layers." + m[1]
    m = re.fullmatch(r"decoder\.decoder\.layers\.(\d+)\.(gateway\.(?:gate|norm)\.(?:weight|bias))", key)
    if m:
        return f"decoder.layers.{m[1]}.{m[2]}"
    return original_key(key)


def dfine_transformers_key(key: str) -> str | tuple[str, str] | None:
    """A key of transformers' ``DFineForObjectDetection`` as visiontf's (a (fused name, "q"|"k"|"v") pair for the
    attention projections), or None: D-FINE's own parts, then RT-DETR's shared names."""
    if key.startswith("model.backbone.model."):
        new = transformers_hgnetv2_to_timm(key[len("model.backbone.model."):])
        return None if new is None else "backbone.body." + new
    m = re.fullmatch(r"model\.encoder\.(fpn_blocks|pan_blocks)\.(\d+)\.(conv[1-4]|csp_rep[12])\.(.+)", key)
    if m:
        return f"encoder.{m[1]}.{m[2]}.{_HF_ELAN[m[3]]}.{m[4]}"
    m = re.fullmatch(r"model\.encoder\.downsample_convs\.(\d+)\.conv([12])\.(.+)", key)
    if m:
        return f"encoder.downsample_convs.{m[1]}.cv{m[2]}.{m[3]}"
    m = re.fullmatch(r"model\.encoder\.aifi\.(\d+)\.layers\.(\d+)\.mlp\.layers\.([01])\.(weight|bias)", key)
    if m:
        return f"encoder.aifi.{m[1]}.{m[2]}.mlp.fc{int(m[3]) + 1}.{m[4]}"
    m = re.fullmatch(r"model\.decoder\.layers\.(\d+)\.(?:mlp\.layers\.([01])|(gateway\.(?:gate|norm))|final_layer_norm)\.(weight|bias)", key)
    if m:
        part = f"mlp.fc{int(m[2]) + 1}" if m[2] is not None else m[3] if m[3] is not None else "norm3"
        return f"decoder.layers.{m[1]}.{part}.{m[4]}"
    m = re.fullmatch(r"model\.decoder\.(up|reg_scale|pre_bbox_head\..+|lqe_layers\..+)", key)
    if m:
        return "decoder." + m[1]
    m = re.fullmatch(r"model\.decoder_input_proj\.(\d+)\.([01])\.(\w+)", key)
    if m:
        return f"decoder.input_proj.{m[1]}.{'conv' if m[2] == '0' else 'norm'}.{m[3]}"
    return transformers_key(key)


def convert_state_dict(state: Mapping[str, Tensor], model: nn.Module, strict: bool = True) -> dict[str, Tensor]:
    """Any layout of the module docstring -> the model's names (BatchNorm step counters following the model)."""
    layout = layout_of(state)
    if layout == "visiontf":
        return dict(state)
    if layout == "original":
        converted, unknown = original_to_visiontf({k: v for k, v in state.items() if k not in _TWICE}, dfine_original_key)
        # the originals build reg_scale from the config's number: an integer tensor where the config says 4 or 8
        converted |= {k: converted[k].float() for k in ("decoder.up", "decoder.reg_scale") if k in converted}
        source = "Peterande/D-FINE (or DEIM)"
    else:
        converted, unknown = transformers_to_visiontf(transformers_module_names(state, "mlp.layers.0", "mlp.layers.1"),
                                                      dfine_transformers_key)
        source = "transformers' DFineForObjectDetection"
    return finish_conversion(converted, unknown, model, f"this {source} checkpoint has tensors visiontf's D-FINE has no place for", strict)
