"""The convergence harness (scripts/experiments/convergence.py), its time logging (ElapsedTime) and its plot."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import lightning as L
import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository (scripts/ is not a package)
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts" / "experiments"))
import convergence  # noqa: E402

from visiontf.callbacks import ElapsedTime  # noqa: E402
from visiontf.evaluation.convergence import main as plot_main  # noqa: E402
from visiontf.evaluation.convergence import plot_convergence, read_curve  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


# -- ElapsedTime -------------------------------------------------------------------------------------
class FakeClock:
    """Training batches take 1 s and validation batches 10 s of fake time."""

    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class Timed(L.LightningModule):
    def __init__(self, clock: FakeClock) -> None:
        super().__init__()
        self.clock = clock
        self.layer = nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        self.clock.t += 1.0
        return F.mse_loss(self.layer(batch[0]), batch[1])

    def validation_step(self, batch, batch_idx):
        self.clock.t += 10.0
        self.log("val_loss", F.mse_loss(self.layer(batch[0]), batch[1]))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _fit_timed(root: Path, max_epochs: int, ckpt_path: str | None = None) -> Path:
    clock = FakeClock()
    timer = ElapsedTime()
    timer._now = clock
    data = DataLoader(TensorDataset(torch.randn(8, 2), torch.randn(8, 1)), batch_size=2)  # 4 steps per epoch
    ckpt = ModelCheckpoint(dirpath=root / "ckpt", save_last=True, monitor=None)
    trainer = L.Trainer(default_root_dir=root, max_epochs=max_epochs, logger=CSVLogger(root, name="csv"),
                        callbacks=[timer, ckpt], limit_val_batches=1, num_sanity_val_steps=1,
                        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu")
    trainer.fit(Timed(clock), data, data, ckpt_path=ckpt_path)
    return root


def test_elapsed_time_is_logged_with_each_validation_and_survives_resume(tmp_path):
    _fit_timed(tmp_path / "a", max_epochs=2)
    df = pd.concat(pd.read_csv(p) for p in sorted((tmp_path / "a" / "csv").rglob("metrics.csv")))
    rows = df.dropna(subset=["val_loss"])
    # 4 training seconds per epoch, 10 per validation; the sanity check (10 s before fit) is not counted
    assert rows["time/elapsed_min"].tolist() == pytest.approx([4 / 60, 18 / 60])
    assert rows["time/train_min"].tolist() == pytest.approx([4 / 60, 8 / 60])

    # resumed from the end of epoch 1: the clocks continue from the checkpoint (28 s, 20 s of it validation)
    _fit_timed(tmp_path / "b", max_epochs=3, ckpt_path=str(tmp_path / "a" / "ckpt" / "last.ckpt"))
    df = pd.concat(pd.read_csv(p) for p in sorted((tmp_path / "b" / "csv").rglob("metrics.csv")))
    rows = df.dropna(subset=["val_loss"])
    assert rows["time/elapsed_min"].tolist() == pytest.approx([(28 + 4) / 60])
    assert rows["time/train_min"].tolist() == pytest.approx([12 / 60])


# -- the plot ----------------------------------------------------------------------------------------
def _fake_run(path: Path, minutes: list[float], maps: list[float]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    rows = []
    for i, (m, v) in enumerate(zip(minutes, maps)):
        rows.append({"epoch": i, "step": 10 * i + 9, "train/loss": 3.0 - i * 0.1})  # a training row: no time, no mAP
        rows.append({"epoch": i, "step": 10 * i + 9, "time/elapsed_min": m, "val/map": v})
    pd.DataFrame(rows).to_csv(path / "metrics.csv", index=False)
    return path / "metrics.csv"


def test_plot_map_against_minutes(tmp_path):
    for seed, shift in ((1, 0.0), (2, 0.03)):
        _fake_run(tmp_path / "runs" / "detr" / f"seed{seed}" / "csv" / "version_0", [1, 2, 4, 8],
                  [0.02 + shift, 0.05, 0.08, 0.1])
        _fake_run(tmp_path / "runs" / "deform" / f"seed{seed}" / "csv" / "version_0", [1, 2, 4, 8],
                  [0.1 + shift, 0.3, 0.45, 0.55])
    curve = read_curve(next((tmp_path / "runs" / "detr").rglob("metrics.csv")))
    assert curve["minutes"].tolist() == [1, 2, 4, 8] and len(curve) == 4  # training rows dropped
    out = tmp_path / "conv.png"
    assert plot_main([f"detr_tiny={tmp_path / 'runs' / 'detr'}", f"deformable={tmp_path / 'runs' / 'deform'}",
                      "--output", str(out)]) == 0
    img = np.asarray(Image.open(out).convert("RGB"))
    assert img.shape[0] > 300 and img.shape[1] > 500 and img.std() > 10
    # the two groups are drawn in matplotlib's first two colours
    for colour in ((31, 119, 180), (255, 127, 14)):
        assert (np.abs(img.astype(int) - colour).sum(-1) < 40).sum() > 50, colour


def test_plot_names_the_missing_time_column(tmp_path):
    csv = tmp_path / "metrics.csv"
    pd.DataFrame([{"epoch": 0, "step": 1, "val/map": 0.1}]).to_csv(csv, index=False)
    with pytest.raises(ValueError, match="ElapsedTime"):
        plot_convergence([("x", csv)], tmp_path / "x.png")


# -- the harness -------------------------------------------------------------------------------------
def test_tables_and_summary():
    runs = [{"variant": "a", "seed": s, "map": m, "map_50": m + 0.2, "steps": 100, "epoch": 4,
             "elapsed_min": 7.9, "time_limit_hit": s == 2} for s, m in ((1, 0.30), (2, 0.20))]
    report = {"config": "c.yaml", "preset": "shapes", "num_train": 1500, "num_val": 150, "max_time": "00:00:08:00",
              "variants": {"a": {"runs": runs, "summary": convergence.summarise(runs)}}}
    s = report["variants"]["a"]["summary"]
    assert s["mean_map"] == pytest.approx(0.25) and s["min_map"] == pytest.approx(0.20)
    assert s["min_map_50"] == pytest.approx(0.40) and s["seeds"] == 2
    table = convergence.markdown(report)
    assert "| a | 1 | 0.300 | 0.500 | 100 | 5 | 7.9 | no |" in table
    assert "| a | 2 | 0.250 | 0.200 | 0.450 | 0.400 | 100 |" in table


def test_variants_parse():
    vs = convergence.parse_variants("x", ["plain=", "ema=--trainer.callbacks+=visiontf.callbacks.ModelEMA "
                                                     "--trainer.callbacks.init_args.decay=0.99"], [])
    assert [v.name for v in vs] == ["plain", "ema"]
    assert vs[1].overrides == ["--trainer.callbacks+=visiontf.callbacks.ModelEMA", "--trainer.callbacks.init_args.decay=0.99"]
    assert convergence.parse_variants("x", [], ["--a=1"])[0].overrides == ["--a=1"]
    with pytest.raises(SystemExit):
        convergence.parse_variants("x", ["a=1", "a=2"], [])


TINY_DETR = ["--trainer.max_epochs=1", "--data.init_args.batch_size=4", "--data.init_args.num_workers=0",
             "--data.init_args.scales=[64]", "--data.init_args.max_size=96", "--data.init_args.crop_scales=[48]",
             "--data.init_args.crop_size=[32, 64]", "--data.init_args.val_size=64",
             "--model.init_args.model_kwargs={arch: {hidden_dim: 32, nheads: 2, enc_layers: 1, dec_layers: 1, "
             "dim_feedforward: 64, num_queries: 10}, backbone: {frozen_bn: false, freeze_stem: false}}",
             "--model.init_args.eval_backend=pycocotools",
             "--trainer.callbacks+=visiontf.callbacks.ModelEMA", "--trainer.callbacks.init_args.decay=0.9",
             "--trainer.callbacks.init_args.warmup_steps=2"]


@pytest.mark.slow
def test_harness_end_to_end_on_detr_tiny(tmp_path):
    """Data -> tools/train.py fit -> tools/eval.py -> table, JSON and PNG, on 16 images for 1 epoch (with EMA)."""
    work = tmp_path / "conv"
    assert convergence.main(["--config", "configs/detr/detr_tiny_shapes.yaml", "--seeds", "5", "--num-train", "16",
                             "--num-val", "4", "--max-time", "00:00:05:00", "--work", str(work), "--name", "tiny",
                             "--", *TINY_DETR]) == 0
    report = json.loads((work / "tiny.json").read_text())
    run = report["variants"]["tiny"]["runs"][0]
    assert run["seed"] == 5 and run["steps"] == 4 and run["epoch"] == 0 and run["time_limit_hit"] is False
    assert 0.0 <= run["map"] <= 1.0 and 0.0 <= run["map_50"] <= 1.0 and 0 < run["elapsed_min"] < 5
    assert "--trainer.max_time=00:00:05:00" in run["train_command"]
    assert (work / "data" / "shapes-seed5-16x4" / "annotations" / "instances_train2017.json").is_file()
    assert "| tiny | 5 |" in (work / "tiny.md").read_text()
    assert Image.open(work / "tiny.png").size[0] > 500

    # the evaluated checkpoint carries the EMA in state_dict and the raw weights beside it;
    # Predictor.from_checkpoint / export read state_dict, so they get the EMA
    from visiontf.inference.predictor import load_checkpoint_model

    ckpt = torch.load(Path(run["run_dir"]) / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    key = "model.class_embed.weight"
    assert not torch.equal(ckpt["state_dict"][key], ckpt["current_model_state"][key])
    model, _ = load_checkpoint_model(Path(run["run_dir"]) / "checkpoints" / "last.ckpt")
    assert torch.equal(model.state_dict()["class_embed.weight"], ckpt["state_dict"][key])

    # a second call reuses the finished run (a sweep can be resumed)
    stamp = (Path(run["run_dir"]) / "result.json").stat().st_mtime
    convergence.main(["--config", "configs/detr/detr_tiny_shapes.yaml", "--seeds", "5", "--num-train", "16",
                      "--num-val", "4", "--work", str(work), "--name", "tiny", "--no-plot", "--", *TINY_DETR])
    assert (Path(run["run_dir"]) / "result.json").stat().st_mtime == stamp
