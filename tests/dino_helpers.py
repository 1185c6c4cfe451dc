"""Shared pieces of the tests of the DINO-line options: the toy model, the options switched on, a batch."""
from __future__ import annotations

import torch

#: a toy DeformableDETR (ResNet-18 trunk at 64x96, d 32, 2 heads, 1+2 layers, 8 queries), in its sections
TOY = dict(num_classes=5, backbone=dict(name="resnet18", frozen_bn=False, freeze_stem=False),
           arch=dict(num_feature_levels=3, hidden_dim=32, nheads=2, enc_layers=1, dec_layers=2, dim_feedforward=48, num_queries=8,
                     dec_n_points=2, enc_n_points=2, dropout=0.0))
#: DINO's options at toy size
DINO = dict(arch=dict(with_box_refine=True, two_stage=True),
            dino=dict(mixed_query_selection=True, look_forward_twice=True, num_denoising=6, share_decoder_heads=True))


def toy(*parts: dict, **sections) -> dict:
    """``build_deformable_detr`` keywords: ``TOY``, then each of ``parts`` (``DINO``), then ``sections``, each merged
    on top field by field (``toy(DINO, dino={"num_denoising": 0})`` keeps DINO's other ``dino`` fields)."""
    from visiontf.models.deformable_detr.build import merge_sections

    kwargs = TOY
    for part in (*parts, sections):
        kwargs = merge_sections(kwargs, part)
    return kwargs


def toy_batch() -> tuple[torch.Tensor, torch.Tensor, list[dict]]:
    """Two 64x96 images (the second padded on the right), with 2 and 1 boxes."""
    g = torch.Generator().manual_seed(0)
    images = torch.randn(2, 3, 64, 96, generator=g)
    mask = torch.zeros(2, 64, 96, dtype=torch.bool)
    mask[1, :, 80:] = True
    targets = [
        {"labels": torch.tensor([1, 3]), "boxes": torch.tensor([[0.3, 0.4, 0.2, 0.3], [0.6, 0.5, 0.3, 0.2]])},
        {"labels": torch.tensor([2]), "boxes": torch.tensor([[0.5, 0.5, 0.4, 0.4]])},
    ]
    return images, mask, targets
