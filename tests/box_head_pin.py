"""Test-only callback for tests/integration/test_deformable_detr_ddp.py: pins a Deformable DETR's box heads when
validation starts (after Lightning has loaded ``--ckpt_path``), so a 2-step model's COCO stats are not all 0.

Used as ``--trainer.callbacks+=box_head_pin.PinBoxHeads`` with ``tests`` on the path; every rank pins the same way.
"""
from __future__ import annotations

import math

import lightning as L
import torch


def pin_box_heads(state_dict: dict[str, torch.Tensor]) -> None:
    """Boxes of 80 % of the image around each query's reference point: ``state_dict``'s tensors changed in place.

    With refinement, layer 0's box is (reference + dx, dy, sigmoid(dw), sigmoid(dh)) and later layers refine it in
    inverse-sigmoid space: small last-layer weights, bias log 4 (sigmoid 0.8) on layer 0's size and 0 after keep
    every query's box near 0.8 x 0.8, at its own reference point, ranked by its own scores. Heads shared between
    layers (one tensor under several keys) end as loading such a changed state dict leaves them: the weight scaled
    once, the bias of the last key."""
    keys = [k for k in state_dict if k.startswith("model.bbox_embed.") and k.endswith("layers.2.weight")]
    scaled = {k: state_dict[k].detach() * 0.05 for k in keys}
    for key in keys:
        bias = [0.0, 0.0] + [math.log(4)] * 2 if int(key.split(".")[2]) == 0 else [0.0] * 4
        state_dict[key].copy_(scaled[key])
        state_dict[key.replace("weight", "bias")].copy_(torch.tensor(bias))


class PinBoxHeads(L.Callback):
    def on_validation_start(self, trainer, pl_module) -> None:
        with torch.no_grad():
            pin_box_heads(pl_module.state_dict(keep_vars=True))
