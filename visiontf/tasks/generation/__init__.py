"""Generation: VQGAN's tokenizer stage (``TokenizerTask``) and its GPT stage (``TransformerTask``), their
inference side, the image-folder data and FID.

Everything that belongs to this task alone is in this package; what several tasks share is in the layers
below (``visiontf.data``, ``visiontf.evaluation``, ``visiontf.set_prediction``, ``visiontf.models``) and in
``visiontf.tasks``'s own modules. Names resolve lazily, so importing one module of the package imports no other.
"""
from visiontf.core.lazy import lazy_getattr

_LAZY = {
    "TokenizerTask": "visiontf.tasks.generation.tokenizer_task",
    "TransformerTask": "visiontf.tasks.generation.gpt_task",
    "GenerationAdapter": "visiontf.tasks.generation.generation_inference",
    "TokenizerDataModule": "visiontf.tasks.generation.image_folder_data",
}

__all__ = sorted(_LAZY)


__getattr__ = lazy_getattr(__name__, _LAZY, globals())
