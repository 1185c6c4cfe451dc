"""Small generated datasets (real image files + annotations) for tests, demos and benchmarks.

Names resolve lazily so that importing one generator does not import the others.
"""
from visiontf.core.lazy import lazy_getattr

_LAZY = {
}

__all__ = sorted(_LAZY)


__getattr__ = lazy_getattr(__name__, _LAZY, globals())
