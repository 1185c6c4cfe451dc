"""DINO (Zhang et al., ICLR 2023): Deformable DETR trained with the DINO line's options.

DINO is Deformable DETR with contrastive denoising, mixed query selection and look forward twice
(plus DAB-DETR's dynamic anchor positions, shared decoder heads and a sine temperature of 20); here
it is :class:`~visiontf.models.deformable_detr.DeformableDETR` with those options switched on, so
every block, checkpoint-free path and optimiser group is shared with the Deformable DETR family.

Registered:

* ``dino_resnet50_4scale``: the published DINO-4scale R50 (``config/DINO/DINO_4scale.py`` of
  IDEA-Research/DINO): 49.0 COCO AP after 12 epochs, 50.4 after 24.
* ``dino_tiny``: the CPU-sized model of ``configs/deformable_detr/deformable_detr_tiny_shapes.yaml``.

Differences from the original code, by design: the encoder's output proposals skip padded and
border positions when selecting the top-K (the original can select them); Group DETR can be added
(``num_query_groups``), which DINO does not have. The parameter count of ``dino_resnet50_4scale``
(91 classes) equals the original's, 46,893,182.
"""
from __future__ import annotations

from visiontf.models._registry import register_model
from visiontf.models.deformable_detr import DeformableDETR

#: DINO's training switches (``DINO_4scale.py``: use_dn, dn_number 100, noise 0.4 / 0.5,
#: two_stage_type 'standard', embed_init_tgt, dec_pred_*_embed_share, the decoder's output norm,
#: pe_temperature 20, num_select 300)
DINO_OPTIONS = dict(
    with_box_refine=True, two_stage=True, mixed_query_selection=True, look_forward_twice=True, num_denoising=100,
    dn_label_noise_ratio=0.5, dn_box_noise_scale=0.4, share_decoder_heads=True, pos_temperature=20.0, decoder_norm=True,
)

DEFAULT_CFGS: dict[str, dict] = {
    # DINO-4scale R50: 6+6 layers, d 256, 8 heads, FFN 2048, dropout 0, 4 levels x 4 points, 900 queries
    # (the top 900 proposals), 300 detections kept per image
    "dino_resnet50_4scale": dict(
        backbone="resnet50", channels_last=True, num_feature_levels=4, hidden_dim=256, nheads=8, enc_layers=6, dec_layers=6,
        dim_feedforward=2048, dropout=0.0, num_queries=900, enc_n_points=4, dec_n_points=4, num_select=300, **DINO_OPTIONS,
    ),
    # CPU-sized, trained from scratch in minutes (the recipe: configs/deformable_detr/deformable_detr_tiny_shapes.yaml)
    "dino_tiny": dict(
        backbone="timm:regnetx_002", frozen_bn=False, freeze_stem=False, channels_last=True, num_feature_levels=3,
        hidden_dim=128, nheads=4, enc_layers=2, dec_layers=3, dim_feedforward=256, dropout=0.0, num_queries=100,
        enc_n_points=2, dec_n_points=4, num_select=100, **{**DINO_OPTIONS, "num_denoising": 50},
    ),
}


def _create(cfg: dict, **kwargs) -> DeformableDETR:
    return DeformableDETR(**{**cfg, **kwargs})


@register_model(tags=("detection", "dino"))
def dino_resnet50_4scale(**kwargs) -> DeformableDETR:
    """DINO-4scale with a ResNet-50 (49.0 COCO AP at 12 epochs, 50.4 at 24; IDEA-Research/DINO)."""
    return _create(DEFAULT_CFGS["dino_resnet50_4scale"], **kwargs)


@register_model(tags=("detection", "dino"))
def dino_tiny(**kwargs) -> DeformableDETR:
    """A CPU-sized DINO trained from scratch in minutes: RegNetX-200MF (ordinary BatchNorm, no frozen
    stem), strides 8/16/32, d 128, 4 heads, 2 encoder layers (2 points) and 3 decoder layers (4 points),
    FFN 256, 100 queries and 50 denoising slots, with DINO's options (docs/dino.md, "The CPU recipe")."""
    return _create(DEFAULT_CFGS["dino_tiny"], **kwargs)
