"""Samplers: an epoch-seeded train sampler that tells datasets the epoch, and an unrepeated eval
sampler for DDP.

Lightning's default ``DistributedSampler`` repeats samples so every rank gets as many; metrics then
count those samples twice. Evaluation loaders use ``UnrepeatedDistributedSampler`` instead (each
sample exactly once across ranks; ranks may see one batch more or less), which Lightning leaves in
place because it is already a ``DistributedSampler``.
"""
from __future__ import annotations

from collections.abc import Iterator

from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler
from torch.utils.data import Dataset, DistributedSampler, Sampler

from visiontf.data.loading import EpochIndex


class EpochSampler(DistributedSampler):
    """``DistributedSampler`` whose order depends only on (seed, epoch), yielding :class:`EpochIndex`
    keys so the dataset can seed each sample's augmentation from (seed, epoch, index)."""

    def __iter__(self) -> Iterator[EpochIndex]:
        epoch = int(self.epoch)
        return (EpochIndex(int(i), epoch) for i in super().__iter__())


def eval_sampler(dataset: Dataset, trainer) -> Sampler | None:
    """An unrepeated distributed sampler when running on several processes, else None (sequential)."""
    if trainer is None or getattr(trainer, "world_size", 1) <= 1:
        return None
    return UnrepeatedDistributedSampler(dataset, num_replicas=trainer.world_size, rank=trainer.global_rank, shuffle=False)


def train_sampler(dataset: Dataset, trainer, seed: int) -> Sampler:
    """The training order: a shuffling :class:`EpochSampler` over this process's share of the ranks.

    Lightning calls its ``set_epoch``, so a run resumed at an epoch boundary replays exactly the order
    (and, through the :class:`EpochIndex` keys, the augmentations) that the uninterrupted run would
    have used; a plain ``shuffle=True`` loader re-creates its generator and repeats epoch 0's order.
    Under DDP it splits the data over the ranks as Lightning's own sampler would (Lightning leaves a
    ``DistributedSampler`` in place), seeded with the data module's ``seed``.
    """
    world = getattr(trainer, "world_size", 1) if trainer is not None else 1
    rank = getattr(trainer, "global_rank", 0) if world > 1 else 0
    return EpochSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=seed)
