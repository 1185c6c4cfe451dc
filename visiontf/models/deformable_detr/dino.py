"""DINO (Zhang et al., ICLR 2023): Deformable DETR trained with the DINO line's options.

DINO is Deformable DETR with contrastive denoising, mixed query selection and look forward twice
(plus DAB-DETR's dynamic anchor positions, shared decoder heads and a sine temperature of 20); here
it is :class:`~visiontf.models.deformable_detr.deformable_detr.DeformableDETR` with those options switched on, so
every block, checkpoint-free path and optimiser group is shared with the Deformable DETR family.

Registered:

* ``dino_resnet50_4scale``: the published DINO-4scale R50 (``config/DINO/DINO_4scale.py`` of
  IDEA-Research/DINO): 49.0 COCO AP after 12 epochs, 50.4 after 24.
* ``dino_resnet50_5scale``: DINO-5scale R50 (``DINO_5scale.py``: the same model with the stride-4
  ``layer1`` map as a fifth level, ``return_interm_indices`` [0, 1, 2, 3]): 49.4 AP at 12 epochs, 51.3 at 24.
* ``dino_tiny``: the CPU-sized model of ``configs/deformable_detr/deformable_detr_tiny_shapes.yaml``.

The R50 models compute what DINO's code computes, so that its published checkpoints
(``checkpoint0011_4scale.pth``, ...) load with ``create_model(name, pretrained=path)`` through
:mod:`visiontf.models.deformable_detr.dino_convert` and give the original's outputs (tests/models/deformable_detr/test_dino_checkpoints.py):
:data:`ORIGINAL_CODE` sets DINO's position embedding without the -0.5 offset, its inverse-sigmoid
clamp of 1e-3, and its proposal selection, which ranks padded and border positions too.
``dino_tiny`` keeps visiontf's defaults (Deformable DETR's offset and clamp; proposals that skip
padded positions). Group DETR can be added (``num_query_groups``), which DINO does not have.
Parameter counts with 91 classes equal the original's: 46,893,182 (4-scale) and 47,255,806 (5-scale).
"""
from __future__ import annotations

from visiontf.models._registry import register_model
from visiontf.models.contract import ModelCfg
from visiontf.models.deformable_detr.build import create_deformable, sections_of
from visiontf.models.deformable_detr.deformable_detr import DeformableDETR
from visiontf.models.deformable_detr.dino_convert import convert_state_dict

#: DINO's training switches (``DINO_4scale.py``: use_dn, dn_number 100, noise 0.4 / 0.5,
#: two_stage_type 'standard', embed_init_tgt, dec_pred_*_embed_share, the decoder's output norm,
#: pe_temperature 20, num_select 300)
DINO_OPTIONS = dict(
    with_box_refine=True, two_stage=True, mixed_query_selection=True, look_forward_twice=True, num_denoising=100,
    dn_label_noise_ratio=0.5, dn_box_noise_scale=0.4, share_decoder_heads=True, pos_temperature=20.0, decoder_norm=True,
)

#: where DINO's code (not its paper) differs from Deformable DETR's at inference: PositionEmbeddingSineHW
#: has no -0.5 offset, util.misc.inverse_sigmoid clamps at 1e-3, and the top-K proposals are taken over
#: every position (padded ones give (1, 1, 1, 1) anchors); needed for its checkpoints' exact outputs
ORIGINAL_CODE = dict(pos_offset=0.0, inverse_sigmoid_eps=1e-3, select_padded_proposals=True)

DEFAULT_CFGS: dict[str, ModelCfg] = {
    # DINO-4scale R50: 6+6 layers, d 256, 8 heads, FFN 2048, dropout 0, 4 levels x 4 points, 900 queries
    # (the top 900 proposals), 300 detections kept per image
    "dino_resnet50_4scale": ModelCfg(sections_of(
        backbone="resnet50", channels_last=True, num_feature_levels=4, hidden_dim=256, nheads=8, enc_layers=6, dec_layers=6,
        dim_feedforward=2048, dropout=0.0, num_queries=900, enc_n_points=4, dec_n_points=4, num_select=300, **DINO_OPTIONS,
        **ORIGINAL_CODE,
    )),
    # DINO-5scale R50: layer1..layer4 (strides 4-32) and one extra stride-64 level; otherwise as 4-scale
    # (the config's other difference, batch size 1 per GPU, is a training setting)
    "dino_resnet50_5scale": ModelCfg(sections_of(
        backbone="resnet50", channels_last=True, num_feature_levels=5, backbone_stages=(1, 2, 3, 4), hidden_dim=256, nheads=8,
        enc_layers=6, dec_layers=6, dim_feedforward=2048, dropout=0.0, num_queries=900, enc_n_points=4, dec_n_points=4,
        num_select=300, **DINO_OPTIONS, **ORIGINAL_CODE,
    )),
    # CPU-sized, trained from scratch in minutes (the recipe: configs/deformable_detr/deformable_detr_tiny_shapes.yaml)
    "dino_tiny": ModelCfg(sections_of(
        backbone="timm:regnetx_002", frozen_bn=False, freeze_stem=False, channels_last=True, num_feature_levels=3,
        hidden_dim=128, nheads=4, enc_layers=2, dec_layers=3, dim_feedforward=256, dropout=0.0, num_queries=100,
        enc_n_points=2, dec_n_points=4, num_select=100, **{**DINO_OPTIONS, "num_denoising": 50},
    )),
}


#: the registry-wide test's settings: the variant's backbone and levels, a transformer of 32 dims, 1 + 2 layers,
#: 5 queries and denoising slots
TEST_SETTINGS = dict(test_kwargs=dict(arch=dict(hidden_dim=32, nheads=2, enc_layers=1, dec_layers=2, dim_feedforward=32, num_queries=5),
                                      postprocess=dict(num_top=5)), test_image_size=(64, 64))


def _create(cfg: ModelCfg, **kwargs) -> DeformableDETR:
    return create_deformable(DeformableDETR, cfg, **kwargs)


@register_model(tags=("detection", "dino"), filter_fn=convert_state_dict, **TEST_SETTINGS)
def dino_resnet50_4scale(**kwargs) -> DeformableDETR:
    """DINO-4scale with a ResNet-50 (49.0 COCO AP at 12 epochs, 50.4 at 24; IDEA-Research/DINO)."""
    return _create(DEFAULT_CFGS["dino_resnet50_4scale"], **kwargs)


@register_model(tags=("detection", "dino"), filter_fn=convert_state_dict, **TEST_SETTINGS)
def dino_resnet50_5scale(**kwargs) -> DeformableDETR:
    """DINO-5scale with a ResNet-50: a fifth, stride-4 level (49.4 COCO AP at 12 epochs, 51.3 at 24; IDEA-Research/DINO)."""
    return _create(DEFAULT_CFGS["dino_resnet50_5scale"], **kwargs)


@register_model(tags=("detection", "dino"), filter_fn=convert_state_dict, **TEST_SETTINGS)
def dino_tiny(**kwargs) -> DeformableDETR:
    """A CPU-sized DINO trained from scratch in minutes: RegNetX-200MF (ordinary BatchNorm, no frozen
    stem), strides 8/16/32, d 128, 4 heads, 2 encoder layers (2 points) and 3 decoder layers (4 points),
    FFN 256, 100 queries and 50 denoising slots, with DINO's options (docs/dino.md, "The CPU recipe")."""
    return _create(DEFAULT_CFGS["dino_tiny"], **kwargs)
