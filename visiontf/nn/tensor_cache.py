"""A cache for functions that build constant tensors (index layouts) from hashable arguments."""
from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TypeVar

import torch

F = TypeVar("F", bound=Callable)


def tensor_cache(maxsize: int = 64) -> Callable[[F], F]:
    """``functools.lru_cache`` whose entries are built outside inference mode.

    A first call under ``torch.inference_mode`` (a prediction, Lightning's validation) would
    otherwise cache inference tensors, which autograd refuses to save in any later training step of
    the same process ("Inference tensors cannot be saved for backward").
    """

    def decorate(fn: F) -> F:
        cached = functools.lru_cache(maxsize=maxsize)(fn)

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with torch.inference_mode(False):
                return cached(*args, **kwargs)

        wrapper.cache_clear = cached.cache_clear  # type: ignore[attr-defined]
        wrapper.cache_info = cached.cache_info  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]

    return decorate


__all__ = ["tensor_cache"]
