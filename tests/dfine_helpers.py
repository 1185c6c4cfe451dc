"""Shared by the D-FINE tests: a small transformers ``DFineForObjectDetection`` with random weights and the same model in
visiontf, loaded from its state dict through the family's converter (``create_model(name, pretrained=file)``).

The toy model: an HGNetv2 of B0's layout at widths 8-48 (learnable affine blocks, frozen BatchNorm as transformers'
default), d 32, 4 heads, 3 decoder layers with (3, 6, 3) points, 10 queries, 5 classes, D-FINE-S's encoder blocks
(expansion 0.5, one RepVGG block per branch). RT-DETR's helpers (one torch thread, padded batches, targets, fixed
denoising queries) are reused from ``rtdetr_helpers``.
"""
from __future__ import annotations

from pathlib import Path

import torch
from rtdetr_helpers import NUM_CLASSES, QUERIES, randomize

from visiontf.models import create_model

#: an HGNetv2 stage table (in, mid, out, blocks, downsample, light, kernel, layers) at toy widths
STAGES = ((8, 8, 16, 1, False, False, 3, 2), (16, 8, 24, 1, True, False, 3, 2), (24, 8, 32, 2, True, True, 5, 2), (32, 16, 48, 1, True, True, 5, 2))
#: the toy model in visiontf's sections (D-FINE-S with a narrow backbone, as the transformers config below)
TOY = dict(
    backbone=dict(kwargs=dict(stem=(8, 8), stages=STAGES), frozen_bn=True),
    encoder=dict(hidden_dim=32, nhead=4, dim_feedforward=64),
    decoder=dict(hidden_dim=32, nhead=4, dim_feedforward=64, num_layers=3, num_queries=QUERIES),
    denoising=dict(num_denoising=6),
)


def transformers_config(**extra):
    from transformers import DFineConfig, HGNetV2Config

    backbone = HGNetV2Config(stem_channels=[3, 8, 8], stage_in_channels=[r[0] for r in STAGES], stage_mid_channels=[r[1] for r in STAGES],
                             stage_out_channels=[r[2] for r in STAGES], stage_num_blocks=[r[3] for r in STAGES],
                             stage_downsample=[r[4] for r in STAGES], stage_light_block=[r[5] for r in STAGES],
                             stage_kernel_size=[r[6] for r in STAGES], stage_numb_of_layers=[r[7] for r in STAGES],
                             use_learnable_affine_block=True, out_indices=[2, 3, 4], embedding_size=8, hidden_sizes=[r[2] for r in STAGES],
                             depths=[r[3] for r in STAGES])
    kwargs = dict(backbone_config=backbone, encoder_hidden_dim=32, encoder_in_channels=[24, 32, 48], encoder_ffn_dim=64, encoder_attention_heads=4,
                  d_model=32, decoder_in_channels=[32, 32, 32], decoder_ffn_dim=64, decoder_attention_heads=4, decoder_layers=3,
                  num_queries=QUERIES, num_labels=NUM_CLASSES, num_denoising=6, decoder_n_points=[3, 6, 3], hidden_expansion=0.5, depth_mult=0.34)
    return DFineConfig(**{**kwargs, **extra})


def transformers_model(seed: int = 0, **extra):
    """transformers' D-FINE at the toy widths with random weights on float16's grid (its fixed point scales kept)."""
    from transformers import DFineForObjectDetection

    torch.manual_seed(seed)
    model = DFineForObjectDetection(transformers_config(**extra))
    randomize(model, seed)
    with torch.no_grad():
        for module in model.modules():
            if hasattr(module, "num_points_scale"):  # a fixed table (1 / points of each sample's level), not a weight
                module.num_points_scale.copy_(torch.tensor([1 / n for n in module.num_points_list for _ in range(n)]))
    return model.eval()


def visiontf_model(path: Path, tables: str = "transformers", **sections) -> torch.nn.Module:
    """visiontf's ``dfine_s`` at the toy widths, loading ``path`` (a transformers or original state dict)."""
    kwargs = {k: {**v, **sections.get(k, {})} for k, v in TOY.items()}
    return create_model("dfine_s", pretrained=str(path), num_classes=NUM_CLASSES, input_norm="none", tables=tables, **kwargs).eval()
