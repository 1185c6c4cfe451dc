"""Deformable DETR and the DINO line: the model, its transformer, queries, denoising, options, conversions,
the mask model, and the DINO names with other backbones."""
