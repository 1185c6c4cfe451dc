"""DINO on other backbones than its ResNet-50: IDEA-Research/DINO's Swin-L, and a plain ViT with ViTDet's
simple feature pyramid. The detector is :mod:`visiontf.models.deformable_detr.dino`'s (same options, same code switches);
only ``backbone`` and what it implies differ.

* ``dino_swin_large_4scale``: ``config/DINO/DINO_4scale_swin.py`` of IDEA-Research/DINO: its Swin-L/12 at
  384 px (``swin_L_384_22k``, in DINO's own layout: :mod:`~visiontf.models.backbones.dino_swin`), stages 1-3
  (``return_interm_indices`` [1, 2, 3]) plus the extra stride-64 level, nothing frozen
  (``backbone_freeze_keywords`` None), drop path 0.2 (its Swin's default). DINO's README: 56.8 COCO AP
  at 12 epochs, 58.0 at 36. Its checkpoints (``backbone.0.*`` for the Swin) load through
  :mod:`~visiontf.models.deformable_detr.dino_convert`.
* ``dino_swin_tiny_4scale``: the same with DINO's Swin-T/7 (``swin_T_224_1k``, which DINO's code builds;
  it publishes no result for it).
* ``dino_vit_small_simplefpn``: visiontf's ViT-S/16 (timm's augreg weights with ``pretrained=True``
  on the backbone) and ViTDet's simple feature pyramid at strides 8/16/32/64
  (:mod:`~visiontf.models.backbones.vitdet`): windows of 14 tokens, global attention in blocks 2, 5, 8, 11, drop
  path 0.1, nothing frozen (ViTDet's ViT-B settings; ViTDet has no ViT-S). Not a published model: no
  AP of the original to reproduce.
"""
from __future__ import annotations

from visiontf.models._registry import register_model
from visiontf.models.contract import ModelCfg
from visiontf.models.deformable_detr.build import create_deformable, sections_of
from visiontf.models.deformable_detr.deformable_detr import DeformableDETR
from visiontf.models.deformable_detr.dino import DINO_OPTIONS, ORIGINAL_CODE, TEST_SETTINGS
from visiontf.models.deformable_detr.dino_convert import convert_state_dict

#: DINO-4scale's transformer (config/DINO/DINO_4scale.py), shared by its backbone variants
_DINO_4SCALE = dict(num_feature_levels=4, hidden_dim=256, nheads=8, enc_layers=6, dec_layers=6, dim_feedforward=2048,
                    dropout=0.0, num_queries=900, enc_n_points=4, dec_n_points=4, num_select=300, **DINO_OPTIONS)
#: ViTDet's ViT-B backbone settings (projects/ViTDet, detectron2's common/models/mask_rcnn_vitdet.py)
VITDET_PYRAMID = dict(window_size=14, global_blocks=(2, 5, 8, 11), drop_path_rate=0.1, out_channels=256)

DEFAULT_CFGS: dict[str, ModelCfg] = {
    "dino_swin_large_4scale": ModelCfg(sections_of(backbone="swin_L_384_22k", freeze_stem=False, **_DINO_4SCALE, **ORIGINAL_CODE)),
    "dino_swin_tiny_4scale": ModelCfg(sections_of(backbone="swin_T_224_1k", freeze_stem=False, **_DINO_4SCALE, **ORIGINAL_CODE)),
    "dino_vit_small_simplefpn": ModelCfg(sections_of(
        backbone="simplefpn:vit_small_patch16_224", freeze_stem=False, backbone_kwargs=VITDET_PYRAMID, **_DINO_4SCALE,
    )),
}


def _create(cfg: ModelCfg, **kwargs) -> DeformableDETR:
    # the variant's backbone kwargs, a config's on top; another backbone keeps none of them (merge_sections)
    return create_deformable(DeformableDETR, cfg, **kwargs)


#: the registry-wide test's settings: DINO's 32-dim transformer of dino.py, on a Swin of 8 channels / a ViT of 32
_SMALL_SWIN = dict(embed_dim=8, depths=(2, 2, 2, 2), num_heads=(1, 1, 2, 2), window_size=7)
_SMALL_VIT = dict(embed_dim=32, depth=4, num_heads=2, window_size=2, global_blocks=(1, 3))
_TEST_SWIN = dict(test_kwargs=dict(TEST_SETTINGS["test_kwargs"], backbone=dict(kwargs=_SMALL_SWIN)), test_image_size=(64, 64))
_TEST_VIT = dict(test_kwargs=dict(TEST_SETTINGS["test_kwargs"], backbone=dict(kwargs=_SMALL_VIT)), test_image_size=(64, 64))


@register_model(tags=("detection", "dino"), filter_fn=convert_state_dict, **_TEST_SWIN)
def dino_swin_large_4scale(**kwargs) -> DeformableDETR:
    """DINO-4scale with IDEA-Research/DINO's Swin-L (``DINO_4scale_swin.py``; 56.8 COCO AP at 12 epochs, 58.0 at 36)."""
    return _create(DEFAULT_CFGS["dino_swin_large_4scale"], **kwargs)


@register_model(tags=("detection", "dino"), filter_fn=convert_state_dict, **_TEST_SWIN)
def dino_swin_tiny_4scale(**kwargs) -> DeformableDETR:
    """DINO-4scale with IDEA-Research/DINO's Swin-T (``swin_T_224_1k``; DINO publishes no Swin-T result)."""
    return _create(DEFAULT_CFGS["dino_swin_tiny_4scale"], **kwargs)


@register_model(tags=("detection", "dino"), filter_fn=convert_state_dict, **_TEST_VIT)
def dino_vit_small_simplefpn(**kwargs) -> DeformableDETR:
    """DINO-4scale on a plain ViT-S/16 with ViTDet's simple feature pyramid (windows of 14, 4 global blocks)."""
    return _create(DEFAULT_CFGS["dino_vit_small_simplefpn"], **kwargs)
