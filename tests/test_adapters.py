"""Task adapters: found through registry tags, saved preprocessing in checkpoints and exports, the
legacy path for older checkpoints, and no task-string branching outside the adapters.

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
from visiontf.adapters import adapter_for_task, canonical_cfg, get_adapter
from visiontf.checkpoints import legacy_eval_cfg
from visiontf.inference.predictor import Predictor

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def vit():
    return visiontf.create_model("vit_tiny_patch16_224", num_classes=3, img_size=32, depth=1).eval()


@pytest.fixture(scope="module")
def setr():
    return visiontf.create_model("setr_naive_vit_tiny_patch16", num_classes=3, img_size=32,
                                 encoder_kwargs={"depth": 4}).eval()


def test_adapters_come_from_registry_tags(vit, setr):
    detr = visiontf.create_model("detr_tiny", num_classes=2, enc_layers=1, dec_layers=1)
    assert [get_adapter(m).task for m in (vit, detr, setr)] == ["classification", "detection", "segmentation"]
    assert get_adapter(nn.Linear(2, 2), task="detection") is adapter_for_task("detection")
    with pytest.raises(ValueError, match="task="):
        get_adapter(nn.Linear(2, 2))
    with pytest.raises(ValueError, match="use one of"):
        adapter_for_task("depth")


def test_build_postprocess_follows_the_class_head():
    from visiontf.detection import PostProcess, build_postprocess

    assert isinstance(build_postprocess(SimpleNamespace(class_head="softmax")), PostProcess)
    assert isinstance(build_postprocess(nn.Linear(2, 2)), PostProcess), "no class_head: DETR's convention"
    with pytest.raises(ValueError, match="class_head = 'bogus'"):
        build_postprocess(SimpleNamespace(class_head="bogus"))


def _old_predictor_kwargs_from_hparams(dm, hp):
    """visiontf's former ``inference.predictor.predictor_kwargs_from_hparams``, verbatim (the reference)."""
    pk = {}
    for key in ("mean", "std"):
        if dm.get(key) is not None:
            pk[key] = tuple(dm[key])
    if dm.get("image_size") is not None:
        s = dm["image_size"]
        pk["input_size"] = (s, s) if isinstance(s, int) else tuple(s)
    if dm.get("crop_pct") is not None:
        pk["crop_pct"] = float(dm["crop_pct"])
    if dm.get("val_size") is not None:
        pk["min_size"] = int(dm["val_size"])
        if dm.get("max_size") is not None:
            pk["max_size"] = int(dm["max_size"])
    if isinstance(dm.get("val_resize"), (list, tuple)):
        pk["seg_scale"] = tuple(dm["val_resize"])
    elif dm.get("val_resize") is True and (dm.get("base_size") is not None or dm.get("layout")):
        from visiontf.data.segmentation import LAYOUTS

        base = dm.get("base_size")
        if base is None:
            base = LAYOUTS.get(dm["layout"], {}).get("base_size")
        if base is not None:
            pk["seg_scale"] = tuple(base)
    if hp.get("inference_mode") in ("whole", "slide"):
        pk["seg_mode"] = hp["inference_mode"]
        if hp.get("crop_size"):
            pk["seg_crop"] = hp["crop_size"]
        if hp.get("stride"):
            pk["seg_stride"] = hp["stride"]
    return pk


LEGACY_HPARAMS = [
    ({"image_size": 32, "crop_pct": 0.9, "mean": [0.5] * 3, "std": [0.5] * 3}, {}),
    ({"val_size": 64, "max_size": 96, "scales": [48, 64]}, {}),
    ({"val_size": 800}, {}),
    ({"val_resize": True, "layout": "ade20k", "base_size": None}, {"inference_mode": "slide", "crop_size": 32, "stride": 21}),
    ({"val_resize": [96, 48]}, {"inference_mode": "whole"}),
    ({"val_resize": False, "layout": "cityscapes"}, {"inference_mode": "whole", "crop_size": None}),
    ({}, {}),
]


@pytest.mark.parametrize("dm, hp", LEGACY_HPARAMS)
def test_legacy_path_derives_what_the_old_predictor_did(dm, hp):
    assert legacy_eval_cfg(dm, hp) == canonical_cfg(_old_predictor_kwargs_from_hparams(dm, hp))


def _checkpoint(model, path: Path, name: str, num_classes: int, kwargs: dict, dm_hparams: dict, task_hparams=None,
                preprocess=None) -> Path:
    ckpt = {"state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
            "hyper_parameters": {"model_name": name, "num_classes": num_classes, "model_kwargs": kwargs, **(task_hparams or {})},
            "datamodule_hyper_parameters": dm_hparams}
    if preprocess is not None:
        ckpt["preprocess"] = preprocess
    torch.save(ckpt, path)
    return path


def test_old_and_new_checkpoints_predict_identically(tmp_path, setr):
    """A checkpoint without saved preprocessing (legacy) and one with it predict bit for bit as the
    Predictor given the same settings by hand."""
    kwargs = {"img_size": 32, "encoder_kwargs": {"depth": 4}}
    dm_hp, task_hp = {"val_resize": [64, 40]}, {"inference_mode": "slide", "crop_size": 32, "stride": 16}
    old = _checkpoint(setr, tmp_path / "old.ckpt", "setr_naive_vit_tiny_patch16", 3, kwargs, dm_hp, task_hp)
    saved = get_adapter(setr).eval_cfg(setr, legacy_eval_cfg(dm_hp, task_hp))
    new = _checkpoint(setr, tmp_path / "new.ckpt", "setr_naive_vit_tiny_patch16", 3, kwargs, {"renamed": 1}, {}, saved)
    images = [torch.rand(3, 50, 37), torch.rand(3, 20, 70)]
    ref = Predictor(setr, device="cpu", seg_scale=(64, 40), seg_mode="slide", seg_crop=32, seg_stride=16)(images)
    for ckpt in (old, new):
        got = Predictor.from_checkpoint(ckpt, device="cpu")(images)
        assert all(torch.equal(a["label_map"], b["label_map"]) for a, b in zip(got, ref)), ckpt.name
    assert Predictor.from_checkpoint(new, device="cpu").cfg == saved


def test_tasks_save_the_data_modules_eval_settings_with_checkpoints(tmp_path):
    from visiontf.data.classification import ClassificationDataModule
    from visiontf.data.synthetic.classification import make_classification_dataset
    from visiontf.tasks.classification import ClassificationTask

    root = make_classification_dataset(tmp_path / "data", num_train=4, num_val=2, num_classes=2, image_size=32)
    dm = ClassificationDataModule(root, image_size=24, crop_pct=1.0, num_workers=0)
    task = ClassificationTask("vit_tiny_patch16_224", num_classes=2, model_kwargs={"img_size": 24, "patch_size": 8, "depth": 1})
    task._trainer = SimpleNamespace(datamodule=dm)
    ckpt: dict = {}
    task.on_save_checkpoint(ckpt)
    assert ckpt["preprocess"] == {"input_size": (3, 24, 24), "crop_pct": 1.0, "interpolation": "bicubic",
                                  "mean": tuple(dm.hparams.mean), "std": tuple(dm.hparams.std)}
    assert ckpt["class_names"] == dm.class_names


def test_exports_carry_preprocessing_and_old_labels_files_still_load(tmp_path, vit, setr):
    from visiontf.inference.export import export_model
    from visiontf.weights import labels_path, read_labels_file

    report = export_model(vit, tmp_path / "vit.safetensors", predictor_kwargs={"crop_pct": 1.0})
    saved = read_labels_file(report["safetensors"])["preprocess"]
    assert saved["crop_pct"] == 1.0 and saved["input_size"] == [3, 32, 32] and saved["interpolation"] == "bicubic"
    # a labels file of an older visiontf: the Predictor's former keyword names, no "preprocess"
    path = visiontf.save_model(setr, tmp_path / "setr.safetensors")
    labels_path(path).write_text('{"predictor_kwargs": {"seg_mode": "slide", "seg_scale": [64, 40], "seg_stride": 16}}')
    p = Predictor.from_file(path, device="cpu")
    assert (p.cfg["test_mode"], p.cfg["resize"], p.cfg["stride"]) == ("slide", (64, 40), 16)


def test_no_module_outside_the_adapters_compares_task_strings():
    """Task-specific behaviour lives in visiontf/adapters; elsewhere a task name is passed, never compared."""
    from visiontf.adapters.task_table import TASKS

    tasks = set(TASKS)
    offenders = []
    for path in sorted((ROOT / "visiontf").rglob("*.py")):
        if "adapters" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                consts = [c for c in (node.left, *node.comparators) if isinstance(c, ast.Constant)]
                if any(c.value in tasks for c in consts):
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not offenders, f"task strings compared outside visiontf/adapters: {offenders}"
