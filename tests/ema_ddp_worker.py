"""Run by tests/callbacks/test_ema.py: a 2-process CPU DDP fit with two EMAs; each rank saves what it holds.

    python tests/ema_ddp_worker.py OUT_DIR

Lightning's DDP launcher re-runs this script for rank 1. ``synced`` is :class:`ModelEMA` as
shipped; ``unsynced`` has its buffer broadcast switched off, the control showing that BatchNorm
statistics do diverge across ranks without it. No validation and no checkpoints, so the two
callbacks never swap weights or write state_dicts over each other.
"""
from __future__ import annotations

import sys
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from visiontf.callbacks import ModelEMA


class BatchNormRegression(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=0.05)


class UnsyncedEMA(ModelEMA):
    def _broadcast_buffers(self, trainer) -> None:
        pass


def main(out: Path) -> None:
    L.seed_everything(0, verbose=False)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 4, generator=g) * torch.linspace(0.5, 3, 32)[:, None]  # ranks see different scales
    y = x.sum(1, keepdim=True)
    synced, unsynced = ModelEMA(decay=0.9, warmup_steps=2), UnsyncedEMA(decay=0.9, warmup_steps=2)
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=2, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[synced, unsynced])
    trainer.fit(BatchNormRegression(), DataLoader(TensorDataset(x, y), batch_size=4, shuffle=False))
    state = {name: {k: v.clone() for k, v in cb._average_model.module.state_dict().items()}
             for name, cb in (("synced", synced), ("unsynced", unsynced))}
    state["updates"] = synced.num_updates
    out.mkdir(parents=True, exist_ok=True)
    torch.save(state, out / f"rank{trainer.global_rank}.pt")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
