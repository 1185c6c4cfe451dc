"""Deterministic training: two fits of the CPU recipe's ``dino_tiny`` (at toy size) with ``deterministic: true``
give the same losses and weights bit for bit.

Each fit is its own process (``tools/train.py``), as two runs of a user are: nothing carries over from one
to the other but the command line (no allocator state, autotuner cache or hash seed in common). Lightning's
``Trainer(deterministic=True)`` calls ``torch.use_deterministic_algorithms(True)``; the deformable attention
then runs the gather core on the CPU (the Triton kernels' atomic-free backward on CUDA: their own tests are
``tests/nn/test_ms_deform_triton.py``); the CUDA case runs where a GPU is. 20 steps of batch 2 at 64x96 px
over 8 images, with the recipe's denoising, mixed query selection, distinct queries, EMA and gradient
clipping. Cost: about 40 s on 2 shared cores (two processes of about 20 s, most of it imports and start-up).
"""
from __future__ import annotations

import json
from pathlib import Path

import lightning as L
import pytest
import torch
from ddp_utils import ROOT, run, subprocess_env

pytestmark = pytest.mark.slow

CONFIG = "configs/deformable_detr/deformable_detr_tiny_shapes.yaml"
STEPS = 20
TOY = ("--model.init_args.model_kwargs={arch: {hidden_dim: 32, nheads: 2, enc_layers: 1, dec_layers: 2, dim_feedforward: 32, "
       "num_queries: 8}, dino: {num_denoising: 6, distinct_query_iou: 0.8, distinct_between_layers: true}}")


class RecordLosses(L.Callback):
    """Appends one JSON line per training step: the loss exactly (``float.hex``) and whether torch's
    deterministic algorithms were on."""

    def __init__(self, path: str) -> None:
        self.path = path

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        with open(self.path, "a") as f:
            f.write(json.dumps({"step": trainer.global_step, "loss": float(loss).hex(),
                                "deterministic": torch.are_deterministic_algorithms_enabled()}) + "\n")


def _fit(data: Path, out: Path, accelerator: str) -> tuple[list[dict], dict]:
    losses = out / "losses.jsonl"
    run(["tools/train.py", "fit", "--config", CONFIG, f"--trainer.accelerator={accelerator}", f"--data.init_args.root={data}", "--data.init_args.num_workers=0",
         "--data.init_args.batch_size=2", "--data.init_args.scales=[64]", "--data.init_args.max_size=96",
         "--data.init_args.crop_scales=[64]", "--data.init_args.val_size=64", TOY,
         "--precision_without_native_bf16=null", "--trainer.precision=32-true", "--trainer.deterministic=true",
         "--trainer.devices=1", "--trainer.strategy=auto", f"--trainer.max_steps={STEPS}", "--trainer.limit_val_batches=0",
         "--trainer.num_sanity_val_steps=0", "--trainer.enable_progress_bar=false", "--trainer.logger=false",
         "--checkpoint.monitor=null", f"--trainer.default_root_dir={out}",
         "--trainer.callbacks+=test_deterministic_training.RecordLosses", f"--trainer.callbacks.path={losses}"],
        env=subprocess_env(PYTHONPATH=f"{ROOT}:{ROOT / 'tests'}:{Path(__file__).parent}"))
    records = [json.loads(line) for line in losses.read_text().splitlines()]
    return records, torch.load(out / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)


@pytest.mark.parametrize("accelerator", ["cpu", pytest.param("gpu", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device: the CUDA fit (Triton's atomic-free backward) needs one"))])
def test_two_deterministic_fits_are_the_same_bit_for_bit(tmp_path, accelerator):
    """Losses of all 20 steps, the weights (raw and EMA) and AdamW's moments of two fits: the same bits."""
    from visiontf.tasks.detection.detection_synthetic import make_detection_dataset

    data = tmp_path / "data"
    make_detection_dataset(data, num_train=8, num_val=2, image_size=(64, 80), num_classes=3)
    (losses_a, ckpt_a), (losses_b, ckpt_b) = (_fit(data, tmp_path / run_name, accelerator) for run_name in "ab")
    assert len(losses_a) == STEPS and all(r["deterministic"] for r in losses_a), losses_a[:2]
    assert len({r["loss"] for r in losses_a}) > 1, "the loss never changed: nothing trained"
    assert [r["loss"] for r in losses_a] == [r["loss"] for r in losses_b], "the losses differ"
    assert ckpt_a["global_step"] == ckpt_b["global_step"] == STEPS
    for key in ("state_dict", "current_model_state"):  # the EMA, and the raw weights beside it
        assert ckpt_a[key].keys() == ckpt_b[key].keys()
        differ = [k for k, v in ckpt_a[key].items() if not torch.equal(v, ckpt_b[key][k])]
        assert not differ, f"{key} differs: {differ[:5]}"
    moments = zip(ckpt_a["optimizer_states"][0]["state"].values(), ckpt_b["optimizer_states"][0]["state"].values())
    assert all(torch.equal(a[k], b[k]) for a, b in moments for k in a), "AdamW moments differ"

