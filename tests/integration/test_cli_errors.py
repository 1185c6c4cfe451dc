"""Every tools/*.py ends a user mistake with one line on stderr and exit code 2; --debug shows the
traceback; abbreviations are refused; predict/export take train.py's --data.* overrides and keep a
checkpoint's classes.

Cost: the light cases fail before torch is imported and run batched in one light process; the cases
that need Lightning or a model run batched in another (tests/cli_runner.py).
"""
from __future__ import annotations

import json
import subprocess
from collections import Counter
from pathlib import Path

import pytest
import torch
from cli_runner import error_line, run_tools
from handmade_data import CATEGORIES, make_dataset

import visiontf
from visiontf.cli.tool_errors import user_message
from visiontf.core.errors import UsageError
from visiontf.tasks.task_table import TASKS

ROOT = Path(__file__).resolve().parents[2]
CONFIG = "configs/detr/detr_tiny_shapes.yaml"
IDS = sorted(CATEGORIES)
NAMES = [CATEGORIES[c] for c in IDS]
TINY = {"arch": {"enc_layers": 1, "dec_layers": 1, "num_queries": 5}}


def fake_checkpoint(path: Path) -> Path:
    """A visiontf detection checkpoint of detr_tiny trained on the hand-made set's 3 classes (ids 3, 7, 12)."""
    model = visiontf.create_model("detr_tiny", num_classes=3, **TINY)
    torch.save({
        "state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
        "hyper_parameters": {"_class_path": "visiontf.tasks.detection.detection_task.DetectionTask", "model_name": "detr_tiny",
                             "num_classes": 3, "model_kwargs": TINY},
        "class_names": NAMES, "label_to_cat_id": dict(enumerate(IDS)),
        "preprocess": {"min_size": 64, "max_size": 96}, "epoch": 0,
    }, path)
    return path


def _one_line(proc: subprocess.CompletedProcess | dict, prog: str) -> str:
    code = proc["code"] if isinstance(proc, dict) else proc.returncode
    result = proc if isinstance(proc, dict) else {"stderr": proc.stderr, "stdout": proc.stdout}
    line = error_line(result)
    assert code == 2, (code, result["stderr"][-2000:])
    assert line.startswith(f"{prog}: error: "), line
    return line[len(f"{prog}: error: "):]


def test_light_mistakes_fail_fast_in_one_line(tmp_path):
    """Argument and path mistakes are found before torch is imported: one process each."""
    ckpt = tmp_path / "model.ckpt"
    ckpt.write_bytes(b"\x80\x04 a pickle header")  # only what it looks like matters before loading
    (tmp_path / "model.safetensors").write_bytes(b"x")
    (tmp_path / "notes.json").write_text("{}")
    cases = {
        ("predict.py", "--ckpt_path", tmp_path / "missing.ckpt", "--input", tmp_path, "--output", tmp_path / "o"):
            f"--ckpt_path {tmp_path / 'missing.ckpt'}: checkpoint not found",
        ("predict.py", "--ckpt_path", ckpt, "--input", tmp_path / "missing.jpg", "--output", tmp_path / "o"):
            f"--input {tmp_path / 'missing.jpg'}: no such file or folder",
        ("predict.py", "--ckpt_path", ckpt, "--input", tmp_path, "--output", tmp_path / "o", "--batch_size", "0"):
            "--batch_size 0: must be >= 1",
        ("predict.py", "--ckpt_path", ckpt, "--input", tmp_path, "--output", tmp_path / "o", "--top_k", "-1"):
            "--top_k -1: must be >= 1",
        ("predict.py", "--ckpt_path", ckpt, "--input", tmp_path, "--output", tmp_path / "o", "--device", "foo"):
            "--device foo: use cpu, cuda or cuda:N (or mps)",
        ("predict.py", "--ckpt_path", ckpt, "--input", tmp_path, "--output", tmp_path / "o", "--score_threshold", "2"):
            "--score_threshold 2.0: scores are in [0, 1), so this keeps nothing; give a value in [0, 1)",
        ("predict.py", "--ckpt_path", ckpt, "--input", tmp_path, "--output", tmp_path / "o", "--score_threshold", "nan"):
            "--score_threshold nan: scores are in [0, 1), so this keeps nothing; give a value in [0, 1)",
        ("predict.py", "--ckpt_path", ckpt, "--input", tmp_path, "--output", tmp_path / "o", "--trainer.devices", "2"):
            "predict.py does not take --trainer.devices (a tools/train.py option); use --device (cpu, cuda, cuda:1): "
            "prediction runs on one device",
        ("predict.py", "--ckpt_path", tmp_path / "model.safetensors", "--input", tmp_path, "--output", tmp_path / "o"):
            f"--ckpt_path {tmp_path / 'model.safetensors'}: an exported model, not a Lightning checkpoint; predict with "
            f"tools/predict.py --weights {tmp_path / 'model.safetensors'}, or train from it with "
            f"--model.init_args.pretrained={tmp_path / 'model.safetensors'}",
        ("export.py", "--ckpt_path", tmp_path / "notes.json", "--output", tmp_path / "m.safetensors"):
            f"--ckpt_path {tmp_path / 'notes.json'}: not a PyTorch checkpoint (tools/train.py writes .ckpt files under "
            "<default_root_dir>/checkpoints/)",
        ("eval.py", "--annotations", tmp_path / "missing.json", "--predictions", tmp_path / "notes.json"):
            f"{tmp_path / 'missing.json'}: annotation file not found",
        ("eval.py", f"--annotations={tmp_path / 'missing.json'}", f"--predictions={tmp_path / 'notes.json'}"):
            f"{tmp_path / 'missing.json'}: annotation file not found",
        ("make_synthetic.py", "--task", "detection", "--out", tmp_path):
            f"--out {tmp_path}: the folder is not empty; remove it or give a new folder",
        ("make_synthetic.py", "--task", "detector", "--out", tmp_path / "d"):
            "argument --task: invalid choice: 'detector' (choose from "
            f"{', '.join(repr(t) for t in sorted([*TASKS, 'panoptic', 'photos']))}) (see make_synthetic.py --help)",
        ("make_synthetic.py", "--task", "photos", "--out", tmp_path / "d", "--num_classes", "3"):
            "--num_classes: the photos set has no such setting",
        ("plot_logs.py", tmp_path / "no_run"): f"{tmp_path / 'no_run'}: neither a metrics.csv nor a run folder",
        ("demo.py", "--epochs", "ten"): "argument --epochs: invalid int value: 'ten' (see demo.py --help)",
        # last: the suggestion looks through every task's options, which imports torch
        ("predict.py", "--ckpt_path", ckpt, "--input", tmp_path, "--output", tmp_path / "o", "--score", "0.3"):
            "unknown option --score; did you mean --score_threshold? (see predict.py --help)",
    }
    # one process for all of them (an interpreter start costs more than every case together); each case but
    # the last ends before torch is imported: a case that loads it shows in its own result's `imported` first
    (tmp_path / "runner").mkdir()  # its case and result files stay out of the folders the cases name
    results = run_tools([{"argv": [f"tools/{tool}", *args], "watch_modules": ["torch"]} for tool, *args in cases],
                        tmp_path / "runner")
    for ((tool, *_), expected), result in zip(cases.items(), results):
        assert _one_line(result, tool) == expected
        if "--score" not in result["argv"]:
            assert result["imported"] == [], f"{tool} {result['argv'][1:]}: torch imported before the mistake was found"


@pytest.fixture(scope="module")
def heavy(tmp_path_factory):
    """The cases that import Lightning or build a model, run in one process: {name: (argv, result)}."""
    from visiontf.tasks.detection.detection_synthetic import make_detection_dataset

    tmp = tmp_path_factory.mktemp("cli")
    four_classes = make_detection_dataset(tmp / "four", num_train=2, num_val=2, image_size=(64, 80))["root"]
    same = make_dataset(tmp / "same", "coco")
    ckpt = fake_checkpoint(tmp / "three_classes.ckpt")
    (tmp / "broken.jpg").write_text("not an image")
    from safetensors.torch import save_file

    save_file({"x": torch.zeros(3)}, tmp / "foreign.safetensors")  # no key of any DETR layout
    (tmp / "foreign.json").write_text(json.dumps({"model_name": "detr_tiny", "model_kwargs": {"num_classes": 2}}))
    fit = ["tools/train.py", "fit", "--config", CONFIG]
    predict = ["tools/predict.py", "--ckpt_path", ckpt, "--device", "cpu"]
    data_paths = ["--data.train_images", "images/train", "--data.val_images", "images/val",
                  "--data.init_args.train_ann", "annotations/train.json", "--data.init_args.val_ann", "annotations/val.json"]
    images = same / "images" / "val"
    cases = {
        "bad root": [*fit, "--data.root", tmp / "nope"],
        "abbreviation": [*fit, "--trainer.max_epoch", "3"],
        "bad int": [*fit, "--trainer.max_epochs", "three"],
        "bad choice": [*fit, "--model.init_args.schedule", "linear"],
        "unknown data option": [*fit, "--data.rot", four_classes],
        "missing config": ["tools/train.py", "fit", "--config", tmp / "nope.yaml"],
        "unknown model": [*fit, "--data.root", four_classes, "--model.init_args.model_name", "detr_tinyy"],
        # the data's class count is linked into the task: another one asked for was replaced without a word
        "other num_classes": [*fit, "--data.root", four_classes, "--model.init_args.num_classes", "7"],
        "eval missing ckpt": ["tools/eval.py", "--config", CONFIG, "--data.root", four_classes, "--ckpt_path", tmp / "missing.ckpt"],
        "eval other classes": ["tools/eval.py", "--config", CONFIG, "--data.root", four_classes, "--ckpt_path", ckpt],
        "predict foreign weights": ["tools/predict.py", "--weights", tmp / "foreign.safetensors", "--input", images,
                                    "--output", tmp / "fw"],
        # Lightning refuses these Trainer settings with a MisconfigurationException (a traceback before)
        "devices 0": [*fit, "--data.root", four_classes, "--trainer.devices", "0"],
        "gpu without one": [*fit, "--data.root", four_classes, "--trainer.accelerator", "gpu"],
        # no weights at all: a full table of noise used to be written with exit code 0
        "eval no weights": ["tools/eval.py", "--config", CONFIG, "--data.root", four_classes, "--output", tmp / "noise.json"],
        "validate no weights": ["tools/train.py", "validate", "--config", CONFIG, "--data.root", four_classes],
        "eval random on purpose": ["tools/eval.py", "--config", CONFIG, "--data.root", four_classes, "--allow_random_weights",
                                   "true", "--model.init_args.model_kwargs={arch: {enc_layers: 1, dec_layers: 1, num_queries: 5}}",
                                   "--trainer.enable_progress_bar=false", "--output", tmp / "random.json"],
        "debug flag": [*fit, "--data.root", tmp / "nope", "--debug"],
        "debug env": [*fit, "--data.root", tmp / "nope"],
        # train.py's data overrides in both spellings, old option spellings; classes agree with the checkpoint's
        "predict ok": [*predict, "--config", CONFIG, "--data.root", same, *data_paths, "--input", images,
                       "--output", tmp / "ok", "--score_threshold", "0.0", "--top_k", "2"],
        "predict conflict": [*predict, "--config", CONFIG, "--data.root", four_classes, "--input", images, "--output", tmp / "x"],
        "predict broken image": [*predict, "--input", tmp / "broken.jpg", "--output", tmp / "y"],
        "predict bad root": [*predict, "--config", CONFIG, "--data.root", tmp / "nope", "--input", images, "--output", tmp / "z"],
        # the task options are the adapters': another task's is refused (it was silently ignored before)
        "predict another task's option": [*predict, "--input", images, "--output", tmp / "seg", "--seg_mode", "slide"],
        "predict this task's option": [*predict, "--input", images, "--output", tmp / "min", "--min_size", "48",
                                       "--postprocess.num_top", "3", "--score_threshold", "0.0"],
    }
    env = {"debug env": {"VISIONTF_DEBUG": "1"}}
    results = run_tools([{"argv": argv, "env": env.get(name, {})} for name, argv in cases.items()], tmp)
    return {"tmp": tmp, "ckpt": ckpt, **{name: r for name, r in zip(cases, results)}}


def test_lightning_cli_mistakes_in_one_line_and_debug_shows_the_traceback(heavy):
    tmp, ckpt = heavy["tmp"], heavy["ckpt"]
    expected = {
        "bad root": f"{tmp / 'nope'}: dataset root not found (--data.root)",
        "abbreviation": "unknown option --trainer.max_epoch; did you mean --trainer.max_epochs?",
        "bad int": "--trainer.max_epochs: expected an int, got three",
        "bad choice": "--model.init_args.schedule: expected one of step, cosine, constant, flat_cosine, got linear",
        "unknown data option": "--data.init_args.rot: not an option of CocoDataModule; did you mean root?",
        "missing config": f"--config: File does not exist: '{tmp / 'nope.yaml'}'",
        "unknown model": "unknown model 'detr_tinyy'. Did you mean: detr_tiny,",
        "other num_classes": "--model.init_args.num_classes 7: the data has 4 classes (CocoDataModule reads them from its "
                             "annotations) and the model takes its class count from there; drop the option",
        "eval missing ckpt": f"{tmp / 'missing.ckpt'}: checkpoint not found; {tmp} holds three_classes.ckpt",
        "eval no weights": "validate without --ckpt_path would score the model's random initial weights; give --ckpt_path",
        "validate no weights": "validate without --ckpt_path would score the model's random initial weights",
        "eval other classes": f"{ckpt}: trained for 3 classes, but this run has 4 (from the data); --ckpt_path resumes "
                              f"or evaluates that same model. To fine-tune with a new head, start a new run with "
                              f"`--model.init_args.pretrained={ckpt}` instead of --ckpt_path",
    }
    for name, start in expected.items():
        prog = "eval.py" if name.startswith("eval") else "train.py"
        line = _one_line(heavy[name], prog)
        assert line.startswith(start), (name, line)
    assert not (tmp / "noise.json").exists()
    line = _one_line(heavy["predict foreign weights"], "predict.py")
    assert line.startswith(f"{tmp / 'foreign.safetensors'}: unrecognised DETR checkpoint layout"), line
    for name in ("devices 0", "gpu without one"):
        if name == "gpu without one" and torch.cuda.is_available():
            continue
        assert "Traceback" not in heavy[name]["stderr"] and heavy[name]["code"] == 2, heavy[name]["stderr"][-2000:]
    if not torch.cuda.is_available():  # the fix comes with Lightning's words
        assert _one_line(heavy["gpu without one"], "train.py").endswith(
            "(the config asks for GPUs; on a CPU add --trainer.accelerator cpu --trainer.devices 1 --trainer.strategy auto)")
    assert heavy["eval random on purpose"]["code"] == 0, heavy["eval random on purpose"]["stderr"][-2000:]
    assert "map" in json.loads((tmp / "random.json").read_text())
    for name in ("debug flag", "debug env"):
        assert heavy[name]["code"] == 1 and "Traceback (most recent call last)" in heavy[name]["stderr"]
        assert "DatasetLayoutError" in heavy[name]["stderr"]


def test_predict_takes_data_overrides_keeps_checkpoint_classes_and_hints_fit_predicting(heavy):
    tmp, ckpt = heavy["tmp"], heavy["ckpt"]
    assert heavy["predict ok"]["code"] == 0, heavy["predict ok"]["stderr"][-3000:]
    preds = json.loads((tmp / "ok" / "predictions.json").read_text())
    assert preds and {p["category_id"] for p in preds} <= set(IDS)  # the real ids, through the checkpoint
    assert _one_line(heavy["predict conflict"], "predict.py") == (
        f"--ckpt_path {ckpt} was trained on 3 classes (circle=3, square=7, bar=12) but --config {CONFIG} has 4 classes "
        "(circle=1, square=2, triangle=3, star=5); drop --config (the checkpoint carries its classes), or give the "
        "config it was trained with")
    # reading an image while predicting: the message names the file, without the dataset's hint
    assert _one_line(heavy["predict broken image"], "predict.py") == (
        f"{tmp / 'broken.jpg'}: not a readable image (wrong extension or corrupt header)")
    assert _one_line(heavy["predict bad root"], "predict.py") == f"{tmp / 'nope'}: dataset root not found (--data.root)"


def test_predict_takes_the_options_of_the_models_task_only(heavy):
    assert _one_line(heavy["predict another task's option"], "predict.py") == (
        "--seg_mode: an option of segmentation models, but this is a detection model (its options: --min_size, "
        "--max_size, --postprocess.nms_iou_threshold, --postprocess.nms_class_agnostic, --postprocess.num_top)")
    assert heavy["predict this task's option"]["code"] == 0, heavy["predict this task's option"]["stderr"][-3000:]
    preds = json.loads((heavy["tmp"] / "min" / "predictions.json").read_text())
    per_image = Counter(p["image_id"] for p in preds)  # every query scores above 0: --postprocess.num_top keeps 3
    assert per_image and set(per_image.values()) == {3}, per_image


@pytest.mark.parametrize("setting, words", [({"strategy": "bogus"}, "You selected an invalid strategy name: `strategy='bogus'`"),
                                            ({"accelerator": "bogus"}, "You selected an invalid accelerator name"),
                                            ({"accelerator": "cpu", "devices": "bogus"}, "`devices` selected with")])
def test_a_trainer_setting_lightning_does_not_know_is_one_line_and_a_value_error_elsewhere_is_a_bug(setting, words):
    """``--trainer.strategy bogus`` (or a config's) gave Lightning's ValueError traceback: it is the user's setting,
    named by Lightning, told from a bug by the module that raised it."""
    import lightning.pytorch as pl

    with pytest.raises((ValueError, TypeError)) as caught:
        pl.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False, **setting)
    message = user_message(caught.value)
    assert message is not None and message.startswith(words) and "\n" not in message, message
    try:
        int("bogus")  # a ValueError of the same kind raised anywhere else stays a traceback
    except ValueError as e:
        assert user_message(e) is None


def test_user_message_finds_the_cause_and_leaves_bugs_alone():
    try:
        try:
            raise UsageError("the real cause")
        except UsageError as e:
            raise ValueError("Does not validate against any of the Union subtypes\n  - the real cause") from e
    except ValueError as wrapped:
        assert user_message(wrapped) == "the real cause"
    assert user_message(KeyError("bug")) is None
    assert user_message(ValueError("Does not validate against any of the Union subtypes\n  - a bug")) is None
    worker = UsageError("Caught UsageError in DataLoader worker process 0.\nOriginal Traceback (most recent call last):\n"
                        '  File "x.py", line 1\nvisiontf.errors.UsageError: x.jpg: file not found\n')
    assert user_message(worker) == "x.jpg: file not found"


def test_one_option_style_and_a_dashed_spelling_names_the_right_one():
    from visiontf.cli.predict import predict_parser

    args = predict_parser().parse_args(["--input", "x", "--output", "y", "--score_threshold", "0.7", "--top_k", "3"])
    assert (args.score_threshold, args.top_k) == (0.7, 3)
    with pytest.raises(UsageError, match="did you mean --score_threshold"):
        predict_parser().parse_args(["--input", "x", "--output", "y", "--score-threshold", "0.7"])
    # the tasks' options are the adapters' (the command line names none), listed by task in --help
    args = predict_parser().parse_args(["--input", "x", "--output", "y", "--seg_mode", "slide", "--restore_task", "1"])
    assert (args.seg_mode, args.restore_task) == ("slide", "1")
    with pytest.raises(UsageError, match="did you mean --seg_mode"):
        predict_parser().parse_args(["--input", "x", "--output", "y", "--seg-mode", "slide"])
    assert "segmentation options" in predict_parser().format_help()


class _RunsCode:
    """A pickle that runs a command when unpickled (what weights_only=True must never do)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        import os

        return os.system, (f"touch {self.marker}",)


def test_predict_weights_that_are_a_pickle_or_of_another_shape_are_one_line_errors(tmp_path):
    """``tools/predict.py --weights``: a pickle named .safetensors (a safetensors traceback before), a
    pickle .pth that runs code, and an export whose tensors do not fit the config saved with it (a class
    head of another shape was re-initialised with a warning: predictions from a random head, exit 0).
    (tools/export.py takes --ckpt_path only.)"""
    import pickle
    import shutil

    from PIL import Image
    from safetensors.torch import load_file, save_file

    good = tmp_path / "good.safetensors"
    visiontf.save_model(visiontf.create_model("detr_tiny", num_classes=2, **TINY), good)
    marker = tmp_path / "code_ran"
    (tmp_path / "img").mkdir()
    Image.new("RGB", (64, 48), (90, 30, 10)).save(tmp_path / "img" / "a.jpg")

    def variant(name: str, change: str | None = None, rows: int = 0) -> Path:
        path = tmp_path / name
        if change:  # the export's tensors with one of another shape, beside the export's own config
            state = load_file(good)
            state[change] = torch.zeros(rows, state[change].shape[1])
            save_file(state, path)
        else:
            path.write_bytes(pickle.dumps(_RunsCode(marker)))
        shutil.copy(good.with_suffix(".json"), path.with_suffix(".json"))  # save_model's config file
        return path

    cases = {
        "good": good,
        "pickle named safetensors": variant("pickled.safetensors"),
        "pickle pth": variant("pickled.pth"),
        "class head shape": variant("head.safetensors", "class_embed.weight", 5),
        "other tensor shape": variant("ffn.safetensors", "transformer.encoder.layers.0.mlp.fc1.weight", 7),
    }
    results = run_tools([{"argv": ["tools/predict.py", "--weights", path, "--input", tmp_path / "img", "--output",
                                   tmp_path / f"out{i}", "--device", "cpu"]} for i, path in enumerate(cases.values())],
                        tmp_path)
    r = dict(zip(cases, results))
    assert r["good"]["code"] == 0, r["good"]["stderr"][-2000:]
    p = cases["pickle named safetensors"]
    assert _one_line(r["pickle named safetensors"], "predict.py") == (
        f"{p}: a PyTorch pickle (what torch.save writes), not a safetensors file, although it is named .safetensors; "
        "rename it to pickled.pth (visiontf reads .pth files with weights_only=True: tensors only, never code) or convert "
        "it with safetensors.torch.save_file")
    assert _one_line(r["pickle pth"], "predict.py").startswith(f"{cases['pickle pth']}: refused to load with weights_only=True")
    for name, tensor in (("class head shape", "class_embed.weight (5, 128) -> (3, 128)"),
                         ("other tensor shape", "transformer.encoder.layers.0.mlp.fc1.weight (7, 128) -> (512, 128)")):
        line = _one_line(r[name], "predict.py")
        assert line.startswith(f"{cases[name]}: 1 tensor(s) have another shape than in detr_tiny built from the config "
                               "saved with them"), line
        assert tensor in line and "export the model again with tools/export.py" in line, line
    assert not marker.exists(), "unpickling ran code"
