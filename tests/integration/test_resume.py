"""Exact resume after a hard kill: the resumed run ends with bitwise the weights of an uninterrupted run.

What it takes (checked here with the tiny ViT, mixup on so NumPy's RNG matters, the config's random
augmentation and one persistent DataLoader worker):

* Lightning restores model, optimizer, LR scheduler and loop counters from ``last.ckpt``.
* ``visiontf.callbacks.RNGStateCheckpoint`` (a default callback of ``tools/train.py``) restores the
  global python/NumPy/torch RNGs, which Lightning does not (``seed_everything`` would restart
  them): mixup's lambda comes from NumPy.
* Shuffling is a function of (seed, epoch): the data modules' train sampler
  (``visiontf.data.samplers.train_sampler``) gets ``set_epoch`` from Lightning. A plain
  ``shuffle=True`` loader with a generator seeded once would repeat epoch 0's order after a resume.
* Augmentation is a function of (seed, epoch, sample index): the sampler yields ``EpochIndex`` keys
  and the datasets seed their albumentations pipeline from them
  (``visiontf.data.loading.AugmentedDataset``). albumentations 2.x ``Compose`` has its own RNG that
  global seeds do not reach; rebuilt on resume, and copied into workers, it would restart and draw
  other crops and flips (measured before this: weights off by ~2e-3).
* Each DataLoader has its own ``generator``, so building the (persistent) worker iterator one epoch
  later in the resumed run does not shift the global torch RNG.
* The checkpoint is at an epoch boundary. A plain DataLoader is not resumable mid-epoch: Lightning
  restarts the epoch from its first batch while counting from the saved step (it warns), so a
  mid-epoch resume replays batches and cannot be exact.

The data-level tests below show, for all three data modules with a worker, that the seeding has teeth:
two epochs draw different augmentations, a fresh loader replaying an epoch draws the same ones, and
plain (epoch-less) keys, the former behaviour, do not replay.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from ddp_utils import ROOT, run, subprocess_env

pytestmark = pytest.mark.slow

STEPS_PER_EPOCH, EPOCHS, KILL_AFTER = 2, 3, 3  # last.ckpt at step 2 = end of epoch 0; killed during epoch 1


def _fit_args(data: Path, out: Path) -> list[str]:
    return ["tools/train.py", "fit", "--config", "configs/vit/vit_tiny_synthetic.yaml",
            f"--data.init_args.root={data}", "--data.init_args.image_size=32", "--data.init_args.num_workers=1",
            "--data.init_args.batch_size=4",
            "--model.init_args.model_kwargs={img_size: 32, patch_size: 8, depth: 1, embed_dim: 48, num_heads: 3}",
            "--model.init_args.mixup_alpha=0.8", "--model.init_args.warmup_steps=2",
            f"--trainer.max_epochs={EPOCHS}", "--trainer.devices=1",
            "--trainer.num_sanity_val_steps=0", "--trainer.enable_progress_bar=false",
            "--checkpoint.monitor=null", "--checkpoint.every_n_train_steps=2", f"--trainer.default_root_dir={out}"]


def _load(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def test_resume_after_sigkill_is_bitwise_exact(tmp_path):
    from visiontf.tasks.classification.classification_synthetic import make_classification_dataset

    data = make_classification_dataset(tmp_path / "data", num_train=4 * STEPS_PER_EPOCH, num_val=3, num_classes=3,
                                       image_size=32)
    run(_fit_args(data, tmp_path / "full"))
    full = _load(tmp_path / "full" / "checkpoints" / "last.ckpt")
    assert full["global_step"] == STEPS_PER_EPOCH * EPOCHS

    env = subprocess_env(PYTHONPATH=f"{ROOT}:{ROOT / 'tests'}")
    killed = tmp_path / "killed"
    kill_args = [*_fit_args(data, killed), "--trainer.callbacks+=ddp_utils.KillAfterStep",
                 f"--trainer.callbacks.step={KILL_AFTER}"]
    proc = subprocess.run([sys.executable, *kill_args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == -9, f"expected SIGKILL, got {proc.returncode}\n{proc.stderr[-3000:]}"
    mid = _load(killed / "checkpoints" / "last.ckpt")
    assert mid["global_step"] == STEPS_PER_EPOCH, "last.ckpt should be the step-2 (end of epoch 0) checkpoint"
    assert "RNGStateCheckpoint" in str(list(mid["callbacks"]))

    run([*_fit_args(data, killed), "--ckpt_path=last"])
    resumed = _load(killed / "checkpoints" / "last.ckpt")
    assert resumed["global_step"] == full["global_step"]
    assert resumed["state_dict"].keys() == full["state_dict"].keys()
    differ = [k for k, v in full["state_dict"].items() if not torch.equal(v, resumed["state_dict"][k])]
    assert not differ, f"weights differ after resume: {differ[:5]}"
    for a, b in zip(full["optimizer_states"][0]["state"].values(), resumed["optimizer_states"][0]["state"].values()):
        assert all(torch.equal(a[k], b[k]) for k in a), "AdamW moments differ after resume"
    assert full["lr_schedulers"] == resumed["lr_schedulers"]


# ---- the seeding, per data module, with one worker ----------------------------------------------

def _classification_dm(tmp_path):
    from visiontf.tasks.classification.classification_data import ClassificationDataModule
    from visiontf.tasks.classification.classification_synthetic import make_classification_dataset

    root = make_classification_dataset(tmp_path / "cls", num_train=8, num_val=2, num_classes=2, image_size=32)
    return ClassificationDataModule(root, image_size=24, batch_size=4, num_workers=1)


def _coco_dm(tmp_path):
    from visiontf.tasks.detection.coco_data import CocoDataModule
    from visiontf.tasks.detection.detection_synthetic import make_detection_dataset

    paths = make_detection_dataset(tmp_path / "det", num_train=8, num_val=2, image_size=(64, 80))
    return CocoDataModule(paths["root"], batch_size=4, num_workers=1, scales=[48, 64], max_size=96,
                          crop_scales=[56], crop_size=(32, 48), val_size=64)


def _segmentation_dm(tmp_path):
    from visiontf.tasks.segmentation.segmentation_data import SegmentationDataModule
    from visiontf.tasks.segmentation.segmentation_synthetic import make_segmentation_dataset

    root = make_segmentation_dataset(tmp_path / "seg", num_train=8, num_val=2, num_classes=3, image_size=(48, 64))
    return SegmentationDataModule(root, crop_size=32, base_size=(96, 48), batch_size=4, num_workers=1)


def _epoch(loader, epoch: int) -> list[torch.Tensor]:
    loader.sampler.set_epoch(epoch)
    return [batch[0].clone() for batch in loader]


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(x.shape == y.shape and torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("make_dm", [_classification_dm, _coco_dm, _segmentation_dm])
def test_each_epoch_draws_its_own_augmentation_and_a_fresh_loader_replays_it(tmp_path, make_dm):
    """What makes a resumed run exact, for every data module with a (persistent) worker: epoch 1 after
    epoch 0 equals epoch 1 drawn first by a fresh loader (a resumed run), and differs from epoch 0."""
    from torch.utils.data import DataLoader, DistributedSampler

    dm = make_dm(tmp_path)
    dm.setup("fit")
    loader = dm.train_dataloader()
    assert loader.num_workers == 1 and loader.persistent_workers
    first, second = _epoch(loader, 0), _epoch(loader, 1)
    assert not _same(first, second), "two epochs drew the same augmentations"
    resumed = make_dm(tmp_path)
    resumed.setup("fit")
    assert _same(_epoch(resumed.train_dataloader(), 1), second), "a fresh loader did not replay epoch 1"

    # The former behaviour, plain indices (same order): the worker's pipeline RNG restarts with the
    # loader, so a fresh loader's epoch 1 draws what the uninterrupted run drew in epoch 0.
    def plain(module):
        ds = module.train_dataset
        sampler = DistributedSampler(ds, num_replicas=1, rank=0, shuffle=True, seed=0)
        return DataLoader(ds, batch_size=4, sampler=sampler, collate_fn=loader.collate_fn, drop_last=loader.drop_last,
                          num_workers=1, persistent_workers=True, generator=torch.Generator().manual_seed(0))

    old = plain(dm)
    old_second = (_epoch(old, 0), _epoch(old, 1))[1]
    assert not _same(_epoch(plain(resumed), 1), old_second), "plain indices replayed exactly; the control has no teeth"


# ---- extending a finished run whose validation epoch was moved ----------------------------------

def _extend_args(data: Path, out: Path, epochs: int, batches: Path) -> list[str]:
    return ["tools/train.py", "fit", "--config", "configs/vit/vit_tiny_synthetic.yaml",
            f"--data.init_args.root={data}", "--data.init_args.image_size=32", "--data.init_args.num_workers=0",
            "--data.init_args.batch_size=4",
            "--model.init_args.model_kwargs={img_size: 32, patch_size: 8, depth: 1, embed_dim: 48, num_heads: 3}",
            f"--trainer.max_epochs={epochs}", "--trainer.check_val_every_n_epoch=10", "--trainer.devices=1",
            "--trainer.num_sanity_val_steps=0", "--trainer.enable_progress_bar=false", "--trainer.logger=false",
            f"--trainer.default_root_dir={out}", "--trainer.callbacks+=batch_record.RecordBatches",
            f"--trainer.callbacks.path={batches}"]


def test_extending_a_finished_run_trains_the_batches_of_an_uninterrupted_run(tmp_path):
    """check_val_every_n_epoch=10 with max_epochs 2 validates at epoch 2 (ValidationSchedule moves it), and
    last.ckpt is written by that validation, inside epoch 2 for Lightning. Extended to 4 epochs, the
    schedule validates at epoch 4 only, and Lightning used to train one more batch in epoch 2 (its first
    batch again): every later step was shifted by one and the run ended a step later."""
    import json

    from visiontf.tasks.classification.classification_synthetic import make_classification_dataset

    data = make_classification_dataset(tmp_path / "data", num_train=8, num_val=2, num_classes=2, image_size=32)
    env = subprocess_env(PYTHONPATH=f"{ROOT}:{ROOT / 'tests'}")
    run(_extend_args(data, tmp_path / "full", 4, tmp_path / "full.jsonl"), env=env)
    run(_extend_args(data, tmp_path / "ext", 2, tmp_path / "ext.jsonl"), env=env)
    assert _load(tmp_path / "ext" / "checkpoints" / "last.ckpt")["global_step"] == 4
    proc = run([*_extend_args(data, tmp_path / "ext", 4, tmp_path / "ext.jsonl"), "--ckpt_path=last"], env=env)

    def batches(name: str) -> list[tuple[int, int, str]]:
        lines = (tmp_path / name).read_text().splitlines()
        return [(r["epoch"], r["step"], r["digest"]) for r in map(json.loads, lines)]

    full, extended = batches("full.jsonl"), batches("ext.jsonl")
    assert len(full) == 8 and len({d for _, _, d in full}) == 8
    assert extended == full, "the extended run trained other batches than an uninterrupted 4-epoch run"
    assert "resumed after the validation that ended epoch 2" in proc.stderr
    # the weights themselves differ from the uninterrupted run's: the LR schedule of the first 2 epochs was
    # planned for 2 epochs, not 4; the batches and the step count are what the resume must keep
    assert _load(tmp_path / "ext" / "checkpoints" / "last.ckpt")["global_step"] == 8
