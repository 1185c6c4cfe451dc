"""What visiontf still assumes of Lightning's internals, asserted by name, so that a Lightning release that
changes one fails here instead of silently changing a run (pyproject.toml pins the minor version these
hold for).

* ``visiontf.cli.train.VisionCLI`` overrides only LightningCLI's public hooks. It relies on
  LightningCLI reading ``--ckpt_path``'s hyper-parameters (``_parse_ckpt_path``) right after
  ``parse_arguments`` (where the checkpoint is checked first) with ``torch.load(weights_only=True)``
  (which the run's allow-list context then governs).
* ``visiontf.callbacks.validation_schedule`` reads the fit loops' restart state to tell a checkpoint
  written by the validation that ended an epoch.

Cost: source inspection and one Trainer; about a second.
"""
from __future__ import annotations

import inspect
import re
from importlib.metadata import version
from pathlib import Path

import lightning as L
import tomllib
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.loops.fit_loop import _FitLoop
from lightning.pytorch.loops.training_epoch_loop import _TrainingEpochLoop
from packaging.requirements import Requirement

from visiontf.cli.train import VisionCLI

ROOT = Path(__file__).resolve().parents[1]


def test_the_installed_lightning_is_the_pinned_one():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pin = next(Requirement(d) for d in deps if Requirement(d).name == "lightning")
    assert any(s.operator == "<" for s in pin.specifier), f"{pin}: give Lightning an upper bound that CI tests"
    assert version("lightning") in pin.specifier, f"lightning {version('lightning')} is not {pin}"


def test_vision_cli_overrides_no_private_member_of_lightning_cli():
    private = sorted(n for n in vars(VisionCLI) if re.match(r"_[^_]", n) and hasattr(LightningCLI, n))
    assert not private, f"VisionCLI overrides LightningCLI's private {private}; use a public hook"


def test_the_public_hooks_vision_cli_overrides_keep_their_signatures():
    hooks = {"__init__": None, "add_arguments_to_parser": ["self", "parser"], "parse_arguments": ["self", "parser", "args"],
             "instantiate_classes": ["self"], "instantiate_trainer": ["self", "kwargs"]}
    for name, params in hooks.items():
        assert name in vars(VisionCLI), name
        if params is not None:
            assert list(inspect.signature(getattr(LightningCLI, name)).parameters) == params, name


def test_the_cli_reads_the_checkpoint_right_after_parse_arguments_with_weights_only():
    init = inspect.getsource(LightningCLI.__init__)
    order = [init.index(call) for call in ("self.parse_arguments(", "self._parse_ckpt_path()", "self.instantiate_classes()")]
    assert order == sorted(order), "LightningCLI no longer merges the checkpoint between parsing and instantiation"
    merge = inspect.getsource(LightningCLI._parse_ckpt_path)
    assert re.search(r"torch\.load\([^)]*weights_only=True", merge), "LightningCLI reads --ckpt_path another way"


def test_the_loop_state_the_validation_schedule_reads():
    assert isinstance(inspect.getattr_static(_FitLoop, "restarted_mid_epoch"), property)
    assert isinstance(inspect.getattr_static(_TrainingEpochLoop, "restarted_on_last"), property)
    for name in ("_num_ready_batches_reached", "_should_check_val_epoch"):
        signature = inspect.signature(getattr(_TrainingEpochLoop, name))
        assert list(signature.parameters) == ["self"] and signature.return_annotation in (bool, "bool"), name
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False)
    assert isinstance(trainer.fit_loop, _FitLoop) and isinstance(trainer.fit_loop.epoch_loop, _TrainingEpochLoop)
