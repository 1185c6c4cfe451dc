"""Run by tests/callbacks/test_budget_schedule.py: a 2-process CPU DDP fit under BudgetCosine and a time budget,
where the two ranks' clocks disagree; each rank saves the learning rates it stepped with and where it stopped.

    python tests/budget_ddp_worker.py OUT_DIR

Lightning's DDP launcher re-runs this script for rank 1. Each rank's clock is a fake that advances a fixed time a
step: 10 s on rank 0 and 12 s on rank 1, so by their own clocks rank 1 would finish annealing (90 s of 100 at
``time_fraction`` 0.9) after 8 steps and rank 0 after 9.
"""
from __future__ import annotations

import sys
from pathlib import Path

import lightning as L
import lightning.pytorch.callbacks.timer as timer_module
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from visiontf.callbacks import BudgetCosine


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.tick = 10.0

    def monotonic(self) -> float:
        return self.now


CLOCK = _Clock()


class Regression(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(4, 1)
        self.lrs: list[float] = []

    def training_step(self, batch, batch_idx):
        self.lrs.append(self.trainer.optimizers[0].param_groups[0]["lr"])
        CLOCK.now += CLOCK.tick  # the step's time, read at its end
        x, y = batch
        return F.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main(out: Path) -> None:
    timer_module.time = CLOCK
    L.seed_everything(0, verbose=False)
    x = torch.randn(160, 4, generator=torch.Generator().manual_seed(0))
    model = Regression()
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=50, max_time={"seconds": 100},
                        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[BudgetCosine(time_fraction=0.9)])
    CLOCK.tick = 10.0 if trainer.global_rank == 0 else 12.0
    trainer.fit(model, DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4))
    out.mkdir(parents=True, exist_ok=True)
    torch.save({"global_step": trainer.global_step, "lrs": model.lrs, "weight": model.net.weight.detach().clone()},
               out / f"rank{trainer.global_rank}.pt")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
