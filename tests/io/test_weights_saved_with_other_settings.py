"""``create_model(name, pretrained=file)`` builds ``name`` from its own keywords and loads the file's tensors. When the
file says it was saved from ``name`` with other settings (a task checkpoint's hyper-parameters, an export's config),
settings that change no tensor's shape (the queries, their distinct selection, how many detections are kept) would
compute otherwise, unseen: the weights load either way. That is said in one warning naming the settings and the two
loaders that rebuild the model as saved."""
from __future__ import annotations

import logging

import pytest
import torch

from visiontf.io.weights import read_weights_file, save_model
from visiontf.models import create_model, load_model
from visiontf.tasks.checkpoints import load_checkpoint_model

TRAINED = {"decoder": {"num_queries": 50, "distinct_query_iou": 0.8, "distinct_between_layers": True}, "num_select": 50}
REGISTRY = "visiontf.models._registry"


def _checkpoint(path, model, model_kwargs) -> None:
    """A visiontf task checkpoint's layout: the network under ``model.``, the task's hyper-parameters beside it."""
    torch.save({"state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
                "hyper_parameters": {"model_name": "rtdetr_tiny", "num_classes": 3, "model_kwargs": model_kwargs}}, path)


def _warnings(caplog) -> list[str]:
    """The warnings of settings (fine-tuning's own, of the re-initialised head, is another)."""
    return [r.getMessage() for r in caplog.records
            if r.name == REGISTRY and r.levelno == logging.WARNING and " saved with " in r.getMessage()]


@pytest.fixture(scope="module")
def trained():
    torch.manual_seed(0)
    return create_model("rtdetr_tiny", num_classes=3, **TRAINED).eval()


def test_a_checkpoint_saved_with_other_settings_is_named_and_its_loaders_rebuild_it(trained, tmp_path, caplog):
    _checkpoint(tmp_path / "run.ckpt", trained, TRAINED)
    with caplog.at_level(logging.WARNING, logger=REGISTRY):
        plain = create_model("rtdetr_tiny", pretrained=tmp_path / "run.ckpt", num_classes=3).eval()
    (message,) = _warnings(caplog)
    assert "run.ckpt holds rtdetr_tiny saved with decoder={" in message and "num_select=50" in message
    assert "create_model built it with the defaults" in message and "load_checkpoint_model" in message
    # what the warning is about: the same tensors, other detections
    assert all(torch.equal(plain.state_dict()[k], v) for k, v in trained.state_dict().items())
    images = torch.rand(1, 3, 128, 160)
    with torch.no_grad():
        assert trained(images)["pred_logits"].shape[1] == 50 and plain(images)["pred_logits"].shape[1] == 100
        rebuilt = load_checkpoint_model(tmp_path / "run.ckpt")[0].eval()
        assert torch.equal(rebuilt(images)["pred_boxes"], trained(images)["pred_boxes"])


def test_the_same_settings_another_head_or_another_framework_give_no_warning(trained, tmp_path, caplog):
    # the settings given as saved (tuples and lists alike; a backbone file to start from is no setting)
    _checkpoint(tmp_path / "run.ckpt", trained, {**TRAINED, "backbone": {"pretrained": "/nonexistent.pth"}})
    # the trained settings given back (the section's given tuple, the checkpoint's saved list, are one value)
    given = {**TRAINED, "decoder": {**TRAINED["decoder"], "num_points": (4, 4, 4)}}
    _checkpoint(tmp_path / "points.ckpt", trained, {**TRAINED, "decoder": {**TRAINED["decoder"], "num_points": [4, 4, 4]}})
    with caplog.at_level(logging.WARNING, logger=REGISTRY):
        create_model("rtdetr_tiny", pretrained=tmp_path / "run.ckpt", num_classes=3, **TRAINED)
        create_model("rtdetr_tiny", pretrained=tmp_path / "points.ckpt", num_classes=3, **given)
        # fine-tuning to another number of classes with the saved settings: a new head, no warning of settings
        create_model("rtdetr_tiny", pretrained=tmp_path / "run.ckpt", num_classes=5, **TRAINED)
        # a plain state dict says nothing of its settings
        torch.save(trained.state_dict(), tmp_path / "plain.pth")
        create_model("rtdetr_tiny", pretrained=tmp_path / "plain.pth", num_classes=3)
    assert _warnings(caplog) == []


def test_an_export_saved_with_other_settings_is_named_too(trained, tmp_path, caplog):
    path = save_model(trained, tmp_path / "m.safetensors")
    assert read_weights_file(path).saved_config["model_kwargs"]["num_select"] == 50
    with caplog.at_level(logging.WARNING, logger=REGISTRY):
        create_model("rtdetr_tiny", pretrained=path, num_classes=3, decoder={"num_queries": 80})
    (message,) = _warnings(caplog)
    assert "m.safetensors holds rtdetr_tiny saved with decoder={" in message and "num_select=50" in message
    assert "built it with decoder={'num_queries': 80}" in message and "visiontf.load_model" in message
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=REGISTRY):
        assert load_model(path).postprocess_options.num_top == 50
    assert _warnings(caplog) == []


def test_saved_settings_that_are_not_plain_data_are_not_compared_and_the_weights_still_load(trained, tmp_path, caplog):
    # a class written as a string is refused by every loader of the model as saved; the tensors alone are still data
    _checkpoint(tmp_path / "odd.ckpt", trained, {"backbone": "{class_path: os.system, init_args: {command: x}}"})
    assert read_weights_file(tmp_path / "odd.ckpt").saved_config is None
    with caplog.at_level(logging.WARNING, logger=REGISTRY):
        loaded = create_model("rtdetr_tiny", pretrained=tmp_path / "odd.ckpt", num_classes=3)
    assert _warnings(caplog) == []
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in trained.state_dict().items())
