"""rFID of a tokenizer's reconstructions (TokenizerTask(rfid=True), torchmetrics' FID): the pipeline with a small
random feature network in place of Inception against a hand computation, and the offline errors that name
what to install or which file to place where."""
from __future__ import annotations

import sys
import types

import lightning as L
import numpy as np
import pytest
import torch
from scipy import linalg
from torch.utils.data import DataLoader, TensorDataset

from visiontf.tasks.generation.fid import INCEPTION_FILE, InceptionWeightsMissing
from visiontf.tasks.generation.tokenizer_task import TokenizerTask

TOY = {"ch": 32, "ch_mult": [1, 2], "num_res_blocks": 1, "attn_resolutions": [], "n_embed": 16, "embed_dim": 4,
       "z_channels": 32, "resolution": 16}


class TinyFeatures(torch.nn.Module):
    """A fixed random conv net mapping images in [0, 1] to 6 features (a stand-in for Inception's 2048)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.net = torch.nn.Sequential(torch.nn.Conv2d(3, 6, 3, stride=2), torch.nn.Tanh(),
                                       torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten())

    def forward(self, x):
        return self.net(x)


def _fid(a: np.ndarray, b: np.ndarray) -> float:
    mu1, mu2 = a.mean(0), b.mean(0)
    s1, s2 = np.cov(a, rowvar=False), np.cov(b, rowvar=False)
    covmean = linalg.sqrtm(s1 @ s2).real
    return float(((mu1 - mu2) ** 2).sum() + np.trace(s1 + s2 - 2 * covmean))


def _task(**kw) -> TokenizerTask:
    return TokenizerTask("vqgan_tiny", model_kwargs=TOY, perceptual_weight=0.0, disc_ndf=8, disc_layers=2, **kw)


def test_rfid_of_reconstructions_equals_a_hand_computation():
    torch.manual_seed(0)
    task = _task(rfid=True)
    task.fid_feature = TinyFeatures()
    images = torch.rand(12, 3, 16, 16) * 2 - 1
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False)
    metrics = trainer.validate(task, DataLoader(TensorDataset(images), batch_size=4), verbose=False)[0]
    with torch.no_grad():
        rec = task.model.decode(task.model.encode(images)[0]).clamp(-1, 1)
        feats = task.fid_feature
        real = feats((images + 1) / 2).double().numpy()
        fake = feats((rec + 1) / 2).double().numpy()
    expected = _fid(real, fake)
    assert expected > 1e-3  # an untrained tokenizer: its reconstructions are far from the inputs
    assert metrics["val/rfid"] == pytest.approx(expected, rel=1e-3, abs=1e-5)
    # a second validation starts from empty statistics (not the first one's images again)
    again = trainer.validate(task, DataLoader(TensorDataset(images[:6]), batch_size=3), verbose=False)[0]
    with torch.no_grad():
        rec6 = task.model.decode(task.model.encode(images[:6])[0]).clamp(-1, 1)
        expected6 = _fid(feats((images[:6] + 1) / 2).double().numpy(), feats((rec6 + 1) / 2).double().numpy())
    assert again["val/rfid"] == pytest.approx(expected6, rel=1e-3, abs=1e-5)


def test_rfid_is_off_by_default():
    task = _task()
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False)
    metrics = trainer.validate(task, DataLoader(TensorDataset(torch.rand(4, 3, 16, 16) * 2 - 1), batch_size=2),
                               verbose=False)[0]
    assert "val/rfid" not in metrics and task._fid is None


def test_missing_inception_weights_name_the_file_and_where(tmp_path, monkeypatch):
    # torch-fidelity present (a stand-in module), its weights absent: the error names the file, the folder, the URL
    monkeypatch.setitem(sys.modules, "torch_fidelity", types.ModuleType("torch_fidelity"))
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    task = _task(rfid=True)
    with pytest.raises(InceptionWeightsMissing) as err:
        task.setup("validate")
    message = str(err.value)
    assert INCEPTION_FILE in message and str(tmp_path / "torch" / "hub" / "checkpoints") in message
    assert "github.com/toshas/torch-fidelity" in message and "fid_inception" in message and "\n" not in message
    explicit = _task(rfid=True, fid_inception=str(tmp_path / "inception.pth"))
    with pytest.raises(InceptionWeightsMissing, match="inception.pth"):
        explicit.setup("fit")


def test_missing_torch_fidelity_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch_fidelity", None)  # import fails as if not installed
    with pytest.raises(InceptionWeightsMissing, match="pip install torch-fidelity"):
        _task(rfid=True).setup("validate")


class _RunsACommand:
    """Unpickled, it would run ``touch`` on the marker (what a full torch.load of the file does)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        import os
        return os.system, (f"touch {self.marker}",)


def test_a_pickle_given_as_the_inception_file_is_refused_before_torch_fidelity_reads_it(tmp_path, monkeypatch):
    """torch-fidelity reads the file with a bare torch.load, which TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD turns into full
    unpickling, and ``fid_inception`` may come from a checkpoint's arguments: visiontf reads it as data first."""
    from visiontf.io.weights import WeightsError
    from visiontf.tasks.generation.fid import frechet_inception_distance

    monkeypatch.setitem(sys.modules, "torch_fidelity", types.ModuleType("torch_fidelity"))
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    marker = tmp_path / "payload_ran"
    hostile = tmp_path / "weights-inception.pth"
    torch.save({"fc.weight": _RunsACommand(marker)}, hostile)
    with pytest.raises(WeightsError, match="weights-inception.pth"):
        frechet_inception_distance(hostile)
    assert not marker.exists()
