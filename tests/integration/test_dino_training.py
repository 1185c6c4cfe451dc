"""The CPU recipe (configs/deformable_detr/deformable_detr_tiny_shapes.yaml) at toy size: a 2-process DDP
fit with every training option and the EMA (no unused parameters, ranks in step, EMA checkpointed),
and an exact resume of the EMA and the budget schedule. Cost: about 40 s (subprocesses)."""
from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch
from ddp_utils import ddp_args, run

pytestmark = pytest.mark.slow

CONFIG = "configs/deformable_detr/deformable_detr_tiny_shapes.yaml"
TOY_MODEL = ("--model.init_args.model_kwargs={arch: {hidden_dim: 32, nheads: 2, enc_layers: 1, dec_layers: 2, "
             "dim_feedforward: 32, num_queries: 12}, dino: {num_denoising: 6, num_query_groups: 2, "
             "distinct_query_iou: 0.8, distinct_between_layers: true}}")


def _overrides(root: Path, out: Path) -> list[str]:
    return [f"--data.init_args.root={root}", "--data.init_args.num_workers=0", "--data.init_args.batch_size=2",
            "--data.init_args.scales=[64]", "--data.init_args.max_size=96", "--data.init_args.crop_scales=[64]",
            "--data.init_args.val_size=64", TOY_MODEL, "--trainer.num_sanity_val_steps=0",
            # the recipe trains with 2 DDP processes; in-process fits here run one (the DDP test sets its own)
            "--trainer.devices=1", "--trainer.strategy=auto",
            "--trainer.enable_progress_bar=false", "--trainer.limit_val_batches=1", f"--trainer.default_root_dir={out}"]


@pytest.fixture(scope="module")
def toy_set(tmp_path_factory) -> Path:
    from visiontf.tasks.detection.detection_synthetic import make_detection_dataset

    root = tmp_path_factory.mktemp("dino") / "data"
    make_detection_dataset(root, num_train=8, num_val=2, image_size=(64, 80), num_classes=3)
    return root


def _load(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def test_recipe_fits_with_ddp(toy_set, tmp_path):
    """Denoising, mixed selection, groups and the EMA under 2-process DDP: no unused-parameter error, one EMA."""
    proc = run(["tools/train.py", "fit", "--config", CONFIG, *_overrides(toy_set, tmp_path), *ddp_args(), "--trainer.max_epochs=1"])
    # the COCO stats are the same on every rank (computed from all ranks' detections): no advice to sync them
    assert "It is recommended to use `self.log(" not in proc.stderr + proc.stdout
    state = _load(tmp_path / "checkpoints" / "last.ckpt")
    assert state["global_step"] == 2  # 8 images, 2 per rank and step
    ema = next(v for k, v in state["callbacks"].items() if "ModelEMA" in k)
    assert ema and "current_model_state" in state  # the state_dict is the EMA, the raw weights beside it


class StopAfterFirstEpoch(L.Callback):
    def on_train_epoch_end(self, trainer, pl_module) -> None:
        trainer.should_stop = True


def test_recipe_resumes_exactly(toy_set, tmp_path):
    """Stopped after epoch 0 and resumed from last.ckpt: weights, EMA and optimizer as an uninterrupted run."""
    from visiontf.cli.train import make_cli

    def fit(out: Path, *extra: str):
        L.seed_everything(0)
        make_cli(["fit", "--config", CONFIG, *_overrides(toy_set, out), "--trainer.max_epochs=2", "--checkpoint.monitor=null",
                  "--trainer.logger=false", *extra])

    fit(tmp_path / "full")
    fit(tmp_path / "part", "--trainer.callbacks+=test_dino_training.StopAfterFirstEpoch")
    assert _load(tmp_path / "part" / "checkpoints" / "last.ckpt")["global_step"] == 4
    fit(tmp_path / "part", "--ckpt_path=last")
    full, resumed = _load(tmp_path / "full" / "checkpoints" / "last.ckpt"), _load(tmp_path / "part" / "checkpoints" / "last.ckpt")
    assert full["global_step"] == resumed["global_step"] == 8
    for key in ("state_dict", "current_model_state"):  # the EMA and the raw weights
        differ = [k for k, v in full[key].items() if not torch.equal(v, resumed[key][k])]
        assert not differ, f"{key} differs after resume: {differ[:5]}"
    for a, b in zip(full["optimizer_states"][0]["state"].values(), resumed["optimizer_states"][0]["state"].values()):
        assert all(torch.equal(a[k], b[k]) for k in a), "AdamW moments differ after resume"
