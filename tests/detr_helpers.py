"""What the DETR tests share: HF transformers' DETR at a small size with non-trivial random values, and the
matching visiontf settings (tests/models/detr/, tests/models/test_finetune.py)."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

# --------------------------------------------------------------------------- HuggingFace
_TABLES = ("query_embed.weight", "row_embed.weight", "col_embed.weight", "query_position_embeddings.weight",
           "row_embeddings.weight", "column_embeddings.weight")


def _randomize(module: nn.Module) -> None:
    """Non-trivial values everywhere (LayerNorm/BN affine and BN statistics too), with moderate activations."""
    with torch.no_grad():
        for name, t in list(module.named_parameters()) + list(module.named_buffers()):
            if not t.is_floating_point():
                continue
            if name.endswith("running_var"):
                t.uniform_(0.5, 1.5)
            elif name.endswith("running_mean"):
                t.normal_(0, 0.1)
            elif t.dim() == 1 and ("norm" in name or "bn" in name or "downsample.1" in name or "normalization" in name):
                t.copy_((0.5 if name.endswith("weight") else 0.0) + 0.1 * torch.randn_like(t))
            elif name.endswith(_TABLES):
                t.normal_(0, 1)
            else:
                t.normal_(0, 1.0 / math.sqrt(max(1, t[0].numel() if t.dim() > 1 else 16)))


def _hf_model(**cfg):
    transformers = pytest.importorskip("transformers")
    config = transformers.DetrConfig(use_pretrained_backbone=False, **cfg)
    hf = transformers.DetrForObjectDetection(config).eval()
    _randomize(hf)
    return hf


_SMALL = dict(backbone="resnet18", num_labels=5, encoder_layers=2, decoder_layers=2, d_model=64, encoder_attention_heads=4,
              decoder_attention_heads=4, encoder_ffn_dim=96, decoder_ffn_dim=96, num_queries=12)


_OURS = dict(num_classes=5, arch=dict(hidden_dim=64, nheads=4, enc_layers=2, dec_layers=2, dim_feedforward=96, num_queries=12))
