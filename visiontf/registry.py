"""The model registry's public path: ``register_model``, ``create_model``, ``list_models``, ...

The table itself lives in :mod:`visiontf.models._registry`, inside the ``models`` package, as
timm keeps it: importing it first runs ``visiontf/models/__init__.py``, which imports every family
so that each registers itself. This module resolves its names lazily and imports nothing at load
time, so a family module may ``from visiontf.registry import register_model`` without an import
cycle (``models/__init__`` -> family -> ``models._registry``; nothing points back up).
"""
from visiontf._lazy import lazy_getattr

_LAZY = {
    name: "visiontf.models._registry"
    for name in (
        "ModelEntry", "register_model", "list_models", "get_entry", "create_model", "load_pretrained",
        "load_model", "torch_hub_state_dict", "convert_state", "WeightsLayoutError",
    )
}

__all__ = sorted(_LAZY)


__getattr__ = lazy_getattr(__name__, _LAZY, globals())
