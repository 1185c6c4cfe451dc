"""Inference on raw images (the Predictor), attention maps and export; drawing re-exported from the adapters.

Names resolve lazily so ``import visiontf.inference`` stays light.
"""
from visiontf.core.lazy import lazy_getattr

_LAZY = {
    "Predictor": "visiontf.inference.predictor",
    "load_inputs": "visiontf.inference.predictor",
    "infer_task": "visiontf.tasks.task_inference",
    "draw_detections": "visiontf.tasks.drawing",
    "draw_segmentation": "visiontf.tasks.drawing",
    "draw_caption": "visiontf.tasks.drawing",
    "save_image": "visiontf.tasks.drawing",
    "PALETTE": "visiontf.tasks.drawing",
    "detr_attention_maps": "visiontf.tasks.attention_pictures",
    "save_detr_attention_figure": "visiontf.tasks.attention_pictures",
    "vit_attention_rollout": "visiontf.tasks.attention_pictures",
    "attention_rollout": "visiontf.tasks.attention_pictures",
    "save_rollout_overlay": "visiontf.tasks.attention_pictures",
    "export_model": "visiontf.inference.export",
    "export_onnx": "visiontf.inference.export",
}

__all__ = sorted(_LAZY)


__getattr__ = lazy_getattr(__name__, _LAZY, globals())
