"""visiontf: vision transformers as plain nn.Modules and Lightning tasks.

Classification (ViT, DeiT), detection (DETR; Deformable DETR and the DINO line), panoptic and instance
segmentation (DETR's mask head), semantic segmentation (SETR), restoration (IPT)
and generation (the VQGAN tokenizer and its GPT), loading the original checkpoints.

The top-level names are resolved lazily so that light entry points (for example evaluating a
COCO results file) do not pay for importing torch or Lightning.
"""
from visiontf.core import former_paths
from visiontf.core.lazy import lazy_getattr

__version__ = "0.1.0"

_LAZY = {
    "create_model": "visiontf.models",
    "list_models": "visiontf.models",
    "register_model": "visiontf.models",
    "load_model": "visiontf.models",
    "save_model": "visiontf.io.weights",
    "Predictor": "visiontf.inference.predictor",
}

__all__ = sorted(_LAZY) + ["__version__"]


__getattr__ = lazy_getattr(__name__, _LAZY, globals())

# configs and checkpoints written before the task packages name classes at their former modules
former_paths.install()
