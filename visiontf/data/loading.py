"""What every data module's DataLoader shares: worker count, pinning, per-worker augmentation seeds."""
from __future__ import annotations

import os
from typing import Any

import torch

from visiontf.distributed import get_rank

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp", ".ppm", ".pgm", ".gif")


class DatasetLayoutError(ValueError):
    """The files on disk do not match the expected dataset layout; the message names path and fix."""


def default_num_workers(num_workers: int | None) -> int:
    """``min(4, cpu count)`` when not given: enough to keep a small GPU fed without oversubscribing."""
    if num_workers is not None:
        return num_workers
    return min(4, os.cpu_count() or 1)


def seed_worker_transform(worker_id: int) -> None:
    """DataLoader ``worker_init_fn``: give each worker's albumentations pipeline its own stream.

    A seeded ``A.Compose`` is copied into every worker with the same RNG state, so without this all
    workers would apply identical augmentations. ``torch.initial_seed()`` differs per worker (and per
    epoch without persistent workers) and follows Lightning's ``seed_everything``.
    """
    info = torch.utils.data.get_worker_info()
    if info is None:
        return
    transform = getattr(info.dataset, "transform", None)
    if hasattr(transform, "set_random_seed"):
        transform.set_random_seed((torch.initial_seed() + 1_000_003 * get_rank()) % 2**32)


def loader_kwargs(num_workers: int) -> dict[str, Any]:
    """Worker/pinning options shared by the data modules."""
    return {
        "num_workers": num_workers,
        "persistent_workers": num_workers > 0,
        "pin_memory": torch.cuda.is_available(),
        "worker_init_fn": seed_worker_transform if num_workers > 0 else None,
    }
