"""Typed eval settings (visiontf/tasks/eval_settings.py): one frozen dataclass per task from the model's
pretrained_cfg to the preprocessing, checkpoints and exports; unknown keys are refused by name
everywhere (the adapters used to drop them silently); the layouts written before still load.

Cost: tiny models, no training; a few seconds.
"""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

import visiontf
from visiontf.inference.predictor import Predictor
from visiontf.tasks.eval_settings import EvalSettings, SettingsError
from visiontf.tasks.task_inference import adapter_for_task, get_adapter
from visiontf.tasks.task_table import TASKS

TINY_DETR = {"arch": {"enc_layers": 1, "dec_layers": 1, "num_queries": 5}}


@pytest.fixture(scope="module")
def vit():
    return visiontf.create_model("vit_tiny_patch16_224", num_classes=3, img_size=32, depth=1).eval()


@pytest.fixture(scope="module")
def detr():
    return visiontf.create_model("detr_tiny", num_classes=3, **TINY_DETR).eval()


@pytest.mark.parametrize("task", TASKS)
def test_each_task_has_one_frozen_settings_type_whose_dict_reads_back_equal(task):
    settings_type = adapter_for_task(task).settings_type
    assert issubclass(settings_type, EvalSettings) and settings_type is not EvalSettings
    defaults = settings_type()
    with pytest.raises(AttributeError):  # frozen: a Predictor's settings cannot drift from what it preprocesses with
        setattr(defaults, settings_type.keys()[0], None)
    stored = json.loads(json.dumps(defaults.to_dict()))  # as an export's .labels.json holds them: lists
    assert defaults.updated(stored) == defaults


def test_a_key_of_another_task_is_refused_naming_it(vit, detr):
    with pytest.raises(SettingsError, match=r"Predictor\(preprocess=\): unknown key\(s\) \['min_size'\] for "
                                            r"ClassificationSettings; it takes input_size, crop_pct"):
        Predictor(vit, device="cpu", preprocess={"min_size": 64})
    with pytest.raises(SettingsError, match="test_mode='tiles': use 'whole' or 'slide'"):
        adapter_for_task("segmentation").settings_type(test_mode="tiles")
    assert Predictor(detr, device="cpu", preprocess={"min_size": 64}).settings.min_size == 64


def test_a_file_with_an_unknown_setting_is_refused_naming_the_file(tmp_path, detr):
    ckpt = tmp_path / "odd.ckpt"
    torch.save({"state_dict": {f"model.{k}": v for k, v in detr.state_dict().items()},
                "hyper_parameters": {"model_name": "detr_tiny", "num_classes": 3, "model_kwargs": TINY_DETR},
                "preprocess": {"min_size": 64, "short_side": 64}}, ckpt)
    with pytest.raises(SettingsError, match=r"odd.ckpt: its saved preprocess: unknown key\(s\) \['short_side'\]"):
        Predictor.from_checkpoint(ckpt, device="cpu")


@pytest.mark.parametrize("task", [t for t in TASKS if {"mean", "std"} <= set(adapter_for_task(t).settings_type.keys())])
@pytest.mark.parametrize("field, value, words", [("mean", (float("nan"), 0.4, 0.4), "must be finite in every channel"),
                                                 ("std", (0.0, 0.0, 0.0), "must be finite and above 0"),
                                                 ("std", (0.2, float("inf"), 0.2), "must be finite and above 0")])
def test_a_normalisation_no_image_survives_is_refused(task, field, value, words):
    """A NaN mean made every pixel NaN (a detector then found nothing, without a word) and a zero std failed each image
    with a division error: such settings are refused where they are read, for every task that normalises."""
    settings_type = adapter_for_task(task).settings_type
    with pytest.raises(SettingsError, match=rf"{field} is .*: the normalisation's {field} {words}"):
        settings_type().updated({field: value})


def test_a_checkpoint_whose_saved_normalisation_is_nan_is_refused_naming_the_file(tmp_path, detr):
    ckpt = tmp_path / "nan_mean.ckpt"
    torch.save({"state_dict": {f"model.{k}": v for k, v in detr.state_dict().items()},
                "hyper_parameters": {"model_name": "detr_tiny", "num_classes": 3, "model_kwargs": TINY_DETR},
                "preprocess": {"min_size": 64, "mean": [float("nan"), 0.4, 0.4]}}, ckpt)
    with pytest.raises(SettingsError, match=r"nan_mean\.ckpt: its saved preprocess: mean is .*must be finite"):
        Predictor.from_checkpoint(ckpt, device="cpu")


def test_the_layouts_written_before_still_load(tmp_path, detr, vit):
    """Checkpoints stored a partial or complete dict of these keys (tuples), exports a JSON one (lists)."""
    ckpt = tmp_path / "old.ckpt"
    torch.save({"state_dict": {f"model.{k}": v for k, v in detr.state_dict().items()},
                "hyper_parameters": {"model_name": "detr_tiny", "num_classes": 3, "model_kwargs": TINY_DETR},
                "preprocess": {"min_size": 64, "max_size": 96}}, ckpt)
    p = Predictor.from_checkpoint(ckpt, device="cpu", preprocess={"max_size": 80})
    assert (p.settings.min_size, p.settings.max_size, p.settings.mean) == (64, 80, tuple(detr.pretrained_cfg.mean))
    from visiontf.io.weights import labels_path, save_model

    path = save_model(vit, tmp_path / "vit.safetensors")
    labels_path(path).write_text(json.dumps({"preprocess": {"input_size": [3, 32, 32], "crop_pct": 0.9,
                                                             "interpolation": "bicubic", "mean": [0.5] * 3, "std": [0.5] * 3}}))
    settings = Predictor.from_file(path, device="cpu").settings
    assert (settings.input_size, settings.crop_pct, settings.mean) == ((3, 32, 32), 0.9, (0.5, 0.5, 0.5))


def test_validation_without_resize_is_saved_as_no_resize(tmp_path):
    """A data module that validates at the original size saves ``resize: None`` with checkpoints. Before, None
    meant "not given" on the way in, so the model's published resize (SETR's mmseg scale) was saved instead."""
    from visiontf.tasks.segmentation.segmentation_data import SegmentationDataModule
    from visiontf.tasks.segmentation.segmentation_synthetic import make_segmentation_dataset
    from visiontf.tasks.segmentation.segmentation_task import SegmentationTask

    root = make_segmentation_dataset(tmp_path / "data", num_train=2, num_val=2, num_classes=3, image_size=(32, 32))
    dm = SegmentationDataModule(root, val_resize=False, crop_size=32, num_workers=0)
    task = SegmentationTask("setr_naive_vit_tiny_patch16", num_classes=3, model_kwargs={
        "encoder": {"img_size": 32, "kwargs": {"depth": 4}}, "pretrained_cfg": {"resize": (64, 40)}})
    assert task.model.pretrained_cfg.resize == (64, 40)
    task._trainer = SimpleNamespace(datamodule=dm)
    ckpt: dict = {}
    task.on_save_checkpoint(ckpt)
    assert ckpt["preprocess"]["resize"] is None
    assert get_adapter(task.model).eval_settings(task.model).resize == (64, 40), "the model's own, when nothing says"


@pytest.mark.parametrize("task", TASKS)
def test_every_size_in_pixels_read_from_a_file_is_bounded(task):
    """A checkpoint of a ViT whose preprocess said 10000 x 10000 kept tools/predict.py busy for many minutes on one
    small image. Settings read from a file (a checkpoint's preprocess, an export's labels file) are bounded."""
    from visiontf.tasks.eval_settings import MAX_SIDE

    settings_type = adapter_for_task(task).settings_type
    defaults = settings_type()
    for name in settings_type.pixel_fields:
        sizes = {"input_size": [(3, MAX_SIDE + 1, 224), (3, 224, 0)], "resize": [(MAX_SIDE + 1, 512)],
                 "crop_size": [MAX_SIDE + 1, (0, 64)], "stride": [0], "min_size": [MAX_SIDE + 1, 0],
                 "max_size": [MAX_SIDE + 1]}[name]
        for bad in sizes:
            with pytest.raises(SettingsError, match=rf"checkpoint's preprocess: {name} is .*: each size is 1 to "
                                                    rf"{MAX_SIDE} pixels"):
                defaults.updated({name: bad}).check_sizes("checkpoint's preprocess")
        assert defaults.check_sizes("x") == defaults
        assert defaults.updated({name: sizes[0]}) is not None  # a run's own config or a caller's values may go beyond
    if task == "detection":
        assert defaults.updated({"min_size": MAX_SIDE, "max_size": None}).check_sizes("x").min_size == MAX_SIDE
    assert settings_type.pixel_fields or task in ("restoration", "generation")


def test_a_crop_pct_that_would_resize_beyond_the_bound_is_refused():
    settings = adapter_for_task("classification").settings_type()
    assert settings.updated({"crop_pct": 1.15}).check_sizes("f.ckpt").crop_pct == 1.15  # timm's largest
    for bad in (0.0, -0.5, 224 / 9000):
        with pytest.raises(SettingsError, match=r"f\.ckpt: crop_pct is .*: it must be above 0, and input_size / crop_pct "
                                                r"at most 8192 pixels"):
            settings.updated({"crop_pct": bad}).check_sizes("f.ckpt")


def test_an_input_size_the_vit_cannot_take_is_refused_naming_the_file(tmp_path, vit):
    """A file's ``input_size`` within the pixel bounds that the ViT's patches do not divide (or another size than a
    fixed-size ViT's) ended in the patch embedding's traceback at the first image; it is refused when the predictor is
    built, naming the file and a size that works, and the same for a size given as ``preprocess=``."""
    from visiontf.io.weights import labels_path, save_model

    path = save_model(vit, tmp_path / "vit.safetensors")
    labels = labels_path(path)
    labels.write_text(json.dumps({"preprocess": {"input_size": [3, 250, 48]}}))
    with pytest.raises(SettingsError, match=r"vit\.labels\.json: its preprocess: input_size is \(3, 250, 48\), but this ViT's "
                                            r"16x16 patches do not divide 250x48; a multiple of the patch, e.g. 256x48"):
        Predictor.from_file(path, device="cpu")
    labels.write_text(json.dumps({"preprocess": {"input_size": [3, 48, 64]}}))
    assert Predictor.from_file(path, device="cpu").settings.input_size == (3, 48, 64)  # dynamic_img_size: any multiple
    with pytest.raises(SettingsError, match=r"preprocess=: input_size is \(3, 40, 64\), but this ViT's 16x16 patches"):
        Predictor.from_file(path, device="cpu", preprocess={"input_size": (3, 40, 64)})
    fixed = visiontf.create_model("vit_tiny_patch16_224", num_classes=3, img_size=32, depth=1, dynamic_img_size=False)
    assert fixed.input_size_error((48, 64)) == "this ViT takes only 32x32 (built with dynamic_img_size=False)"
    assert fixed.input_size_error((32, 32)) is None
    padded = visiontf.create_model("vit_tiny_patch16_224", num_classes=3, img_size=32, depth=1, dynamic_img_pad=True)
    assert padded.input_size_error((250, 48)) is None
