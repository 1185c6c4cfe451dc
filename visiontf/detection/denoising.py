"""Contrastive denoising queries (DN-DETR / DINO): re-exported from :mod:`visiontf.models.denoising`.

The queries are built inside the model's forward (models never import :mod:`visiontf.detection`),
so the implementation lives beside the models; the criterion side (:func:`split_denoising_outputs`,
:func:`denoising_match_indices`) is pure tensor bookkeeping and is reached from here too.
"""
from visiontf.models.denoising import (  # noqa: F401
    INVERSE_SIGMOID_EPS,
    DenoisingMeta,
    DenoisingQueries,
    build_contrastive_denoising,
    denoising_attn_mask,
    denoising_match_indices,
    split_denoising_outputs,
)

__all__ = [
    "DenoisingMeta",
    "DenoisingQueries",
    "build_contrastive_denoising",
    "denoising_attn_mask",
    "denoising_match_indices",
    "split_denoising_outputs",
]
