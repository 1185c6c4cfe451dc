"""A checkpoint or an export holds all of its model's weights: the weight files its saved settings name (a backbone's
``pretrained``, timm's ``checkpoint_path``) are never read when it is loaded, and a file cannot choose how it is loaded
(``strict``). Both were found by a probe: loaders opened a path the file chose, and a file's ``strict: false`` switched
off the check of its own tensors."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from visiontf.io.weights import WeightsError, save_model
from visiontf.models import create_model, load_model
from visiontf.tasks.checkpoints import CheckpointError, load_checkpoint_model

NAMED = {"backbone": {"pretrained": "/nonexistent/imagenet_backbone.pth"}}


def _rewritten(path, change) -> None:
    """``path`` with its saved config changed by ``change`` (in the metadata and the .json beside it)."""
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        config = json.loads(f.metadata()["visiontf_config"])
    change(config)
    save_file(load_file(str(path)), str(path), metadata={"visiontf_config": json.dumps(config)})
    path.with_suffix(".json").write_text(json.dumps(config))


def test_an_export_reads_no_file_its_config_names_and_does_not_choose_strict(tmp_path):
    torch.manual_seed(0)
    model = create_model("rtdetr_tiny", num_classes=3)
    path = save_model(model, tmp_path / "m.safetensors")
    _rewritten(path, lambda c: c["model_kwargs"].update(NAMED))
    loaded = load_model(path)  # the named backbone file does not exist, and is not looked for
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in model.state_dict().items())
    _rewritten(path, lambda c: c["model_kwargs"].update(strict=False))
    with pytest.raises(WeightsError, match=r"m\.safetensors: its config's model_kwargs\.strict is False, an option of loading"):
        load_model(path)


def test_a_checkpoint_reads_no_file_its_hyper_parameters_name(tmp_path):
    torch.manual_seed(0)
    model = create_model("rtdetr_tiny", num_classes=3)
    ckpt = {"state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
            "hyper_parameters": {"model_name": "rtdetr_tiny", "num_classes": 3, "model_kwargs": dict(NAMED)}}
    torch.save(ckpt, tmp_path / "run.ckpt")
    loaded, _ = load_checkpoint_model(tmp_path / "run.ckpt")
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in model.state_dict().items())
    # a timm backbone's checkpoint_path as well: built without it, so the weights that do not fit are named
    ckpt["hyper_parameters"]["model_kwargs"] = {"backbone": {"name": "timm:resnet18", "kwargs": {"checkpoint_path": "/nonexistent.pth"}}}
    torch.save(ckpt, tmp_path / "timm.ckpt")
    with pytest.raises(CheckpointError, match=r"timm\.ckpt: weights do not fit rtdetr_tiny built from the checkpoint's own"):
        load_checkpoint_model(tmp_path / "timm.ckpt")
