"""BudgetCosine: the lr anneals over the step budget or the time budget, whichever ends first, and a
time budget stops training after its annealing with a validated, checkpointed final state. Cost: ~3 s."""
from __future__ import annotations

import math

import lightning as L
import lightning.pytorch.callbacks.timer as timer_module
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from visiontf.callbacks import BudgetCosine

BASE_LR = 0.1


class Regression(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(2, 1)
        self.lrs: list[float] = []
        self.validated_at: list[int] = []

    def training_step(self, batch, batch_idx):
        self.lrs.append(self.trainer.optimizers[0].param_groups[0]["lr"])
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        if batch_idx == 0:
            self.validated_at.append(self.global_step)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=BASE_LR)


def _loader(n: int = 40) -> DataLoader:
    x = torch.randn(n, 2, generator=torch.Generator().manual_seed(0))
    return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)


def _cosine(p: float) -> float:
    return 0.5 * (1 + math.cos(math.pi * min(p, 1.0)))


def _trainer(tmp_path, callbacks, **kw) -> L.Trainer:
    return L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
                     default_root_dir=tmp_path, callbacks=callbacks, **kw)


def test_anneals_over_the_step_budget_without_a_time_limit(tmp_path):
    model = Regression()
    _trainer(tmp_path, [BudgetCosine()], max_epochs=2, enable_checkpointing=False, limit_val_batches=0).fit(model, _loader())
    total = 2 * 10
    assert len(model.lrs) == total
    for step, lr in enumerate(model.lrs):
        assert lr == pytest.approx(BASE_LR * _cosine(step / total), abs=1e-12)


def test_a_flat_share_holds_the_lr_then_anneals_over_the_rest(tmp_path):
    model = Regression()
    _trainer(tmp_path, [BudgetCosine(flat_fraction=0.5)], max_epochs=2, enable_checkpointing=False,
             limit_val_batches=0).fit(model, _loader())
    total = 2 * 10
    assert model.lrs[:11] == [BASE_LR] * 11  # progress 0 .. 0.5
    for step, lr in enumerate(model.lrs):
        assert lr == pytest.approx(BASE_LR * _cosine(max(0.0, step / total - 0.5) / 0.5), abs=1e-12)
    assert model.lrs[-1] < BASE_LR * 0.03


class _Clock:
    """Stands in for the Timer's ``time`` module: 10 s pass at every training batch."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


class _Tick(L.Callback):
    def __init__(self, clock: _Clock) -> None:
        self.clock = clock

    def on_train_batch_end(self, *args, **kwargs) -> None:
        self.clock.now += 10.0


def test_a_time_budget_anneals_and_stops_early_with_a_final_checkpoint(tmp_path, monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(timer_module, "time", clock)
    model = Regression()
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
    # 100 s budget, annealed over 90 s: the lr reaches 0 at the 9th step and training stops there,
    # mid-epoch (10 batches per epoch), far before max_epochs
    trainer = _trainer(tmp_path, [_Tick(clock), BudgetCosine(time_fraction=0.9), ckpt], max_epochs=50,
                       max_time={"seconds": 100}, limit_val_batches=1)
    trainer.fit(model, _loader(), _loader(8))
    assert trainer.global_step == 9 and len(model.lrs) == 9
    for step, lr in enumerate(model.lrs):
        assert lr == pytest.approx(BASE_LR * _cosine(step * 10 / 90), abs=1e-12)
    # the stop triggers a validation, whose checkpoint (last.ckpt) holds the final, annealed state
    assert model.validated_at[-1] == 9
    state = torch.load(tmp_path / "ckpt" / "last.ckpt", map_location="cpu", weights_only=True)
    assert state["global_step"] == 9
    torch.testing.assert_close(state["state_dict"]["net.weight"], model.net.weight.detach())


def test_the_task_scheduler_keeps_its_warmup(tmp_path):
    """The factor multiplies the scheduler's lr (here a linear warm-up) rather than replacing it."""

    class WarmedUp(Regression):
        def configure_optimizers(self):
            opt = torch.optim.SGD(self.parameters(), lr=BASE_LR)
            sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 5))
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    model = WarmedUp()
    _trainer(tmp_path, [BudgetCosine()], max_steps=12, enable_checkpointing=False, limit_val_batches=0).fit(model, _loader())
    for step, lr in enumerate(model.lrs):
        assert lr == pytest.approx(BASE_LR * min(1.0, (step + 1) / 5) * _cosine(step / 12), abs=1e-12)


def test_bad_arguments():
    with pytest.raises(ValueError, match="time_fraction"):
        BudgetCosine(time_fraction=0)
    with pytest.raises(ValueError, match="min_factor"):
        BudgetCosine(min_factor=2)
    with pytest.raises(ValueError, match="flat_fraction"):
        BudgetCosine(flat_fraction=1.0)


def test_ddp_ranks_stop_at_the_same_step_by_rank_zero_clock(tmp_path):
    """2 CPU processes (gloo) whose clocks disagree: both anneal and stop by rank 0's clock. Each rank once read its
    own, so one rank stopped a step early and the other waited in a collective it had left: the tuning runs of the
    CPU recipe died at their end with gloo's "Received data size doesn't match expected size"."""
    from ddp_utils import run

    run(["tests/budget_ddp_worker.py", str(tmp_path)], timeout=180)
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in (0, 1))
    assert r0["global_step"] == r1["global_step"] == 9  # rank 0's clock: 10 s a step, annealed at 90 s
    assert r0["lrs"] == r1["lrs"] and len(r0["lrs"]) == 9
    for step, lr in enumerate(r0["lrs"]):
        assert lr == pytest.approx(0.1 * _cosine(step * 10 / 90), abs=1e-12)
    torch.testing.assert_close(r0["weight"], r1["weight"], rtol=0, atol=0)
