"""RNG states in checkpoints, so a resumed run draws what the interrupted one would have drawn."""
from __future__ import annotations

import random
from typing import Any

import lightning as L
import numpy as np
import torch

from visiontf.io.weights import WeightsError


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
        np.random.set_state((n["name"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"]))
        torch.set_rng_state(state_dict["torch"])
        if "cuda" in state_dict and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state_dict["cuda"])


__all__ = ["RNGStateCheckpoint"]
