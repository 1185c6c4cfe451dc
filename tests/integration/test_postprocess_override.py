"""Post-processing replaced at evaluation and prediction, without editing a checkpoint.

The settings are the model's (``postprocess_options``, built from its constructor arguments, so a
checkpoint carries them); ``tools/eval.py --postprocess.*``, ``tools/predict.py --postprocess.*`` and
``Predictor(postprocess=...)`` replace them. LightningCLI re-applies a checkpoint's hyper-parameters
over ``--model.*``, which is why these are options of their own. Cost: about 40 s (one fit, then every
eval and predict command line in one process).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_runner import error_line, run_tools
from handmade_data import own_detections_as_truth

from visiontf.models import create_model
from visiontf.models.postprocess_options import PostprocessOptions
from visiontf.set_prediction import build_postprocess, set_postprocess

CONFIG = "configs/deformable_detr/deformable_detr_tiny_shapes.yaml"
TOY_MODEL = ("--model.init_args.model_kwargs={arch: {hidden_dim: 32, nheads: 2, enc_layers: 1, dec_layers: 2, "
             "dim_feedforward: 32, num_queries: 12}, dino: {num_denoising: 6, num_query_groups: 2}, "
             "postprocess: {nms_iou_threshold: 0.7, nms_class_agnostic: false}}")
TOY_DATA = ["--data.init_args.num_workers=0", "--data.init_args.batch_size=2", "--data.init_args.scales=[64]",
            "--data.init_args.max_size=96", "--data.init_args.crop_scales=[64]", "--data.init_args.val_size=64",
            "--trainer.devices=1", "--trainer.strategy=auto", "--precision_without_native_bf16=null",
            "--trainer.precision=32-true"]


def test_set_postprocess_replaces_only_what_is_given():
    model = create_model("dino_tiny", num_classes=3, postprocess={"nms_iou_threshold": 0.7, "nms_class_agnostic": False})
    assert model.postprocess_options == PostprocessOptions(100, 0.7, False)
    assert set_postprocess(model, nms_iou_threshold=None, num_top=None) == PostprocessOptions(100, 0.7, False)
    set_postprocess(model, nms_iou_threshold=0.5)
    post = build_postprocess(model)
    assert (post.num_top, post.nms_iou_threshold, post.nms_class_agnostic) == (100, 0.5, False)
    set_postprocess(model, nms_iou_threshold=-1, num_top=20)  # DINO's -1: no NMS
    assert model.postprocess_options == PostprocessOptions(20, None, False)
    with pytest.raises(ValueError, match=r"unknown post-processing option\(s\) \['nms'\]"):
        set_postprocess(model, nms=0.5)
    with pytest.raises(ValueError, match="nms_iou_threshold must be in"):
        set_postprocess(model, nms_iou_threshold=1.5)


def test_detr_takes_the_same_options():
    model = create_model("detr_tiny", num_classes=2)
    assert build_postprocess(model).nms_iou_threshold is None  # every query, as the original
    set_postprocess(model, nms_iou_threshold=0.5, num_top=5)
    post = build_postprocess(model)
    assert (post.num_top, post.nms_iou_threshold) == (5, 0.5)


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, Path]:
    """A toy dino_tiny of the CPU recipe (NMS 0.7 within each label), fitted a few steps."""
    from visiontf.tasks.detection.detection_synthetic import make_detection_dataset

    base = tmp_path_factory.mktemp("postprocess")
    root = base / "data"
    make_detection_dataset(root, num_train=8, num_val=4, image_size=(64, 80), num_classes=3)
    out = base / "run"
    (fit,) = run_tools([{"argv": ["tools/train.py", "fit", "--config", CONFIG, f"--data.init_args.root={root}", TOY_MODEL,
                                  *TOY_DATA, "--trainer.max_steps=6", "--trainer.limit_val_batches=0",
                                  "--trainer.enable_progress_bar=false", f"--trainer.default_root_dir={out}"]}], base)
    assert fit["code"] == 0, fit["stderr"][-3000:]
    return Path(root), out / "checkpoints" / "last.ckpt"


#: the predict command lines of test_predictor_and_predict_cli_take_the_override: name -> extra options
PREDICTS = {"plain": [], "top5": ["--postprocess.num_top", "5", "--postprocess.nms_iou_threshold", "-1"]}


@pytest.fixture(scope="module")
def tool_runs(trained, tmp_path_factory) -> tuple[Path, list[dict], dict[str, dict]]:
    """The eval and predict command lines of both tests in one process (tests/cli_runner.py): (their folder,
    the eval results in order, predict name -> result)."""
    root, ckpt = trained
    tmp_path = tmp_path_factory.mktemp("postprocess_tools")
    truth = own_detections_as_truth(ckpt, root, tmp_path / "data")  # with the checkpoint's NMS: nonzero stats

    def case(name: str, *extra: str) -> dict:
        return {"argv": ["tools/eval.py", "--config", CONFIG, f"--data.init_args.root={truth}", *TOY_DATA,
                         "--data.init_args.batch_size=1",
                         f"--trainer.default_root_dir={tmp_path / name}", "--ckpt_path", ckpt,
                         "--output", tmp_path / f"{name}.json", *extra]}

    evals = [case("plain"), case("again"), case("nms_off", "--postprocess.nms_iou_threshold", "-1"),
             case("nms_03", "--postprocess.nms_iou_threshold=0.3", "--postprocess.nms_class_agnostic=true"),
             case("fit_refused_in_eval", "--postprocess.bogus", "1")]
    images = sorted((root / "val2017").glob("*.jpg"))
    predicts = [{"argv": ["tools/predict.py", "--ckpt_path", ckpt, "--input", *images, "--output", tmp_path / f"predict_{name}",
                          "--score_threshold", "0", *extra]} for name, extra in PREDICTS.items()]
    results = run_tools(evals + predicts, tmp_path)
    return tmp_path, results[:len(evals)], dict(zip(PREDICTS, results[len(evals):]))


@pytest.mark.slow
def test_eval_override_changes_the_stats_and_no_override_reproduces_them(tool_runs):
    tmp_path, results, _ = tool_runs
    for r in results[:4]:
        assert r["code"] == 0, r["stderr"][-3000:]
    assert results[4]["code"] == 2 and "--postprocess.bogus" in error_line(results[4])
    stats = {name: json.loads((tmp_path / f"{name}.json").read_text()) for name in ("plain", "again", "nms_off", "nms_03")}
    coco = [k for k in stats["plain"] if k.startswith(("map", "mar"))]
    assert stats["plain"]["map_50"] > 0.2, stats["plain"]
    assert all(stats["again"][k] == stats["plain"][k] for k in coco)  # no override: the checkpoint's NMS 0.7
    # NMS at 0.3 over all labels suppresses detections that are the truth here: recall and AP fall
    assert stats["nms_03"]["mar_100"] < stats["plain"]["mar_100"] - 0.01, (stats["nms_03"], stats["plain"])
    logs = [r["stderr"] + r["stdout"] for r in results]
    assert "post-processing of DeformableDETR" not in logs[0] + logs[1]
    assert "nms_iou_threshold=None, nms_class_agnostic=False) (was PostprocessOptions(num_top=100, nms_iou_threshold=0.7" in logs[2]
    assert "nms_iou_threshold=0.3, nms_class_agnostic=True)" in logs[3]


@pytest.mark.slow
def test_predictor_and_predict_cli_take_the_override(trained, tool_runs):
    from visiontf.inference.predictor import Predictor

    root, ckpt = trained
    images = sorted((root / "val2017").glob("*.jpg"))
    plain = Predictor.from_checkpoint(ckpt, device="cpu")(images, score_threshold=None)
    again = Predictor.from_checkpoint(ckpt, device="cpu", postprocess={"nms_iou_threshold": None})(images, score_threshold=None)
    off = Predictor.from_checkpoint(ckpt, device="cpu", postprocess={"nms_iou_threshold": -1})(images, score_threshold=None)
    tight = Predictor.from_checkpoint(ckpt, device="cpu", postprocess={"nms_iou_threshold": 0.3, "nms_class_agnostic": True})(
        images, score_threshold=None)
    assert [len(r["boxes"]) for r in again] == [len(r["boxes"]) for r in plain]
    assert all(len(r["boxes"]) == 12 * 3 for r in off)  # every (query, class) pair: num_top clamps to 36
    assert sum(len(r["boxes"]) for r in tight) < sum(len(r["boxes"]) for r in plain)

    out, _, results = tool_runs
    for r in results.values():
        assert r["code"] == 0, r["stderr"][-3000:]
    count = {name: len(json.loads((out / f"predict_{name}" / "predictions.json").read_text())) for name in PREDICTS}
    assert count["top5"] == 5 * len(images) != count["plain"]
