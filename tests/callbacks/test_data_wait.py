"""DataWaitTimer: a slow loader shows as waiting, a fast one does not; images are counted per step."""
from __future__ import annotations

import json
import time

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from visiontf.callbacks import DataWaitTimer


class _Images(Dataset):
    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s

    def __len__(self) -> int:
        return 15

    def __getitem__(self, i: int):
        time.sleep(self.delay_s)
        return torch.randn(3, 4, 4), torch.tensor(i % 2)


class _Model(L.LightningModule):
    def __init__(self, step_s: float) -> None:
        super().__init__()
        self.step_s = step_s
        self.head = torch.nn.Linear(48, 2)

    def training_step(self, batch, batch_idx):
        time.sleep(self.step_s)
        images, labels = batch
        return torch.nn.functional.cross_entropy(self.head(images.flatten(1)), labels)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _fit(delay_s: float, step_s: float, tmp_path, out=None) -> dict:
    timer = DataWaitTimer(skip=1, out=out)
    trainer = L.Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[timer], default_root_dir=tmp_path)
    trainer.fit(_Model(step_s), DataLoader(_Images(delay_s), batch_size=3))
    return timer.summary()


def test_slow_loader_waits_fast_loader_does_not(tmp_path):
    # 3 images x 30 ms to load against a 5 ms step: mostly waiting
    slow = _fit(0.03, 0.005, tmp_path, out=tmp_path / "wait.json")
    assert slow["steps"] == 5 - 1 - 1  # 5 batches, 1 skipped, the last one's step has no end mark
    assert slow["wait_s_median"] >= 0.09  # the loader's sleeps alone
    assert slow["images_per_s"] == pytest.approx(3 * slow["steps"] / slow["wall_s"])
    assert json.loads((tmp_path / "wait.json").read_text())["steps"] == slow["steps"]
    # no loading time against a 100 ms step: the wait is the loop's own overhead
    fast = _fit(0.0, 0.1, tmp_path)
    assert fast["wait_s_median"] < 0.05
    assert fast["wait_share"] < slow["wait_share"] - 0.3


def test_negative_skip_is_refused():
    with pytest.raises(ValueError, match="skip must be >= 0"):
        DataWaitTimer(skip=-1)
