"""Inference on raw images (the Predictor), attention maps and export; drawing re-exported from the adapters.

Names resolve lazily so ``import visiontf.inference`` stays light.
"""
from visiontf.core.lazy import lazy_getattr

_LAZY = {
    "Predictor": "visiontf.inference.predictor",
    "load_inputs": "visiontf.inference.predictor",
    "infer_task": "visiontf.adapters.base",
    "draw_detections": "visiontf.adapters.drawing",
    "draw_segmentation": "visiontf.adapters.drawing",
    "draw_caption": "visiontf.adapters.drawing",
    "save_image": "visiontf.adapters.drawing",
    "PALETTE": "visiontf.adapters.drawing",
    "detr_attention_maps": "visiontf.adapters.attention",
    "save_detr_attention_figure": "visiontf.adapters.attention",
    "vit_attention_rollout": "visiontf.adapters.attention",
    "attention_rollout": "visiontf.adapters.attention",
    "save_rollout_overlay": "visiontf.adapters.attention",
    "export_model": "visiontf.inference.export",
    "export_onnx": "visiontf.inference.export",
}

__all__ = sorted(_LAZY)


__getattr__ = lazy_getattr(__name__, _LAZY, globals())
