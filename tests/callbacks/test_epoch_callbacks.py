"""ValidationSchedule (a run whose checkpoint monitors a val metric validates) and EpochLines (a line per
epoch), on stand-in trainers: the hooks only read a few trainer attributes."""
import logging
from types import SimpleNamespace

import pytest
import torch

from visiontf.callbacks.epoch_lines import EpochLines
from visiontf.callbacks.validation_schedule import ValidationSchedule


def _trainer(every, max_epochs, monitor="val/mAP"):
    return SimpleNamespace(check_val_every_n_epoch=every, max_epochs=max_epochs, limit_val_batches=1.0,
                           checkpoint_callbacks=[SimpleNamespace(monitor=monitor)], callbacks=[])


@pytest.mark.parametrize("every, max_epochs, monitor, after, message", [
    (10, 3, "val/mAP", 3, "check_val_every_n_epoch=10 is more than max_epochs=3, so this run would never validate, "
                          "but the checkpoint monitors val/mAP: validating at the last epoch instead"),
    (10, 3, None, 10, "check_val_every_n_epoch=10 is more than max_epochs=3: this run never validates"),
    (4, 10, "val/mAP", 4, "max_epochs=10 is not a multiple of check_val_every_n_epoch=4: the last validation is at epoch 8, "
                          "so the last 2 epoch(s) are not validated and the best checkpoint by val/mAP predates them"),
    (5, 10, "val/mAP", 5, None),
    (1, 3, "val/mAP", 1, None),
])
def test_validation_schedule(caplog, every, max_epochs, monitor, after, message):
    trainer = _trainer(every, max_epochs, monitor)
    with caplog.at_level(logging.WARNING):
        ValidationSchedule().on_fit_start(trainer, None)
    assert trainer.check_val_every_n_epoch == after
    if message:
        assert message in caplog.text
    else:
        assert not caplog.text


def test_epoch_lines(capsys, monkeypatch):
    clock = iter([100.0, 112.0, 124.5])
    monkeypatch.setattr("visiontf.callbacks.epoch_lines.time.monotonic", lambda: next(clock))
    cb = EpochLines()
    trainer = SimpleNamespace(current_epoch=0, max_epochs=3, sanity_checking=False, checkpoint_callbacks=[],
                              callback_metrics={"val/mAP": torch.tensor(0.25), "val/map_50": torch.tensor(0.5),
                                                "val/loss": torch.tensor(3.0), "train/loss": torch.tensor(1.0)})
    cb.on_train_start(trainer, None)
    for epoch, losses in ((0, [2.0, 4.0]), (1, [1.0])):
        trainer.current_epoch = epoch
        cb.on_train_epoch_start(trainer, None)
        for loss in losses:
            cb.on_train_batch_end(trainer, None, {"loss": torch.tensor(loss)}, None, 0)
        if epoch == 1:
            cb.on_validation_end(trainer, None)
        cb.on_train_epoch_end(trainer, None)
    assert capsys.readouterr().out.splitlines() == [
        "epoch 1/3  loss 3.000  12.0 s/epoch  elapsed 0:12  about 0:24 left",
        "epoch 2/3  loss 1.000  12.2 s/epoch  elapsed 0:24  about 0:12 left  val/mAP 0.250  val/map_50 0.500",
    ]


def test_epoch_lines_time_left_is_bounded_by_max_time(capsys, monkeypatch):
    """With ``max_time`` shorter than ``max_epochs`` would take, the time left is what remains of it
    (make demo: 100 epochs, 8 minutes), and on the last epoch there is none."""
    from lightning.pytorch.callbacks import Timer

    clock = iter([0.0, 80.0, 160.0])
    monkeypatch.setattr("visiontf.callbacks.epoch_lines.time.monotonic", lambda: next(clock))
    timer = Timer(duration="00:00:08:00")
    monkeypatch.setattr(timer, "time_remaining", lambda stage="train": 400.0)
    cb = EpochLines()
    trainer = SimpleNamespace(current_epoch=0, max_epochs=100, sanity_checking=False, checkpoint_callbacks=[],
                              callback_metrics={}, callbacks=[timer])
    cb.on_train_start(trainer, None)
    cb.on_train_epoch_end(trainer, None)
    trainer.max_epochs = 2  # a run whose epochs end before the time limit: the epoch estimate
    trainer.current_epoch = 1
    cb.on_train_epoch_end(trainer, None)
    assert capsys.readouterr().out.splitlines() == [
        "epoch   1/100  80.0 s/epoch  elapsed 1:20  about 6:40 left",
        "epoch 2/2  80.0 s/epoch  elapsed 2:40",
    ]
