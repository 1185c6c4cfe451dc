"""Plain nn.Module models; importing this package registers every family."""
from importlib import import_module

from visiontf.models.vit import VisionTransformer

# families written in their own modules register themselves on import; absent ones are skipped
for _mod in ("visiontf.models.detr", "visiontf.models.deformable_detr", "visiontf.models.setr"):
    try:
        import_module(_mod)
    except ModuleNotFoundError as e:
        if e.name != _mod:
            raise

__all__ = ["VisionTransformer"]
