"""Training batches that pad less: one random scale per batch and aspect-ratio groups.

``CocoDataModule(scale_per_batch=True, aspect_ratio_groups=k)``: the train sampler lays out whole
batches (``EpochSampler(batch_size=, group_ids=)``), each key carries its batch number, and the
final resize takes the batch's shared draw.
"""
from __future__ import annotations

import albumentations as A
import numpy as np
import pytest
import torch

from visiontf.core.errors import UserError
from visiontf.data.loading import EpochIndex
from visiontf.data.samplers import EpochSampler, aspect_ratio_groups
from visiontf.data.transforms import detection as DT
from visiontf.tasks.detection.coco_data import CocoDataModule
from visiontf.tasks.detection.detection_synthetic import make_detection_dataset


class _Items(torch.utils.data.Dataset):
    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        return i


def _epoch(sampler: EpochSampler, epoch: int) -> list[EpochIndex]:
    sampler.set_epoch(epoch)
    return list(sampler)


def test_grouped_order_fills_each_batch_from_one_group():
    n, batch, groups = 53, 4, [int(g) for g in np.random.default_rng(0).integers(0, 3, 53)]
    plain = EpochSampler(_Items(n), num_replicas=1, rank=0, shuffle=True, seed=5)
    grouped = EpochSampler(_Items(n), num_replicas=1, rank=0, shuffle=True, seed=5, batch_size=batch, group_ids=groups)
    keys = _epoch(grouped, 2)
    assert sorted(k.index for k in keys) == list(range(n))  # the same samples, reordered
    assert [k.batch for k in keys] == [pos // batch for pos in range(n)]
    assert all(k.epoch == 2 for k in keys)
    batches = [[k.index for k in keys[b:b + batch]] for b in range(0, n, batch)]
    # only the leftovers of the 3 groups (at most 3 * (batch - 1) samples) end the epoch, in mixed batches
    pure = 0
    while len(batches[pure]) == batch and len({groups[j] for j in batches[pure]}) == 1:
        pure += 1
    assert pure * batch >= n - 3 * (batch - 1)
    assert any(len({groups[j] for j in b}) > 1 for b in batches[pure:])  # this draw has mixed leftovers
    # a function of (seed, epoch): the same again, another epoch differs, and grouping keeps the shuffle
    assert _epoch(grouped, 2) == keys and _epoch(grouped, 3) != keys
    assert [k.index for k in keys] != [k.index for k in _epoch(plain, 2)]
    # without batch_size the keys are those of earlier versions: no batch number
    assert all(k.batch == -1 for k in _epoch(plain, 2))


def test_grouped_order_keeps_each_rank_its_own_share():
    n, groups = 40, [i % 2 for i in range(40)]
    shares = [
        _epoch(EpochSampler(_Items(n), num_replicas=2, rank=r, shuffle=True, seed=1, batch_size=4, group_ids=groups), 0)
        for r in (0, 1)
    ]
    plain = [_epoch(EpochSampler(_Items(n), num_replicas=2, rank=r, shuffle=True, seed=1), 0) for r in (0, 1)]
    for grouped, ungrouped in zip(shares, plain):
        assert sorted(k.index for k in grouped) == sorted(k.index for k in ungrouped)
    assert not {k.index for k in shares[0]} & {k.index for k in shares[1]}
    for share in shares:  # 20 samples, 2 groups: at most 2 * 3 leftovers, so the first 4 batches are pure
        assert all(len({groups[k.index] for k in share[b:b + 4]}) == 1 for b in range(0, 16, 4))


def test_sampler_refuses_group_ids_it_cannot_use():
    with pytest.raises(ValueError, match="batch_size"):
        EpochSampler(_Items(4), num_replicas=1, rank=0, group_ids=[0, 1, 0, 1])
    with pytest.raises(ValueError, match="3 group ids for 4 samples"):
        EpochSampler(_Items(4), num_replicas=1, rank=0, batch_size=2, group_ids=[0, 1, 0])


def test_aspect_ratio_groups_are_equal_count_bins_of_the_aspect():
    sizes = [(100, w) for w in range(60, 260, 2)]  # 100 aspect ratios, increasing
    groups = aspect_ratio_groups(sizes, 4)
    assert groups == sorted(groups) and np.bincount(groups).tolist() == [25, 25, 25, 25]
    assert aspect_ratio_groups(sizes, 1) == [0] * 100 and aspect_ratio_groups([], 3) == []


def test_resize_takes_the_batch_draw():
    resize = DT.RandomShortestSideResize([100, 120, 140, 160], max_size=1000, per_batch=True)
    pipe = A.Compose([resize], bbox_params=DT.bbox_params(), seed=0)
    image, box = np.zeros((50, 80, 3), np.uint8), [[10, 10, 20, 20]]
    for draw, size in ((0.0, 100), (0.3, 120), (0.74, 140), (0.99, 160)):
        for _ in range(3):
            out = pipe(image=image, bboxes=box, labels=[0], ann_index=[0], batch_draw=draw)
            assert min(out["image"].shape[:2]) == size
    # without a draw, each call picks its own size
    seen = {min(pipe(image=image, bboxes=box, labels=[0], ann_index=[0])["image"].shape[:2]) for _ in range(40)}
    assert seen == {100, 120, 140, 160}
    per_image = A.Compose([DT.RandomShortestSideResize([100, 120, 140, 160], max_size=1000)],
                             bbox_params=DT.bbox_params(), seed=0)
    seen = {min(per_image(image=image, bboxes=box, labels=[0], ann_index=[0], batch_draw=0.0)["image"].shape[:2])
            for _ in range(40)}
    assert len(seen) > 1  # per_batch off: the draw is ignored


@pytest.fixture(scope="module")
def varied_set(tmp_path_factory):
    # sizes vary by +-20 % per side, as in the shapes sets
    return make_detection_dataset(tmp_path_factory.mktemp("varied"), num_train=48, num_val=4, seed=3,
                                  image_size=(96, 128))["root"]


def _padding(dm: CocoDataModule, epoch: int = 0):
    dm.setup("fit")
    loader = dm.train_dataloader()
    loader.sampler.set_epoch(epoch)
    useful = total = 0
    shorter_sides = []
    for _images, mask, targets in loader:
        useful += int((~mask).sum())
        total += mask.numel()
        shorter_sides.append({int(min(t["size"])) for t in targets})
    return useful / total, shorter_sides


def test_data_module_batches_share_a_scale_and_pad_less(varied_set):
    sizes = {"batch_size": 6, "num_workers": 0, "scales": [64, 80, 96], "max_size": 1000, "crop_scales": [64],
             "crop_size": (1000, 1000), "val_size": 80}
    base_useful, base_sides = _padding(CocoDataModule(varied_set, **sizes))
    shared_useful, shared_sides = _padding(CocoDataModule(varied_set, scale_per_batch=True, **sizes))
    grouped = CocoDataModule(varied_set, scale_per_batch=True, aspect_ratio_groups=2, **sizes)
    grouped_useful, grouped_sides = _padding(grouped)
    assert any(len(s) > 1 for s in base_sides)
    assert all(len(s) == 1 for s in shared_sides + grouped_sides)  # one shorter side per batch
    assert len(set().union(*shared_sides)) > 1  # and the batches still differ
    assert base_useful < shared_useful < grouped_useful
    # exact resume at an epoch boundary: the layout and the draws depend on (seed, epoch) only
    again = CocoDataModule(varied_set, scale_per_batch=True, aspect_ratio_groups=2, **sizes)
    assert _padding(again, 1) == _padding(grouped, 1) and _padding(grouped, 1) != _padding(grouped, 0)
    # evaluation is untouched
    grouped.setup("validate")
    assert all(min(t["size"]) == 80 for _, _, ts in grouped.val_dataloader() for t in ts)


def test_data_module_checks_the_group_count(varied_set):
    with pytest.raises(UserError, match="aspect_ratio_groups"):
        CocoDataModule(varied_set, aspect_ratio_groups=-1)
