"""Samplers for evaluation under DDP.

Lightning's default ``DistributedSampler`` repeats samples so every rank gets as many; metrics then
count those samples twice. Evaluation loaders use ``UnrepeatedDistributedSampler`` instead (each
sample exactly once across ranks; ranks may see one batch more or less), which Lightning leaves in
place because it is already a ``DistributedSampler``.
"""
from __future__ import annotations

from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler
from torch.utils.data import Dataset, Sampler


def eval_sampler(dataset: Dataset, trainer) -> Sampler | None:
    """An unrepeated distributed sampler when running on several processes, else None (sequential)."""
    if trainer is None or getattr(trainer, "world_size", 1) <= 1:
        return None
    return UnrepeatedDistributedSampler(dataset, num_replicas=trainer.world_size, rank=trainer.global_rank, shuffle=False)
