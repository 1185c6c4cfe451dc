"""Task adapters: found through registry tags, saved preprocessing in checkpoints and exports, and no
task-string branching outside the adapters.

Cost: tiny models, no training; about 10 s.
"""
from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

import visiontf
from visiontf.inference.predictor import Predictor
from visiontf.tasks.task_inference import adapter_for_task, get_adapter

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def vit():
    return visiontf.create_model("vit_tiny_patch16_224", num_classes=3, img_size=32, depth=1).eval()


@pytest.fixture(scope="module")
def setr():
    return visiontf.create_model("setr_naive_vit_tiny_patch16", num_classes=3,
                                 encoder={"img_size": 32, "kwargs": {"depth": 4}}).eval()


def test_adapters_come_from_registry_tags(vit, setr):
    detr = visiontf.create_model("detr_tiny", num_classes=2, arch={"enc_layers": 1, "dec_layers": 1})
    assert [get_adapter(m).task for m in (vit, detr, setr)] == ["classification", "detection", "segmentation"]
    assert get_adapter(nn.Linear(2, 2), task="detection") is adapter_for_task("detection")
    with pytest.raises(ValueError, match="task="):
        get_adapter(nn.Linear(2, 2))
    with pytest.raises(ValueError, match="use one of"):
        adapter_for_task("keypoints")


def test_build_postprocess_follows_the_class_head():
    from visiontf.models.contract import Detector
    from visiontf.set_prediction import PostProcess, build_postprocess

    assert isinstance(build_postprocess(Detector()), PostProcess), "the kind's declared default: DETR's convention"
    with pytest.raises(ValueError, match="class_head = 'bogus'"):
        build_postprocess(SimpleNamespace(class_head="bogus"))


def _checkpoint(model, path: Path, name: str, num_classes: int, kwargs: dict, dm_hparams: dict, task_hparams=None,
                preprocess=None) -> Path:
    ckpt = {"state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
            "hyper_parameters": {"model_name": name, "num_classes": num_classes, "model_kwargs": kwargs, **(task_hparams or {})},
            "datamodule_hyper_parameters": dm_hparams}
    if preprocess is not None:
        ckpt["preprocess"] = preprocess
    torch.save(ckpt, path)
    return path


def test_checkpoints_predict_with_their_saved_preprocessing(tmp_path, setr):
    """A checkpoint with saved preprocessing predicts bit for bit as the Predictor given the same settings
    by hand; one without predicts with the model's own ``pretrained_cfg``."""
    kwargs = {"encoder": {"img_size": 32, "kwargs": {"depth": 4}}}
    given = {"resize": (64, 40), "test_mode": "slide", "crop_size": 32, "stride": 16}
    saved = get_adapter(setr).eval_settings(setr, given).to_dict()
    new = _checkpoint(setr, tmp_path / "new.ckpt", "setr_naive_vit_tiny_patch16", 3, kwargs, {"renamed": 1}, {}, saved)
    bare = _checkpoint(setr, tmp_path / "bare.ckpt", "setr_naive_vit_tiny_patch16", 3, kwargs, {"val_resize": [64, 40]})
    images = [torch.rand(3, 50, 37), torch.rand(3, 20, 70)]
    ref = Predictor(setr, device="cpu", preprocess=given)(images)
    got = Predictor.from_checkpoint(new, device="cpu")(images)
    assert all(torch.equal(a["label_map"], b["label_map"]) for a, b in zip(got, ref))
    assert Predictor.from_checkpoint(new, device="cpu").cfg == saved
    # nothing saved: the data module's hyper-parameters are not read by name, the model's defaults apply
    assert Predictor.from_checkpoint(bare, device="cpu").settings == get_adapter(setr).eval_settings(setr)


def test_tasks_save_the_data_modules_eval_settings_with_checkpoints(tmp_path):
    from visiontf.tasks.classification.classification_data import ClassificationDataModule
    from visiontf.tasks.classification.classification_synthetic import make_classification_dataset
    from visiontf.tasks.classification.classification_task import ClassificationTask

    root = make_classification_dataset(tmp_path / "data", num_train=4, num_val=2, num_classes=2, image_size=32)
    dm = ClassificationDataModule(root, image_size=24, crop_pct=1.0, num_workers=0)
    task = ClassificationTask("vit_tiny_patch16_224", num_classes=2, model_kwargs={"img_size": 24, "patch_size": 8, "depth": 1})
    task._trainer = SimpleNamespace(datamodule=dm)
    ckpt: dict = {}
    task.on_save_checkpoint(ckpt)
    assert ckpt["preprocess"] == {"input_size": (3, 24, 24), "crop_pct": 1.0, "interpolation": "bicubic",
                                  "mean": tuple(dm.hparams.mean), "std": tuple(dm.hparams.std)}
    assert ckpt["class_names"] == dm.class_names


def test_exports_carry_preprocessing_that_from_file_reads(tmp_path, vit, setr):
    from visiontf.inference.export import export_model
    from visiontf.io.weights import read_labels_file

    report = export_model(vit, tmp_path / "vit.safetensors", preprocess={"crop_pct": 1.0})
    saved = read_labels_file(report["safetensors"])
    assert set(saved) == {"preprocess"}, "the labels file holds the complete settings, nothing else"
    assert saved["preprocess"]["crop_pct"] == 1.0 and saved["preprocess"]["input_size"] == [3, 32, 32]
    assert saved["preprocess"]["interpolation"] == "bicubic"
    assert Predictor.from_file(report["safetensors"], device="cpu").cfg["crop_pct"] == 1.0
    report = export_model(setr, tmp_path / "setr.safetensors", preprocess={"test_mode": "slide", "resize": (64, 40),
                                                                          "crop_size": 32, "stride": 16})
    p = Predictor.from_file(report["safetensors"], device="cpu")
    assert (p.cfg["test_mode"], p.cfg["resize"], p.cfg["stride"]) == ("slide", (64, 40), 16)


def test_no_module_outside_the_task_packages_compares_task_strings():
    """Task-specific behaviour lives in its task's package (visiontf/tasks/<task>/) and the adapter lookup
    (visiontf/tasks/task_inference.py); elsewhere a task name is passed, never compared."""
    from visiontf.tasks.task_table import TASKS

    tasks = set(TASKS)
    offenders = []
    for path in sorted((ROOT / "visiontf").rglob("*.py")):
        inside = path.relative_to(ROOT / "visiontf").parts
        if inside[0] == "tasks" and (len(inside) > 2 or inside[1] == "task_inference.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                consts = [c for c in (node.left, *node.comparators) if isinstance(c, ast.Constant)]
                if any(c.value in tasks for c in consts):
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not offenders, f"task strings compared outside the task packages: {offenders}"
