"""What visiontf still assumes of Lightning's internals, asserted by name, so that a Lightning release that
changes one fails here instead of silently changing a run (pyproject.toml pins the minor version these
hold for).

* ``visiontf.cli.train.VisionCLI`` overrides LightningCLI's public hooks, and three private members by
  design (:data:`PRIVATE_OVERRIDES`): ``_parse_ckpt_path``, where LightningCLI hands ``--ckpt_path``'s
  hyper-parameters to jsonargparse (visiontf reads them as data instead), ``_add_instantiators``, whose
  model instantiator visiontf's replaces (the checkpoint's arguments reach the constructor by a plain call),
  and ``_dump_config``, the dump that instantiator saves as the task's hyper-parameters. What they rely on is
  asserted below: the order of the calls in ``__init__``, the instantiator's signature and what it reads.
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

ROOT = Path(__file__).resolve().parents[2]


def test_the_installed_lightning_is_the_pinned_one():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pin = next(Requirement(d) for d in deps if Requirement(d).name == "lightning")
    assert any(s.operator == "<" for s in pin.specifier), f"{pin}: give Lightning an upper bound that CI tests"
    assert version("lightning") in pin.specifier, f"lightning {version('lightning')} is not {pin}"


#: LightningCLI's private members VisionCLI overrides, each for a reason in the module docstring
PRIVATE_OVERRIDES = ["_add_instantiators", "_dump_config", "_parse_ckpt_path"]


def test_vision_cli_overrides_only_the_private_members_it_declares():
    private = sorted(n for n in vars(VisionCLI) if re.match(r"_[^_]", n) and hasattr(LightningCLI, n))
    assert private == PRIVATE_OVERRIDES, f"VisionCLI overrides LightningCLI's private {private}; use a public hook"
    for name in PRIVATE_OVERRIDES:
        assert list(inspect.signature(getattr(LightningCLI, name)).parameters) == ["self"], name


def test_the_public_hooks_vision_cli_overrides_keep_their_signatures():
    hooks = {"__init__": None, "add_arguments_to_parser": ["self", "parser"], "parse_arguments": ["self", "parser", "args"],
             "instantiate_classes": ["self"], "instantiate_trainer": ["self", "kwargs"]}
    for name, params in hooks.items():
        assert name in vars(VisionCLI), name
        if params is not None:
            assert list(inspect.signature(getattr(LightningCLI, name)).parameters) == params, name


def test_the_cli_merges_the_checkpoint_between_parsing_and_instantiation():
    init = inspect.getsource(LightningCLI.__init__)
    calls = ("self.parse_arguments(", "self._parse_ckpt_path()", "self._add_instantiators()", "self.instantiate_classes()")
    order = [init.index(call) for call in calls]
    assert order == sorted(order), "LightningCLI no longer merges the checkpoint between parsing and instantiation"
    # the one place LightningCLI gives a checkpoint's hyper-parameters to the parser is the method VisionCLI replaces
    readers = [n for n, m in vars(LightningCLI).items() if callable(m) and "hyper_parameters" in inspect.getsource(m)]
    assert readers == ["_parse_ckpt_path"], readers


def test_the_model_instantiator_visiontf_extends():
    from lightning.pytorch.cli import _InstantiatorFn

    call = inspect.signature(_InstantiatorFn.__call__)
    assert list(call.parameters) == ["self", "class_type", "args", "applied_instantiation_links", "kwargs"]
    body = inspect.getsource(_InstantiatorFn.__call__)
    assert "self.cli._dump_config()" in body and "self.cli.config_dump" in body
    assert "_InstantiatorFn(cli=self, key=\"model\")" in inspect.getsource(LightningCLI._add_instantiators)


def test_the_loop_state_the_validation_schedule_reads():
    assert isinstance(inspect.getattr_static(_FitLoop, "restarted_mid_epoch"), property)
    assert isinstance(inspect.getattr_static(_TrainingEpochLoop, "restarted_on_last"), property)
    for name in ("_num_ready_batches_reached", "_should_check_val_epoch"):
        signature = inspect.signature(getattr(_TrainingEpochLoop, name))
        assert list(signature.parameters) == ["self"] and signature.return_annotation in (bool, "bool"), name
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False)
    assert isinstance(trainer.fit_loop, _FitLoop) and isinstance(trainer.fit_loop.epoch_loop, _TrainingEpochLoop)
