"""Exact resume after a hard kill: the resumed run ends with bitwise the weights of an uninterrupted run.

What it takes (checked here with the tiny ViT, mixup on so NumPy's RNG matters):

* Lightning restores model, optimizer, LR scheduler and loop counters from ``last.ckpt``.
* ``visiontf.callbacks.RNGStateCheckpoint`` (a default callback of ``tools/train.py``) restores the
  global python/NumPy/torch RNGs, which Lightning does not (``seed_everything`` would restart
  them): mixup's lambda comes from NumPy.
* Shuffling must be a function of (seed, epoch): the data modules use an epoch-seeded sampler on one
  process (``visiontf.data.samplers.train_sampler``) and Lightning's ``DistributedSampler`` under
  DDP; both get ``set_epoch``. A plain ``shuffle=True`` loader with a generator seeded once would
  repeat epoch 0's order after a resume.
* The checkpoint is at an epoch boundary. A plain DataLoader is not resumable mid-epoch: Lightning
  restarts the epoch from its first batch while counting from the saved step (it warns), so a
  mid-epoch resume replays batches and cannot be exact.
* Without the RNG callback this test fails (measured: the weights differ, mixup draws other lambdas).
* Augmentation is deterministic here (full-image crop, no flip or jitter): albumentations'
  ``Compose(seed=...)`` RNG is rebuilt with the dataset, so it also restarts on resume.
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
            f"--data.init_args.root={data}", "--data.init_args.image_size=32", "--data.init_args.num_workers=0",
            "--data.init_args.batch_size=4", "--data.init_args.scale=[1.0, 1.0]", "--data.init_args.hflip=0",
            "--data.init_args.color_jitter=0",
            "--model.init_args.model_kwargs={img_size: 32, patch_size: 8, depth: 1, embed_dim: 48, num_heads: 3}",
            "--model.init_args.mixup_alpha=0.8", "--model.init_args.warmup_epochs=1",
            f"--trainer.max_epochs={EPOCHS}", "--trainer.devices=1",
            "--trainer.num_sanity_val_steps=0", "--trainer.enable_progress_bar=false",
            "--checkpoint.monitor=null", "--checkpoint.every_n_train_steps=2", f"--trainer.default_root_dir={out}"]


def _load(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def test_resume_after_sigkill_is_bitwise_exact(tmp_path):
    from visiontf.data.synthetic.classification import make_classification_dataset

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
