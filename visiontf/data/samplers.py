"""Samplers: an epoch-seeded train sampler that tells datasets the epoch, and an unrepeated eval
sampler for DDP.

Lightning's default ``DistributedSampler`` repeats samples so every rank gets as many; metrics then
count those samples twice. Evaluation loaders use ``UnrepeatedDistributedSampler`` instead (each
sample exactly once across ranks; ranks may see one batch more or less), which Lightning leaves in
place because it is already a ``DistributedSampler``.
"""
from __future__ import annotations

from collections.abc import Hashable, Iterator, Sequence

import numpy as np
from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler
from torch.utils.data import Dataset, DistributedSampler, Sampler, SequentialSampler

from visiontf.core.errors import UserError
from visiontf.data.batching import SizeBucketBatchSampler
from visiontf.data.loading import EpochIndex


class EpochSampler(DistributedSampler):
    """``DistributedSampler`` whose order depends only on (seed, epoch), yielding :class:`EpochIndex`
    keys so the dataset can seed each sample's augmentation from (seed, epoch, index).

    With ``batch_size`` (the loader's), each key also carries its batch number, so that a batch can
    share draws such as its training scale. With ``group_ids`` as well (one per dataset sample), each
    batch is taken from one group where it can, as torchvision's ``GroupedBatchSampler`` does: the
    shuffled order is read once, every group collects its samples, and a group's batch is emitted when
    it is full; the partial leftovers of the groups end the epoch. The samples of a rank and their
    count do not change, only their order.
    """

    def __init__(self, dataset: Dataset, *args, batch_size: int = 0, group_ids: Sequence[int] | None = None, **kwargs):
        super().__init__(dataset, *args, **kwargs)
        if group_ids is not None:
            if batch_size < 1:
                raise ValueError("EpochSampler: group_ids need the loader's batch_size")
            if len(group_ids) != len(dataset):
                raise ValueError(f"EpochSampler: {len(group_ids)} group ids for {len(dataset)} samples")
        self.batch_size = int(batch_size)
        self.group_ids = None if group_ids is None else [int(g) for g in group_ids]

    def __iter__(self) -> Iterator[EpochIndex]:
        epoch = int(self.epoch)
        order = [int(i) for i in super().__iter__()]
        if self.batch_size < 1:
            return (EpochIndex(i, epoch) for i in order)
        if self.group_ids is not None:
            order = _group_into_batches(order, self.group_ids, self.batch_size)
        return (EpochIndex(i, epoch, pos // self.batch_size) for pos, i in enumerate(order))


def _group_into_batches(order: list[int], group_ids: list[int], batch_size: int) -> list[int]:
    full: list[int] = []
    pending: dict[int, list[int]] = {}  # insertion order: the groups in the order they first appear
    for i in order:
        bucket = pending.setdefault(group_ids[i], [])
        bucket.append(i)
        if len(bucket) == batch_size:
            full.extend(bucket)
            bucket.clear()
    return full + [i for bucket in pending.values() for i in bucket]


def aspect_ratio_groups(sizes: Sequence[tuple[int, int]], num_groups: int) -> list[int]:
    """A group id per (height, width): ``num_groups`` bins of log(width / height) with equal counts
    (quantiles), so that batches of one group need little padding. One group when ``num_groups`` <= 1."""
    if num_groups <= 1 or not sizes:
        return [0] * len(sizes)
    log_aspect = np.log(np.array([w / h for h, w in sizes], dtype=np.float64))
    edges = np.quantile(log_aspect, np.linspace(0, 1, num_groups + 1)[1:-1])
    return np.searchsorted(edges, log_aspect, side="right").tolist()


def eval_sampler(dataset: Dataset, trainer) -> Sampler | None:
    """An unrepeated distributed sampler when running on several processes, else None (sequential)."""
    if trainer is None or getattr(trainer, "world_size", 1) <= 1:
        return None
    if len(dataset) < trainer.world_size:  # Lightning's sampler stops on a bare AssertionError instead
        raise UserError(f"the evaluation set has {len(dataset)} image(s) for {trainer.world_size} processes: each "
                        "process needs at least one; evaluate with --trainer.devices 1 (or more images)")
    return UnrepeatedDistributedSampler(dataset, num_replicas=trainer.world_size, rank=trainer.global_rank, shuffle=False)


def eval_batch_sampler(dataset: Dataset, trainer, batch_size: int, sizes: Sequence[Hashable]) -> SizeBucketBatchSampler:
    """Evaluation batches of same-size images (no padding) over this process's unrepeated share:
    every image gets the computation it gets alone, at any batch size and process count. Use it
    with :class:`~visiontf.data.loading.BatchSamplerLoader`."""
    sampler = eval_sampler(dataset, trainer) or SequentialSampler(dataset)
    return SizeBucketBatchSampler(sampler, batch_size, sizes=sizes)


def train_sampler(dataset: Dataset, trainer, seed: int, batch_size: int = 0,
                  group_ids: Sequence[int] | None = None) -> Sampler:
    """The training order: a shuffling :class:`EpochSampler` over this process's share of the ranks.

    Lightning calls its ``set_epoch``, so a run resumed at an epoch boundary replays exactly the order
    (and, through the :class:`EpochIndex` keys, the augmentations) that the uninterrupted run would
    have used; a plain ``shuffle=True`` loader re-creates its generator and repeats epoch 0's order.
    Under DDP it splits the data over the ranks as Lightning's own sampler would (Lightning leaves a
    ``DistributedSampler`` in place), seeded with the data module's ``seed``. ``batch_size`` and
    ``group_ids``: see :class:`EpochSampler`.
    """
    world = getattr(trainer, "world_size", 1) if trainer is not None else 1
    rank = getattr(trainer, "global_rank", 0) if world > 1 else 0
    return EpochSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=seed, batch_size=batch_size,
                        group_ids=group_ids)
