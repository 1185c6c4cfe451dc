"""Plain nn.Module models. Importing this package imports every family, and each registers its
model names with :func:`visiontf.registry.register_model` as it loads."""
from visiontf.models import deformable_detr, detr, dino, setr, vit, vqgan, vqgan_transformer  # noqa: F401  (registration happens on import)
from visiontf.models.vit import VisionTransformer

__all__ = ["VisionTransformer"]
