"""Samplers for evaluation under DDP.

Lightning's default ``DistributedSampler`` repeats samples so every rank gets as many; metrics then
count those samples twice. Evaluation loaders use ``UnrepeatedDistributedSampler`` instead (each
sample exactly once across ranks; ranks may see one batch more or less), which Lightning leaves in
place because it is already a ``DistributedSampler``.
"""
from __future__ import annotations

from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler
from torch.utils.data import Dataset, DistributedSampler, Sampler


def eval_sampler(dataset: Dataset, trainer) -> Sampler | None:
    """An unrepeated distributed sampler when running on several processes, else None (sequential)."""
    if trainer is None or getattr(trainer, "world_size", 1) <= 1:
        return None
    return UnrepeatedDistributedSampler(dataset, num_replicas=trainer.world_size, rank=trainer.global_rank, shuffle=False)


def train_sampler(dataset: Dataset, trainer, seed: int) -> Sampler | None:
    """A shuffling sampler whose order depends only on (seed, epoch), for exact resume.

    On one process this is a single-replica ``DistributedSampler``: Lightning calls its
    ``set_epoch``, so a run resumed at an epoch boundary replays exactly the order the
    uninterrupted run would have used (a plain ``shuffle=True`` loader re-creates its generator and
    repeats epoch 0's order). Under DDP it returns None and Lightning injects its own
    ``DistributedSampler`` (also epoch-seeded) over the ranks.
    """
    if trainer is not None and getattr(trainer, "world_size", 1) > 1:
        return None
    return DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True, seed=seed)
