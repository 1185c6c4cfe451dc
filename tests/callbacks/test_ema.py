"""EMA of the weights (visiontf.callbacks.ModelEMA): the average, validation, checkpoints, resume, DDP."""
from __future__ import annotations

import math
from pathlib import Path

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from visiontf.callbacks import ModelEMA
from visiontf.callbacks.ema import ema_decay

BATCHES_PER_EPOCH = 4


class Tiny(L.LightningModule):
    """Linear + BatchNorm regression: parameters and buffers (float running stats, int counter)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 1))
        self.seen_in_validation: list[dict[str, torch.Tensor]] = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.mse_loss(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        if batch_idx == 0:
            self.seen_in_validation.append(_clone(self.state_dict()))
        x, y = batch
        self.log("val_loss", F.mse_loss(self.net(x), y))

    def test_step(self, batch, batch_idx):
        self.validation_step(batch, batch_idx)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=0.05)


def _clone(state: dict) -> dict:
    return {k: v.detach().clone() for k, v in state.items()}


def _loader() -> DataLoader:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4 * BATCHES_PER_EPOCH, 4, generator=g)
    y = x.sum(1, keepdim=True) + 0.1 * torch.randn(len(x), 1, generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=4, shuffle=False)


class RecordRaw(L.Callback):
    """After each step: the raw weights, and (listed after ModelEMA) the EMA it just updated."""

    def __init__(self, ema: ModelEMA) -> None:
        self.ema = ema
        self.raw: list[dict] = []
        self.averaged: list[dict] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.raw.append(_clone(pl_module.state_dict()))
        self.averaged.append(_clone(self.ema._average_model.module.state_dict()))


def _trainer(tmp: Path, callbacks: list, max_epochs: int = 1, **kw) -> L.Trainer:
    kw.setdefault("enable_checkpointing", False)
    kw.setdefault("limit_val_batches", 0)
    return L.Trainer(default_root_dir=tmp, accelerator="cpu", devices=1, max_epochs=max_epochs, logger=False,
                     enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks, **kw)


def _direct_ema(raw: list[dict], decay: float, warmup: int) -> dict:
    """EMA written out: e_1 = w_1, e_u = d_u e_{u-1} + (1 - d_u) w_u, in float64; int buffers follow w."""
    ema = {k: v.double() if v.is_floating_point() else v.clone() for k, v in raw[0].items()}
    for u, state in enumerate(raw[1:], start=2):
        d = decay * (1 - math.exp(-u / warmup))
        for k, v in state.items():
            ema[k] = d * ema[k] + (1 - d) * v.double() if v.is_floating_point() else v.clone()
    return ema


def test_decay_ramp():
    assert ema_decay(1, 0.9999, 2000) == pytest.approx(0.9999 * (1 - math.exp(-1 / 2000)))
    assert ema_decay(60000, 0.9999, 2000) == pytest.approx(0.9999, abs=1e-9)
    assert ema_decay(5, 0.993, 0) == 0.993
    with pytest.raises(ValueError, match="decay"):
        ModelEMA(decay=1.5)


def test_ema_equals_the_direct_computation(tmp_path):
    torch.manual_seed(0)
    ema = ModelEMA(decay=0.9, warmup_steps=3)
    rec = RecordRaw(ema)
    model = Tiny()
    _trainer(tmp_path, [ema, rec], max_epochs=2).fit(model, _loader())
    assert len(rec.raw) == 2 * BATCHES_PER_EPOCH and ema.num_updates == 2 * BATCHES_PER_EPOCH
    expected = _direct_ema(rec.raw, 0.9, 3)
    got = ema._average_model.module.state_dict()
    for k, v in expected.items():
        if v.is_floating_point():
            assert torch.allclose(got[k].double(), v, atol=1e-6), k
        else:
            assert torch.equal(got[k], v), k  # num_batches_tracked is copied, not averaged
    # the average moved away from the last raw weights (the test would pass for a plain copy otherwise)
    assert not torch.allclose(got["net.0.weight"], rec.raw[-1]["net.0.weight"], atol=1e-4)
    # training ends with the EMA in the model
    assert all(torch.equal(model.state_dict()[k], got[k]) for k in got)


def test_validation_sees_the_ema_and_training_continues_from_the_raw_weights(tmp_path):
    torch.manual_seed(0)
    ema = ModelEMA(decay=0.8, warmup_steps=0)
    rec = RecordRaw(ema)
    model = Tiny()

    class AfterValidation(L.Callback):
        def __init__(self) -> None:
            self.restored: list[bool] = []

        def on_validation_end(self, trainer, pl_module):
            if not trainer.sanity_checking:
                self.restored.append(all(torch.equal(pl_module.state_dict()[k], v) for k, v in rec.raw[-1].items()))

    after = AfterValidation()
    trainer = _trainer(tmp_path, [ema, rec, after], max_epochs=2, limit_val_batches=1, num_sanity_val_steps=0)
    trainer.fit(model, _loader(), _loader())
    assert len(model.seen_in_validation) == 2
    for epoch, seen in enumerate(model.seen_in_validation):
        step = (epoch + 1) * BATCHES_PER_EPOCH - 1
        assert all(torch.equal(seen[k], rec.averaged[step][k]) for k in seen), f"epoch {epoch}: not the EMA"
        assert not torch.equal(seen["net.0.weight"], rec.raw[step]["net.0.weight"])
    assert after.restored == [True, True], "the raw weights must be back after validation"


def _fit_with_checkpoints(root: Path, ckpt_path: str | None = None, max_epochs: int = 3):
    torch.manual_seed(0)
    ema = ModelEMA(decay=0.9, warmup_steps=2)
    ckpt = ModelCheckpoint(dirpath=root / "ckpt", filename="e{epoch}", auto_insert_metric_name=False, save_top_k=-1,
                           every_n_epochs=1, save_last=True)
    model = Tiny()
    trainer = _trainer(root, [ema, ckpt], max_epochs=max_epochs, enable_checkpointing=True, limit_val_batches=1,
                       num_sanity_val_steps=0)
    trainer.fit(model, _loader(), _loader(), ckpt_path=ckpt_path)
    return trainer, model, ema


def _load(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def test_checkpoint_holds_the_ema_and_the_raw_weights(tmp_path):
    _, _, ema = _fit_with_checkpoints(tmp_path, max_epochs=1)
    ck = _load(tmp_path / "ckpt" / "last.ckpt")
    averaged = ema._average_model.module.state_dict()
    assert set(ck["state_dict"]) == set(averaged)
    assert all(torch.equal(ck["state_dict"][k], averaged[k]) for k in averaged)
    assert int(ck["averaging_state"]["n_averaged"]) == BATCHES_PER_EPOCH
    assert set(ck["current_model_state"]) == set(averaged)
    assert not torch.equal(ck["current_model_state"]["net.0.weight"], ck["state_dict"]["net.0.weight"])


def test_resume_is_bitwise_exact(tmp_path):
    """3 epochs straight vs 1 epoch, then resumed from its checkpoint by a new Trainer.fit(ckpt_path=...)."""
    _fit_with_checkpoints(tmp_path / "full", max_epochs=3)
    _fit_with_checkpoints(tmp_path / "part", max_epochs=1)
    _, resumed_model, _ = _fit_with_checkpoints(tmp_path / "resumed", ckpt_path=str(tmp_path / "part" / "ckpt" / "e0.ckpt"))
    full, part = _load(tmp_path / "full" / "ckpt" / "last.ckpt"), _load(tmp_path / "resumed" / "ckpt" / "last.ckpt")
    assert full["global_step"] == part["global_step"] == 3 * BATCHES_PER_EPOCH
    for key in ("state_dict", "current_model_state", "averaging_state"):
        assert set(full[key]) == set(part[key])
        for name in full[key]:
            assert torch.equal(full[key][name], part[key][name]), f"{key}.{name}"
    opt_full, opt_part = full["optimizer_states"][0]["state"], part["optimizer_states"][0]["state"]
    assert set(opt_full) == set(opt_part)
    for i in opt_full:
        for name, value in opt_full[i].items():
            assert torch.equal(value, opt_part[i][name]), f"optimizer state {i}.{name}"
    ema_state = [v for k, v in full["callbacks"].items() if "ModelEMA" in k]
    assert ema_state == [{"latest_update_step": 3 * BATCHES_PER_EPOCH}]
    assert all(torch.equal(resumed_model.state_dict()[k], v) for k, v in full["state_dict"].items())


def test_evaluating_a_checkpoint_uses_its_ema(tmp_path):
    """validate/test(ckpt_path=...) after fit, and in a fresh Trainer with the callback configured (tools/eval.py)."""
    trainer, model, _ = _fit_with_checkpoints(tmp_path, max_epochs=2)
    first = _load(tmp_path / "ckpt" / "e0.ckpt")
    for run in (trainer.validate, trainer.test):
        model.seen_in_validation.clear()
        run(model, _loader(), ckpt_path=str(tmp_path / "ckpt" / "e0.ckpt"), verbose=False)
        assert all(torch.equal(model.seen_in_validation[-1][k], v) for k, v in first["state_dict"].items()), run

    fresh = Tiny()
    _trainer(tmp_path, [ModelEMA()], limit_val_batches=1).validate(
        fresh, _loader(), ckpt_path=str(tmp_path / "ckpt" / "e0.ckpt"), verbose=False)
    assert all(torch.equal(fresh.seen_in_validation[-1][k], v) for k, v in first["state_dict"].items())


@pytest.mark.slow
def test_ddp_ranks_hold_the_same_ema(tmp_path):
    """2 CPU processes (gloo): the shipped EMA is bitwise equal on both ranks; without the buffer
    broadcast the BatchNorm statistics of the EMA differ (the check has teeth)."""
    from ddp_utils import run

    run(["tests/ema_ddp_worker.py", str(tmp_path)], timeout=180)
    r0, r1 = (_load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    assert r0["updates"] == r1["updates"] == 2 * 4  # 32 samples / 2 ranks / batch 4, 2 epochs
    for k in r0["synced"]:
        assert torch.equal(r0["synced"][k], r1["synced"][k]), k
    assert not torch.equal(r0["unsynced"]["net.1.running_mean"], r1["unsynced"]["net.1.running_mean"])
    assert torch.equal(r0["unsynced"]["net.0.weight"], r1["unsynced"]["net.0.weight"])  # DDP keeps parameters equal
    assert torch.equal(r0["synced"]["net.1.running_mean"], r0["unsynced"]["net.1.running_mean"])  # rank 0's wins


class Scored(Tiny):
    """Tiny with a scripted validation score per epoch (what a detector logs as val/mAP)."""

    def __init__(self, scores: list[float]) -> None:
        super().__init__()
        self.scores = scores

    def validation_step(self, batch, batch_idx):
        super().validation_step(batch, batch_idx)
        self.log("val/mAP", self.scores[self.current_epoch])


class AtEpochStart(L.Callback):
    """Listed after ModelEMA: the raw weights, the EMA, its update count and decay at each epoch's start."""

    def __init__(self, ema: ModelEMA) -> None:
        self.ema, self.seen = ema, {}

    def on_train_epoch_start(self, trainer, pl_module):
        self.seen[trainer.current_epoch] = (_clone(pl_module.state_dict()), _clone(self.ema._average_model.module.state_dict()),
                                            self.ema.num_updates, self.ema.decay,
                                            _clone(trainer.optimizers[0].state[next(iter(pl_module.parameters()))]))


def test_restart_puts_back_the_best_state_before_its_epoch(tmp_path):
    """D-FINE's ema_restart: at the start of restart_epoch, the raw weights, the EMA (with its update count) and the
    optimizer state of the best validation before it; the decay is restart_decay from there."""
    torch.manual_seed(0)
    ema = ModelEMA(decay=0.9, warmup_steps=0, restart_epoch=3, restart_decay=0.5)
    rec, starts = RecordRaw(ema), AtEpochStart(ema)
    model = Scored([0.3, 0.5, 0.4, 0.9, 0.1])  # the best before epoch 3 is epoch 1's
    _trainer(tmp_path, [ema, rec, starts], max_epochs=4, limit_val_batches=1, num_sanity_val_steps=0).fit(model, _loader(), _loader())
    end_of_1 = 2 * BATCHES_PER_EPOCH - 1
    raw, averaged, updates, decay, adam = starts.seen[3]
    assert all(torch.equal(raw[k], rec.raw[end_of_1][k]) for k in raw)
    assert all(torch.equal(averaged[k], rec.averaged[end_of_1][k]) for k in averaged)
    assert updates == 2 * BATCHES_PER_EPOCH and decay == 0.5 and ema.restarted_from == 0.5
    assert int(adam["step"]) == 2 * BATCHES_PER_EPOCH  # AdamW's state of that step, not of epoch 2's end
    # epoch 2's own end state was different: the restart did something
    assert not torch.equal(rec.raw[3 * BATCHES_PER_EPOCH - 1]["net.0.weight"], raw["net.0.weight"])
    # the EMA goes on from there: 4 more updates
    assert ema.num_updates == 3 * BATCHES_PER_EPOCH


def test_without_restart_nothing_is_kept(tmp_path):
    ema = ModelEMA(decay=0.9, warmup_steps=0)
    starts = AtEpochStart(ema)
    _trainer(tmp_path, [ema, starts], max_epochs=3, limit_val_batches=1, num_sanity_val_steps=0).fit(Scored([0.5, 0.1, 0.2]),
                                                                                                   _loader(), _loader())
    assert ema._best is None and ema.restarted_from is None and [s[2] for s in starts.seen.values()] == [0, 4, 8]
    with pytest.raises(ValueError, match="restart_epoch"):
        ModelEMA(restart_epoch=0)


@pytest.mark.parametrize("edit, expected", [
    (lambda ck: ck["current_model_state"].update({"net.0.weight": torch.zeros(2)}),
     r"current_model_state\['net\.0\.weight'\] is a floating tensor of shape \(2,\), where this run's ModelEMA needs a "
     r"floating tensor of shape \(\d+, \d+\)"),
    (lambda ck: ck["current_model_state"]["net.0.weight"].fill_(float("nan")),
     r"current_model_state\['net\.0\.weight'\] is a floating tensor .*, where this run's ModelEMA needs finite values"),
    (lambda ck: ck["averaging_state"].update(n_averaged="3"),
     r"averaging_state\['n_averaged'\] is '3', where this run's ModelEMA needs an integer tensor of shape \(\)"),
    (lambda ck: ck["averaging_state"].update(extra=1), r"averaging_state\['extra'\] is 1, where this run's ModelEMA needs "
                                                       r"absent"),
    (lambda ck: next(v for k, v in ck["callbacks"].items() if "ModelEMA" in k).update(latest_update_step="4"),
     r"the checkpoint resumed from: its ModelEMA state \{'latest_update_step': '4'\} is not the step count"),
])
def test_a_resumed_ema_state_that_does_not_fit_is_refused_naming_the_field(tmp_path, edit, expected):
    """Lightning loads the raw weights and the average strictly (another shape: a bare traceback) and trained on from
    NaN raw weights; the step count of another type failed at the next update."""
    from visiontf.io.training_state import TrainingStateError

    _fit_with_checkpoints(tmp_path / "part", max_epochs=1)
    ck = _load(tmp_path / "part" / "ckpt" / "e0.ckpt")
    edit(ck)
    torch.save(ck, tmp_path / "edited.ckpt")
    with pytest.raises(TrainingStateError, match=expected):
        _fit_with_checkpoints(tmp_path / "resumed", ckpt_path=str(tmp_path / "edited.ckpt"))
