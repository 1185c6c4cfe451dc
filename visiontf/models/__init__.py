"""Plain nn.Module models. Importing this package imports every family, and each registers its
model names with :func:`visiontf.registry.register_model` as it loads."""
from visiontf.models import (  # noqa: F401  (registration happens on import)
    deformable_detr,
    detr,
    dino,
    ipt,
    setr,
    vit,
    vqgan,
    vqgan_transformer,
)
from visiontf.models.vit import VisionTransformer

__all__ = ["VisionTransformer"]
