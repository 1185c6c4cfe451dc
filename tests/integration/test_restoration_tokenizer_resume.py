"""The restoration (IPT) and tokenizer (VQGAN) recipes survive ``kill -9`` during a checkpoint write and
resume bitwise exactly, as detection and classification do (tests/integration/test_resume.py,
tests/callbacks/test_checkpoint_writes.py).

Each task at toy size through ``tools/train.py`` with one DataLoader worker and its recipe's random
crops: an uninterrupted 3-epoch run, then the same run killed (SIGKILL) the moment a checkpoint
write of the second epoch's end is under way (a temporary file ``.<name>.<hex>.tmp`` is beside a
complete ``last.ckpt``), then resumed with ``--ckpt_path last``. After the kill ``last.ckpt`` is
one complete state (the first or the second epoch's), never a partial file; at most one temporary
file is left, and the resumed run removes it. The resumed run ends with the uninterrupted run's
weights, optimiser moments and schedules, bit for bit.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from ddp_utils import ROOT, run, subprocess_env
from PIL import Image

from visiontf.io.weights import safe_torch_load

pytestmark = pytest.mark.slow

EPOCHS = 3
_TEMPORARY = re.compile(r"\..+\.ckpt\.[0-9a-f]{8}\.tmp")

IPT = ["--config", "configs/ipt/ipt_tiny_sr_x2.yaml", "--data.init_args.batch_size=2", "--data.init_args.repeat=2",
       "--data.init_args.val_crop=64", "--model.init_args.model_kwargs={scale: 2, n_feats: 4, num_layers: 1, num_heads: 2}",
       "--checkpoint.monitor=null"]
VQGAN = ["--config", "configs/vqgan/vqgan_tiny.yaml", "--data.init_args.crop_size=16", "--data.init_args.val_size=16",
         "--data.init_args.batch_size=2", "--data.init_args.repeat=1", "--data.init_args.cache=false",
         "--model.init_args.model_kwargs={ch: 32, ch_mult: [1, 2], num_res_blocks: 1, attn_resolutions: [], n_embed: 16, "
         "embed_dim: 4, z_channels: 32, resolution: 16, quantizer_kwargs: {kmeans_init: true, restart_dead_codes: true, "
         "dead_code_threshold: 0.03}}",
         "--model.init_args.disc_ndf=8", "--model.init_args.disc_layers=2", "--model.init_args.disc_start=1",  # the discriminator trains (its optimiser has moments) across the kill
         "--trainer.precision=32-true", "--trainer.check_val_every_n_epoch=1", "--trainer.callbacks=[]"]


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("photos")
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:100, 0:104]
    for split, n in (("train", 3), ("val", 1)):
        (root / split).mkdir()
        for i in range(n):
            img = np.stack([128 + 80 * np.sin(x / (4.0 + i) + c) * np.cos(y / 6.0) for c in range(3)], axis=2)
            img = np.clip(img + rng.normal(0, 5, img.shape), 0, 255).astype(np.uint8)
            Image.fromarray(img).save(root / split / f"p{i}.png")
    return root


def _args(task: str, photos: Path, out: Path) -> list[str]:
    data = ([f"--data.init_args.root={photos}"] if task == "restoration"
            else [f"--data.init_args.root={photos}/train", f"--data.init_args.val_root={photos}/val"])
    recipe = IPT if task == "restoration" else VQGAN
    return ["tools/train.py", "fit", *recipe, *data, "--data.init_args.num_workers=1", f"--trainer.max_epochs={EPOCHS}",
            "--trainer.num_sanity_val_steps=0", "--trainer.enable_progress_bar=false", "--trainer.logger=false",
            f"--trainer.default_root_dir={out}"]


def _kill_during_a_write(args: list[str], folder: Path, timeout: float = 900) -> bool:
    """Start ``args``; SIGKILL it as soon as a checkpoint's temporary file sits beside a complete ``last.ckpt``.
    True when killed during a write (False: the run ended first)."""
    env = subprocess_env(PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, *args], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + timeout
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            names = os.listdir(folder) if folder.is_dir() else []
            if "last.ckpt" in names and any(_TEMPORARY.fullmatch(n) for n in names):
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
                return True
            time.sleep(0.0005)
        proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        return False
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _assert_same_state(full: dict, resumed: dict) -> None:
    assert resumed["global_step"] == full["global_step"]
    assert resumed["state_dict"].keys() == full["state_dict"].keys()
    differ = [k for k, v in full["state_dict"].items() if not torch.equal(v, resumed["state_dict"][k])]
    assert not differ, f"weights differ after resume: {differ[:5]}"
    assert len(full["optimizer_states"]) == len(resumed["optimizer_states"])
    for a, b in zip(full["optimizer_states"], resumed["optimizer_states"]):
        assert a["state"].keys() == b["state"].keys() and a["state"]
        for k in a["state"]:
            assert all(torch.equal(a["state"][k][n], b["state"][k][n]) for n in a["state"][k]), "optimiser moments differ"
    assert [s["last_epoch"] for s in full["lr_schedulers"]] == [s["last_epoch"] for s in resumed["lr_schedulers"]]


@pytest.mark.parametrize("task", ["restoration", "tokenizer"])
def test_kill_during_a_checkpoint_write_then_resume_is_bitwise_exact(task, photos, tmp_path):
    run(_args(task, photos, tmp_path / "full"), timeout=900)  # a loaded shared machine: minutes
    full = safe_torch_load(tmp_path / "full" / "checkpoints" / "last.ckpt")
    # the tokenizer's global step counts both optimizers' steps (the discriminator's from disc_start): count epochs
    assert full["epoch"] == EPOCHS - 1 and full["global_step"] >= EPOCHS

    killed = tmp_path / "killed"
    folder = killed / "checkpoints"
    for _ in range(3):  # a write of a toy model lasts milliseconds: the watcher may miss it on a loaded machine
        if _kill_during_a_write(_args(task, photos, killed), folder):
            break
        for p in folder.iterdir():
            p.unlink()
    else:
        pytest.fail("never caught a checkpoint write under way in 3 runs")
    names = sorted(os.listdir(folder))
    temporaries = [n for n in names if _TEMPORARY.fullmatch(n)]
    assert len(temporaries) <= 1, names
    assert all(n.endswith(".ckpt") for n in names if n not in temporaries), names
    # every file under a checkpoint's name is complete (safe_torch_load checks every record), never a partial one
    states = {n: safe_torch_load(folder / n) for n in names if n not in temporaries}
    assert states["last.ckpt"]["epoch"] in (0, 1)  # written after the first or the second epoch, before the last

    run([*_args(task, photos, killed), "--ckpt_path=last"], timeout=900)
    assert not [n for n in os.listdir(folder) if _TEMPORARY.fullmatch(n)], "the killed write's temporary file is left"
    _assert_same_state(full, safe_torch_load(folder / "last.ckpt"))
