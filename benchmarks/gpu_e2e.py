"""Section (f) of the GPU benchmark: ``tools/train.py fit`` of the DINO-4scale config end to end, and its data wait.

A synthetic COCO-layout set of real JPEG files (``tools/make_synthetic.py``'s shapes at COCO's
480x640 image size) is written first; then, for each worker count, one ``tools/train.py fit`` process
runs ``configs/deformable_detr/dino_r50_4scale_coco.yaml`` as a user would on one GPU (its DETR
multi-scale augmentation, 480-800 short side up to 1333, crops; batch 2; ``bf16-mixed``; random
backbone weights: nothing can be downloaded there) for a number of steps, no validation and no
checkpoint. :class:`visiontf.callbacks.DataWaitTimer` measures images/s and the share of the time
the loop waits for the next batch (the accelerator finished: the GPU idles), warm-up steps left out.
The smallest worker count whose wait share stays under 5 % is the one that saturates the GPU.

``tiny``: ``dino_tiny`` on 160x120 images scaled to 96-128 px, a few steps, on the CPU.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.gpu_common import Budget, gpu_row

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "deformable_detr" / "dino_r50_4scale_coco.yaml"
TINY_DATA = ["--data.init_args.scales", "[96, 128]", "--data.init_args.max_size", "160", "--data.init_args.crop_scales", "[96, 128]",
             "--data.init_args.crop_size", "[64, 96]"]


def _fit(root: Path, workers: int, steps: int, device: torch.device, tiny: bool, out: Path) -> dict:
    cmd = [
        sys.executable, str(REPO / "tools" / "train.py"), "fit", "--config", str(CONFIG),
        "--data.init_args.root", str(root), "--data.init_args.num_workers", str(workers),
        "--trainer.accelerator", "gpu" if device.type == "cuda" else "cpu", "--trainer.devices", "1", "--trainer.strategy", "auto",
        "--trainer.precision", "bf16-mixed" if device.type == "cuda" else "32-true",
        "--trainer.max_steps", str(steps), "--trainer.limit_val_batches", "0", "--trainer.num_sanity_val_steps", "0",
        "--trainer.logger", "false", "--trainer.enable_progress_bar", "false", "--trainer.default_root_dir", str(out.parent / "run"),
        "--checkpoint.save_last", "false", "--checkpoint.save_top_k", "0",
        "--model.init_args.model_kwargs", "{backbone_pretrained: false}",
        "--trainer.callbacks+=visiontf.callbacks.DataWaitTimer", "--trainer.callbacks.init_args.skip", str(min(10, steps // 4)),
        "--trainer.callbacks.init_args.out", str(out),
    ]
    if tiny:
        cmd += ["--model.init_args.model_name", "dino_tiny"] + TINY_DATA
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    t0 = time.monotonic()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0 or not out.is_file():
        raise RuntimeError(f"tools/train.py fit failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return {**json.loads(out.read_text()), "process_s": time.monotonic() - t0}


def run(device: torch.device, tiny: bool, budget: Budget, plan: list[tuple[int, int]]) -> list[dict]:
    """``plan``: (workers, steps) of each run, the most informative first."""
    from visiontf.tasks.detection.detection_synthetic import make_detection_dataset

    if not budget.allows("end-to-end DINO-4scale fit (f)", 30 if tiny else 90):
        return []
    rows = []
    work = Path(tempfile.mkdtemp(prefix="visiontf_e2e_"))
    try:
        t0 = time.monotonic()
        # 200 different images: each epoch decodes and augments them anew, as it would other images
        make_detection_dataset(work / "set", num_train=8 if tiny else 200, num_val=2, image_size=(120, 160) if tiny else (480, 640))
        made_s = time.monotonic() - t0
        for workers, steps in plan:
            label = f"dino_r50_4scale fit, {workers} loader workers, {steps} steps"
            if not budget.allows(label, 30 if tiny else 25 + 0.3 * steps):
                continue
            s = _fit(work / "set", workers, steps, device, tiny, work / f"wait_{workers}.json")
            rows.append(gpu_row("f", label, "", s["images_per_s"], None, None, unit="images/s",
                                notes=f"GPU waits on data {100 * s['wait_share']:.1f}% of the time (median wait "
                                      f"{1000 * s['wait_s_median']:.1f} ms, median step {1000 * s['step_s_median']:.1f} ms, "
                                      f"{s['steps']} steps timed; process {s['process_s']:.0f} s; set written in {made_s:.0f} s)"))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return rows
