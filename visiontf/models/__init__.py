"""Plain nn.Module models and their registry. Importing this package imports every family, and each
registers its model names with :func:`register_model` as it loads (the table is
:mod:`visiontf.models._registry`; family modules import it from there, everyone else from here)."""
from visiontf.models import (  # noqa: F401  (registration happens on import)
    deformable_detr,
    deformable_segm,
    detr,
    detr_segm,
    dino,
    dino_backbones,
    ipt,
    setr,
    vit,
    vit_depth,
    vqgan,
    vqgan_transformer,
)
from visiontf.models._registry import (
    ModelArgumentError,
    ModelEntry,
    WeightsLayoutError,
    convert_state,
    create_model,
    get_entry,
    list_models,
    load_model,
    load_pretrained,
    register_model,
    torch_hub_state_dict,
)
from visiontf.models.vit import VisionTransformer

__all__ = ["ModelArgumentError", "ModelEntry", "VisionTransformer", "WeightsLayoutError", "convert_state", "create_model", "get_entry",
           "list_models", "load_model", "load_pretrained", "register_model", "torch_hub_state_dict"]
