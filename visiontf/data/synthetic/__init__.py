"""Small generated datasets (real image files + annotations) for tests, demos and benchmarks.

Names resolve lazily so that importing one generator does not import the others.
"""
from importlib import import_module

_LAZY = {
    "make_detection_dataset": "visiontf.data.synthetic.detection",
}


def __getattr__(name):
    if name in _LAZY:
        value = getattr(import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'visiontf.data.synthetic' has no attribute {name!r}")
