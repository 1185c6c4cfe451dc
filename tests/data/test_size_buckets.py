"""Size-bucketed evaluation batches: same-size images only, every index once, the rank's share kept."""
from __future__ import annotations

import pytest
from torch.utils.data import DistributedSampler, SequentialSampler

from visiontf.data.batching import SizeBucketBatchSampler, size_buckets
from visiontf.data.loading import BatchSamplerLoader
from visiontf.data.samplers import eval_batch_sampler

SIZES = [(64, 80), (80, 64), (64, 80), (72, 72), (64, 80), (80, 64), (64, 80)]


def test_size_buckets_group_equal_keys_in_first_seen_order_and_cut_batches():
    assert size_buckets(SIZES) == [[0, 2, 4, 6], [1, 5], [3]]
    assert size_buckets(SIZES, 3) == [[0, 2, 4], [6], [1, 5], [3]]
    assert size_buckets([], 2) == []


def test_batch_sampler_never_mixes_sizes_and_yields_every_index_once():
    batches = list(SizeBucketBatchSampler(SequentialSampler(range(7)), 2, sizes=SIZES))
    assert batches == [[0, 2], [4, 6], [1, 5], [3]]
    assert len(SizeBucketBatchSampler(SequentialSampler(range(7)), 2, sizes=SIZES)) == 4
    assert list(SizeBucketBatchSampler(SequentialSampler(range(7)), 2, drop_last=True, sizes=SIZES)) == [[0, 2], [4, 6], [1, 5]]
    with pytest.raises(ValueError, match="index 6 but only 3 sizes"):
        list(SizeBucketBatchSampler(SequentialSampler(range(7)), 2, sizes=SIZES[:3]))


def test_two_ranks_bucket_their_own_unrepeated_share():
    class Trainer:
        world_size = 2

        def __init__(self, rank):
            self.global_rank = rank

    data = list(range(7))
    seen = []
    for rank in (0, 1):
        batches = eval_batch_sampler(data, Trainer(rank), 8, SIZES)
        assert isinstance(batches.sampler, DistributedSampler)  # what Lightning checks before replacing it
        loader = BatchSamplerLoader(data, batch_sampler=batches, collate_fn=list)
        assert loader.sampler is batches.sampler
        for batch in loader:
            assert len({SIZES[i] for i in batch}) == 1, batch
            seen += batch
    assert sorted(seen) == data  # 4 + 3 images, none repeated
