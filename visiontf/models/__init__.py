"""Plain nn.Module models and their registry. Importing this package imports every family, and each
registers its model names with :func:`register_model` as it loads (the table is
:mod:`visiontf.models._registry`; family modules import it from there, everyone else from here)."""
# registration happens on import: every module that registers names (plain imports, so that the
# package names visiontf.models.detr, .setr, ... stay the family packages)
import visiontf.models.deformable_detr.deformable_detr
import visiontf.models.deformable_detr.deformable_detr_segm
import visiontf.models.deformable_detr.dino
import visiontf.models.deformable_detr.dino_backbones
import visiontf.models.detr.detr
import visiontf.models.detr.detr_segm
import visiontf.models.dfine.dfine
import visiontf.models.ipt.ipt
import visiontf.models.rtdetr.rtdetr
import visiontf.models.setr.setr
import visiontf.models.vit.depth
import visiontf.models.vit.vit
import visiontf.models.vqgan.gpt
import visiontf.models.vqgan.vqgan  # noqa: F401
from visiontf.models._registry import (
    ModelArgumentError,
    ModelEntry,
    ModelNameError,
    WeightsLayoutError,
    check_model_arguments,
    check_settings_fit_the_weights,
    convert_state,
    create_model,
    get_entry,
    list_models,
    load_model,
    load_pretrained,
    register_model,
    torch_hub_state_dict,
)
from visiontf.models.vit.vit import VisionTransformer

__all__ = ["ModelArgumentError", "ModelEntry", "ModelNameError", "VisionTransformer", "WeightsLayoutError", "check_model_arguments",
           "check_settings_fit_the_weights", "convert_state", "create_model", "get_entry",
           "list_models", "load_model", "load_pretrained", "register_model", "torch_hub_state_dict"]
