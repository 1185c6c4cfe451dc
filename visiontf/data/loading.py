"""What every data module's DataLoader shares: worker count, pinning, the loader's own RNG, and the
seeding that makes each sample's augmentation a function of (seed, epoch, sample index).

Why per-sample seeds: albumentations 2.x ``Compose`` has its own RNG, which global seeds do not
reach. Copied into DataLoader workers, or rebuilt when a run resumes, that RNG would restart or be
shared, so which augmentation a sample gets would depend on the worker count, on which worker
served it and on whether the run was resumed. The train sampler
(:func:`visiontf.data.samplers.train_sampler`) yields :class:`EpochIndex` keys, and the datasets
(:class:`AugmentedDataset`) seed their pipeline from (seed, epoch, index) before each sample: a run
resumed at an epoch boundary then draws bitwise the same augmentations, with any ``num_workers``.
"""
from __future__ import annotations

import os
from typing import Any, NamedTuple

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

from visiontf.core.distributed import get_rank
from visiontf.core.errors import UserError

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp", ".ppm", ".pgm", ".gif")


class DatasetLayoutError(UserError, ValueError):
    """The files on disk do not match the expected dataset layout; the message names path and fix."""


def default_num_workers(num_workers: int | None) -> int:
    """``min(4, cpu count)`` when not given: enough to keep a small GPU fed without oversubscribing."""
    if num_workers is not None:
        return num_workers
    return min(4, os.cpu_count() or 1)


class EpochIndex(NamedTuple):
    """A sample index together with the epoch it is drawn in (what the train sampler yields).

    ``batch``: the sample's batch number in this epoch (on this rank) when the sampler lays out whole
    batches (``batch_size`` given), else -1. Draws shared by a batch, such as its training scale
    (:meth:`AugmentedDataset.batch_draw`), are seeded from it.
    """

    index: int
    epoch: int
    batch: int = -1


def sample_seed(*keys: int) -> int:
    """A well-mixed 32-bit seed from integers such as (seed, epoch, index): NumPy's ``SeedSequence``."""
    return int(np.random.SeedSequence([int(k) % 2**63 for k in keys]).generate_state(1)[0])


#: keeps the batch draw's seed apart from the per-sample seeds of (seed, epoch, index)
_BATCH_DRAW = 0xBA7C4


class AugmentedDataset(Dataset):
    """Base of the datasets whose albumentations pipeline ``self.transform`` draws random numbers.

    :meth:`sample_index` turns a loader key into the sample index and seeds the pipeline for it:

    * an :class:`EpochIndex` (from the data modules' train sampler): from (``seed``, epoch, index),
      so the draw does not depend on the worker, the worker count or a resume;
    * a plain int (any other DataLoader): once per DataLoader worker, from (``seed``, the worker's
      torch seed, rank), so that workers do not all replay one copied RNG; in the main process the
      pipeline's own seeded stream continues.
    """

    transform: Any = None
    seed: int = 0
    _seeded_worker: tuple[int, int] | None = None

    def sample_index(self, key: int | EpochIndex) -> int:
        can_seed = hasattr(self.transform, "set_random_seed")
        if isinstance(key, EpochIndex):
            if can_seed:
                self.transform.set_random_seed(sample_seed(self.seed, key.epoch, key.index))
            return int(key.index)
        info = get_worker_info()
        if can_seed and info is not None and self._seeded_worker != (info.id, info.seed):
            # info.seed differs per worker and per epoch (non-persistent workers) and follows torch's seed
            self.transform.set_random_seed(sample_seed(self.seed, info.seed, get_rank()))
            self._seeded_worker = (info.id, info.seed)
        return int(key)

    def batch_draw(self, key: int | EpochIndex) -> float | None:
        """A uniform number in [0, 1) that every sample of the key's batch shares, drawn from (seed, epoch,
        batch); None for keys without a batch (evaluation loaders, or a sampler without ``batch_size``)."""
        if not isinstance(key, EpochIndex) or key.batch < 0:
            return None
        # sample_seed is already a well-mixed 32-bit number: scaled, it is the uniform draw itself
        return sample_seed(self.seed, key.epoch, key.batch, _BATCH_DRAW) / 2**32


class TrainLoader(DataLoader):
    """A DataLoader whose workers start fetching at the first batch instead of at ``iter()``.

    Lightning creates the training iterator before it calls the sampler's ``set_epoch`` (and, when
    ``configure_optimizers`` reads ``estimated_stepping_batches``, before it restores a resumed run's
    epoch), and on resume it keeps that iterator for the first epoch. Worker processes pull indices
    from the sampler as soon as their iterator exists, so with ``num_workers > 0`` a resumed run
    would replay epoch 0's order and augmentations. Starting on the first ``next()`` lets the
    sampler see the right epoch; with ``num_workers=0`` nothing changes (that iterator is lazy already).
    """

    def __iter__(self):
        return _DeferredIterator(super().__iter__)


class BatchSamplerLoader(DataLoader):
    """A DataLoader built with ``batch_sampler=``, whose ``sampler`` is that batch sampler's sampler.

    A plain DataLoader given a batch sampler reports a ``SequentialSampler`` it never uses. Under DDP,
    Lightning replaces any sampler that is not a ``DistributedSampler`` with its own repeating one,
    and would do so here although the batch sampler already reads this rank's unrepeated share
    (:func:`visiontf.data.samplers.eval_batch_sampler`). Reporting the real sampler leaves it in place.
    """

    @property
    def sampler(self):
        return self.batch_sampler.sampler

    @sampler.setter
    def sampler(self, value) -> None:
        pass  # DataLoader.__init__ stores its unused default here; the batch sampler's sampler is the one


class _DeferredIterator:
    def __init__(self, start) -> None:
        self._start = start
        self._iterator = None

    def __iter__(self) -> _DeferredIterator:
        return self

    def __next__(self):
        if self._iterator is None:
            self._iterator = self._start()
        return next(self._iterator)


def loader_kwargs(num_workers: int, seed: int = 0, pin_memory: bool | None = None,
                  persistent_workers: bool | None = None) -> dict[str, Any]:
    """Worker, pinning and RNG options shared by the data modules.

    The loader gets its own ``generator``: without one, every new iterator (with persistent workers,
    only the first) draws its worker seed from the global torch RNG, so a resumed run, which builds
    its iterator one epoch later, would consume the global stream differently from the run it continues.
    """
    persistent = num_workers > 0 if persistent_workers is None else (persistent_workers and num_workers > 0)
    return {
        "num_workers": num_workers,
        "persistent_workers": persistent,
        "pin_memory": torch.cuda.is_available() if pin_memory is None else pin_memory,
        "generator": torch.Generator().manual_seed(int(seed)),
    }
