"""RNG states in checkpoints, so a resumed run draws what the interrupted one would have drawn."""
from __future__ import annotations

import math
import random
from typing import Any

import lightning as L
import numpy as np
import torch

from visiontf.io.weights import WeightsError

#: the words of NumPy's legacy Mersenne Twister state
MT19937_WORDS = 624


class RNGStateCheckpoint(L.Callback):
    """Saves the global RNG states (python ``random``, NumPy, torch CPU and CUDA) in every checkpoint
    and restores them on resume.

    Lightning restores model, optimizer, LR scheduler and loop counters, but not the global RNGs: a
    resumed run re-seeds them with ``seed_everything`` and so draws different dropout masks, drop-path
    decisions and mixup/cutmix parameters (timm's Mixup uses NumPy) than the run it continues.
    Add it with ``--trainer.callbacks+=visiontf.callbacks.RNGStateCheckpoint``.
    """

    # Plain tensors/ints only, so the states load with torch.load(weights_only=True).
    def state_dict(self) -> dict[str, Any]:
        version, internal, gauss = random.getstate()
        name, keys, pos, has_gauss, cached = np.random.get_state()
        state = {
            "python": {"version": version, "internal": torch.tensor(internal, dtype=torch.int64), "gauss": gauss},
            "numpy": {"name": name, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                      "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
            "torch": torch.get_rng_state(),
        }
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            state["cuda"] = torch.cuda.get_rng_state_all()
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        try:
            self._restore(state_dict)
        except (TypeError, ValueError, KeyError, IndexError, AttributeError, RuntimeError) as e:
            # a state of other types or sizes than this callback writes: the RNGs' own errors name neither
            raise WeightsError(f"the checkpoint resumed from: its RNGStateCheckpoint state is not the random states "
                               f"this callback saves ({type(e).__name__}: {' '.join(str(e).split())[:200]}); resume "
                               "without --trainer.callbacks+=visiontf.callbacks.RNGStateCheckpoint, or from a "
                               "checkpoint written with it") from e

    @staticmethod
    def _restore(state_dict: dict[str, Any]) -> None:
        py = state_dict["python"]
        random.setstate((py["version"], tuple(py["internal"].tolist()), py["gauss"]))
        n = state_dict["numpy"]
        _check_mt19937(n)
        np.random.set_state((n["name"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"]))
        torch.set_rng_state(state_dict["torch"])
        if "cuda" in state_dict and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state_dict["cuda"])


def _check_mt19937(state: dict[str, Any]) -> None:
    """NumPy's ``set_state`` takes a position past its 624 words and its next draw reads beyond them (the process
    died with a segfault): each field is checked against the generator's own layout first."""
    keys, pos = state["keys"], state["pos"]
    if state["name"] != "MT19937":
        raise ValueError(f"numpy generator {state['name']!r}, not 'MT19937'")
    if not torch.is_tensor(keys) or keys.shape != (MT19937_WORDS,) or keys.is_floating_point() or keys.is_complex():
        raise ValueError(f"numpy keys are not {MT19937_WORDS} integers")
    if int(keys.min()) < 0 or int(keys.max()) >= 1 << 32:
        raise ValueError("numpy keys are not 32-bit words")
    if not isinstance(pos, int) or isinstance(pos, bool) or not 0 <= pos <= MT19937_WORDS:
        raise ValueError(f"numpy position {pos!r} is not in 0..{MT19937_WORDS}")
    if state["has_gauss"] not in (0, 1) or not math.isfinite(state["cached_gaussian"]):
        raise ValueError("numpy's cached gaussian is not a flag and a finite number")


__all__ = ["RNGStateCheckpoint"]
