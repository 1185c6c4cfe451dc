"""Image restoration: the task (IPT), its inference side, its paired data and PSNR/SSIM.

Everything that belongs to this task alone is in this package; what several tasks share is in the layers
below (``visiontf.data``, ``visiontf.evaluation``, ``visiontf.set_prediction``, ``visiontf.models``) and in
``visiontf.tasks``'s own modules. Names resolve lazily, so importing one module of the package imports no other.
"""
from visiontf.core.lazy import lazy_getattr

_LAZY = {
    "RestorationTask": "visiontf.tasks.restoration.restoration_task",
    "RestorationAdapter": "visiontf.tasks.restoration.restoration_inference",
    "RestorationDataModule": "visiontf.tasks.restoration.restoration_data",
    "calc_psnr": "visiontf.tasks.restoration.restoration_measures",
    "calc_ssim": "visiontf.tasks.restoration.restoration_measures",
}

__all__ = sorted(_LAZY)


__getattr__ = lazy_getattr(__name__, _LAZY, globals())
