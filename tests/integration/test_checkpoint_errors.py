"""Checkpoint errors name the file and the fix, through the real command lines,
run in-process (``make_cli`` / ``eval_main`` / ``predict_main`` / ``export_main``).

Cost: one 1-epoch fit of a 1-block ViT on 3x4 tiny images (module fixture), one fine-tuning fit,
and a few refused commands that stop before any step: about 15 s on 2 shared cores.
"""
from __future__ import annotations

import json
import logging
import re
import shutil
import warnings
from pathlib import Path

import pytest
import torch

from visiontf.cli import eval_main, export_main, predict_main
from visiontf.cli.train import make_cli
from visiontf.tasks.checkpoints import CheckpointError, check_checkpoint_fits, resolve_checkpoint

CONFIG = "configs/vit/vit_tiny_synthetic.yaml"
TINY = "{img_size: 32, patch_size: 8, depth: 1, embed_dim: 48, num_heads: 3}"


def _args(data: Path, run: Path, *extra: str) -> list[str]:
    return ["--config", CONFIG, f"--data.init_args.root={data}", "--data.init_args.image_size=32",
            "--data.init_args.num_workers=0", "--data.init_args.batch_size=4", f"--model.init_args.model_kwargs={TINY}",
            f"--trainer.default_root_dir={run}", "--trainer.max_epochs=1", "--trainer.enable_progress_bar=false",
            "--trainer.logger=false", "--trainer.enable_model_summary=false", *extra]


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A 3-class run trained with ``fit --ckpt_path last`` on an empty run folder (the requeue case)."""
    from visiontf.tasks.classification.classification_synthetic import make_classification_dataset

    tmp = tmp_path_factory.mktemp("ckpt_errors")
    data = make_classification_dataset(tmp / "data3", num_train=4, num_val=2, num_classes=3, image_size=32)
    records = _Records()
    logger = logging.getLogger("visiontf.tasks.checkpoints")
    logger.addHandler(records)
    level = logger.level
    logger.setLevel(logging.INFO)  # setLevel, not .level =: it also clears the logger's isEnabledFor cache
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            make_cli(["fit", *_args(data, tmp / "run"), "--ckpt_path=last"])
    finally:
        logger.removeHandler(records)
        logger.setLevel(level)
    return {"tmp": tmp, "data": data, "ckpt": tmp / "run" / "checkpoints" / "last.ckpt", "log": records.lines,
            "warnings": [str(w.message) for w in caught]}


def _one_line_error(capsys, main, argv) -> str:
    """Run a tool's main in-process: a user mistake ends as exit code 2 and one ``tool: error: ...`` line."""
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) >= 1 and ": error: " in err[-1], err
    return err[-1].split(": error: ", 1)[1]


def test_fit_with_last_and_no_checkpoint_starts_fresh_with_one_info_line(trained):
    fresh = [line for line in trained["log"] if "starting a fresh run" in line]
    assert len(fresh) == 1 and str(trained["tmp"] / "run" / "checkpoints") in fresh[0]
    assert not [w for w in trained["warnings"] if "no last checkpoint available" in w], "Lightning's misleading hint"
    assert trained["ckpt"].is_file()


def test_eval_predict_export_with_last_and_nothing_there_are_errors_not_random_weights(trained, tmp_path, capsys):
    typo = tmp_path / "rnu"
    stats = tmp_path / "stats.json"
    line = _one_line_error(capsys, eval_main, [*_args(trained["data"], typo), "--ckpt_path=last", "--output", str(stats)])
    assert re.search(r"no last\.ckpt in .*rnu.*checkpoints.*does not exist", line), line
    assert "nothing was evaluated" in line and not stats.exists()
    config = tmp_path / "c.yaml"
    config.write_text(f"trainer:\n  default_root_dir: {typo}\n")
    assert "no last.ckpt in" in _one_line_error(capsys, predict_main, [
        "--config", str(config), "--ckpt_path", "last", "--input", str(trained["data"]), "--output", str(tmp_path / "out")])
    assert "no last.ckpt in" in _one_line_error(capsys, export_main, [
        "--config", str(config), "--ckpt_path", "last", "--output", str(tmp_path / "m.safetensors")])
    assert "no run folder" in _one_line_error(capsys, export_main, [
        "--ckpt_path", "last", "--output", str(tmp_path / "m.safetensors")])
    # and "last" does resolve where the run is
    assert resolve_checkpoint("last", trained["ckpt"].parent) == str(trained["ckpt"])


def test_truncated_checkpoint_is_corrupt_or_incomplete_naming_the_file(trained, tmp_path, capsys):
    cut = tmp_path / "cut.ckpt"
    data = trained["ckpt"].read_bytes()
    cut.write_bytes(data[: len(data) // 2])
    expected = rf"{cut}: corrupt or incomplete \({len(data) // 2:,} bytes\)"
    assert re.search(expected, _one_line_error(capsys, eval_main, [*_args(trained["data"], tmp_path / "run"),
                                                                   f"--ckpt_path={cut}"]))
    with pytest.raises(CheckpointError, match=expected):
        make_cli(["fit", *_args(trained["data"], tmp_path / "run"), f"--ckpt_path={cut}"])
    assert re.search(expected, _one_line_error(capsys, export_main, ["--ckpt_path", str(cut), "--output",
                                                                     str(tmp_path / "m.safetensors")]))
    # a damaged middle (the archive's directory intact) fails in torch.load, with the same message
    from visiontf.io.weights import WeightsError, safe_torch_load

    bad = tmp_path / "bad.ckpt"
    mid = len(data) // 2
    bad.write_bytes(data[:mid] + bytes(4096) + data[mid + 4096:])
    with pytest.raises(WeightsError, match=rf"{bad}: corrupt or incomplete"):
        safe_torch_load(bad)
    # a typo in an explicit path is an error for fit too (only "last" may start fresh)
    with pytest.raises(CheckpointError, match="checkpoint not found"):
        make_cli(["fit", *_args(trained["data"], tmp_path / "run"), f"--ckpt_path={tmp_path / 'lats.ckpt'}"])


def test_other_number_of_classes_points_to_pretrained_and_that_fine_tunes(trained, tmp_path, capsys):
    from visiontf.tasks.classification.classification_synthetic import make_classification_dataset

    data4 = make_classification_dataset(tmp_path / "data4", num_train=4, num_val=2, num_classes=4, image_size=32)
    with pytest.raises(CheckpointError, match=r"trained for 3 classes, but this run has 4.*--model.init_args.pretrained="):
        make_cli(["fit", *_args(data4, tmp_path / "run"), f"--ckpt_path={trained['ckpt']}"])
    assert "trained for 3 classes" in _one_line_error(capsys, eval_main,
                                                       [*_args(data4, tmp_path / "run"), f"--ckpt_path={trained['ckpt']}"])
    # the fix the message names works: a new head on the checkpoint's weights
    make_cli(["fit", *_args(data4, tmp_path / "ft"), f"--model.init_args.pretrained={trained['ckpt']}"])
    tuned = torch.load(tmp_path / "ft" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert tuned["state_dict"]["model.head.weight"].shape[0] == 4


def test_a_fine_tuned_run_needs_only_its_checkpoint_once_the_start_file_is_gone(trained, tmp_path, capsys):
    """A run fine-tuned from a file (``pretrained``) saves that path with its hyper-parameters. Evaluating, resuming
    or loading the run's checkpoint rebuilt the task with it and read the file again: once moved (another machine,
    a cleaned download folder) every one of them stopped with ``weights file not found``. The checkpoint holds every
    weight, so the file is not read any more."""
    from visiontf.tasks.classification.classification_task import ClassificationTask

    start = tmp_path / "start.ckpt"
    shutil.copy(trained["ckpt"], start)
    make_cli(["fit", *_args(trained["data"], tmp_path / "ft"), f"--model.init_args.pretrained={start}"])
    tuned = tmp_path / "ft" / "checkpoints" / "last.ckpt"
    saved = torch.load(tuned, map_location="cpu", weights_only=True)
    assert saved["hyper_parameters"]["pretrained"] == str(start)  # the run's record keeps where it started
    start.unlink()
    capsys.readouterr()
    assert eval_main([*_args(trained["data"], tmp_path / "ft"), f"--ckpt_path={tuned}"]) == 0
    assert "weights file not found" not in capsys.readouterr().err
    task = ClassificationTask.load_from_checkpoint(tuned)
    assert all(torch.equal(task.state_dict()[k], v) for k, v in saved["state_dict"].items())
    make_cli(["fit", *_args(trained["data"], tmp_path / "ft"), "--trainer.max_epochs=2", "--ckpt_path=last"])
    resumed = torch.load(tuned, map_location="cpu", weights_only=True)
    assert resumed["epoch"] == saved["epoch"] + 1 and resumed["hyper_parameters"]["pretrained"] == str(start)
    # loading only what fits (strict=False) still starts from the file: it fills what the checkpoint lacks
    with pytest.raises(FileNotFoundError, match="start.ckpt"):
        ClassificationTask.load_from_checkpoint(tuned, strict=False)


def test_load_from_checkpoint_with_another_class_count_names_the_file_and_the_python_fix(trained):
    """The check ``--ckpt_path`` runs, from Python: it named "the checkpoint" and the CLI's options."""
    from visiontf.tasks.classification.classification_task import ClassificationTask

    classes = torch.load(trained["ckpt"], map_location="cpu", weights_only=True)["hyper_parameters"]["num_classes"]
    with pytest.raises(CheckpointError) as refused:
        ClassificationTask.load_from_checkpoint(trained["ckpt"], num_classes=classes + 2)
    message = str(refused.value)
    assert message.startswith(f"{trained['ckpt']}: trained for {classes} classes, but this run has {classes + 2} "
                              "(the arguments given); load_from_checkpoint resumes or evaluates"), message
    assert f"pretrained={str(trained['ckpt'])!r} instead of load_from_checkpoint" in message and "--" not in message


def test_same_class_count_with_other_classes_is_refused_naming_both_tables(trained, tmp_path, capsys):
    """Same count, other classes: every output would be scored (or trained on) as another category, silently."""
    renamed = tmp_path / "renamed"
    shutil.copytree(trained["data"], renamed)
    for split in ("train", "val"):
        first = sorted((renamed / split).iterdir())[1]
        first.rename(first.with_name(first.name.split("_")[0] + "_other"))
    line = _one_line_error(capsys, eval_main, [*_args(renamed, tmp_path / "run"), f"--ckpt_path={trained['ckpt']}"])
    assert re.search(r"last\.ckpt: trained on 3 classes \(00_\w+, 01_\w+, 02_\w+\), but this run's data has 3 "
                     r"classes \(00_\w+, 01_other, 02_\w+\);.*--model\.init_args\.pretrained=", line), line
    with pytest.raises(CheckpointError, match="01_other"):  # resuming too
        make_cli(["fit", *_args(renamed, tmp_path / "run"), f"--ckpt_path={trained['ckpt']}"])
    # detection: the same names under other category ids (a COCO file with ids renumbered) are other classes too
    ckpt = {"hyper_parameters": {"model_name": "detr_tiny", "num_classes": 2}, "task": "detection",
            "class_names": ["cat", "dog"], "label_to_cat_id": {0: 1, 1: 2}}
    fits = dict(task="detection", model_name="detr_tiny", num_classes=2, class_names=["cat", "dog"])
    check_checkpoint_fits(ckpt, "d.ckpt", **fits, label_to_cat_id={0: 1, 1: 2})
    with pytest.raises(CheckpointError, match=r"d\.ckpt: trained on 2 classes \(cat=1, dog=2\), but the data has 2 "
                                              r"classes \(cat=17, dog=18\)"):
        check_checkpoint_fits(ckpt, "d.ckpt", **fits, label_to_cat_id={0: 17, 1: 18})


def test_checkpoint_of_another_task_or_model_is_refused_before_loading(trained):
    ckpt = torch.load(trained["ckpt"], map_location="cpu", weights_only=True)
    assert ckpt["task"] == "classification"
    with pytest.raises(CheckpointError, match=r"x\.ckpt: a classification checkpoint \(vit_tiny_patch16_224\), but this "
                                              r"config builds a detection model \(detr_tiny\)"):
        check_checkpoint_fits(ckpt, "x.ckpt", task="detection", model_name="detr_tiny", num_classes=3)
    with pytest.raises(CheckpointError, match="a checkpoint of vit_tiny_patch16_224, but this config builds vit_small"):
        check_checkpoint_fits(ckpt, "x.ckpt", task="classification", model_name="vit_small_patch16_224", num_classes=3)
    del ckpt["task"]  # checkpoints written before visiontf saved the task: found through the registry tags
    with pytest.raises(CheckpointError, match="a classification checkpoint"):
        check_checkpoint_fits(ckpt, "x.ckpt", task="segmentation", model_name="setr_naive_vit_tiny_patch16", num_classes=3)


@pytest.mark.slow
def test_eval_with_a_detection_config_refuses_a_classification_checkpoint(trained, tmp_path, capsys):
    """The tester's case: the checkpoint of another task used to load into the wrong model and fail
    deep inside; now the error names the file and both tasks, before any weight is copied."""
    from visiontf.tasks.detection.detection_synthetic import make_detection_dataset

    det = make_detection_dataset(tmp_path / "det", num_train=2, num_val=2, image_size=(64, 64))["root"]
    args = ["--config", "configs/detr/detr_tiny_shapes.yaml", f"--data.init_args.root={det}",
            "--data.init_args.num_workers=0", f"--trainer.default_root_dir={tmp_path / 'run'}", "--trainer.logger=false",
            "--trainer.enable_progress_bar=false", f"--ckpt_path={trained['ckpt']}"]
    assert re.search(rf"{trained['ckpt']}: a classification checkpoint .* detection model",
                     _one_line_error(capsys, eval_main, args))


def test_resolver_finds_best_and_hpc_files_and_names_broken_links(tmp_path):
    """Lightning's keywords become files before anything reads them: ``best`` is what the run's last.ckpt
    records (a file named ``best`` in the working folder is never read), ``hpc`` the newest hpc_ckpt_<N>.ckpt."""
    assert resolve_checkpoint(None) is None
    with pytest.raises(CheckpointError, match="no last.ckpt in .* to read the run's best checkpoint from"):
        resolve_checkpoint("best", tmp_path)
    state = {"state_dict": {"w": torch.zeros(1)}}
    torch.save(state, tmp_path / "epoch001.ckpt")
    torch.save({**state, "callbacks": {"ModelCheckpoint{}": {"best_model_path": "/elsewhere/old_run/epoch001.ckpt"}}},
               tmp_path / "last.ckpt")
    assert resolve_checkpoint("best", tmp_path) == str(tmp_path / "epoch001.ckpt")  # a moved run folder: found by name
    # a recorded best elsewhere is never read: a file outside the folder, or one reached through ".."
    outside = tmp_path.parent / f"{tmp_path.name}_outside.ckpt"
    torch.save(state, outside)
    for recorded in (str(outside), f"{tmp_path}/../{outside.name}"):
        torch.save({**state, "callbacks": {"ModelCheckpoint{}": {"best_model_path": recorded}}}, tmp_path / "last.ckpt")
        with pytest.raises(CheckpointError, match=r"records the best checkpoint .*outside the run's checkpoint folder"):
            resolve_checkpoint("best", tmp_path)
    outside.unlink()
    torch.save({**state, "callbacks": {"ModelCheckpoint{}": {"best_model_path": ""}}}, tmp_path / "last.ckpt")
    with pytest.raises(CheckpointError, match="records no best checkpoint"):
        resolve_checkpoint("best", tmp_path)
    with pytest.raises(CheckpointError, match="no hpc_ckpt_<N>.ckpt in"):
        resolve_checkpoint("hpc", tmp_path, root_dir=tmp_path)
    assert resolve_checkpoint("hpc", tmp_path, root_dir=tmp_path, for_fit=True) is None  # a requeued job's first start
    for n in (2, 10):
        torch.save(state, tmp_path / f"hpc_ckpt_{n}.ckpt")
    assert resolve_checkpoint("hpc", tmp_path, root_dir=tmp_path) == str(tmp_path / "hpc_ckpt_10.ckpt")
    for name in ("last.ckpt", "epoch001.ckpt", "hpc_ckpt_2.ckpt", "hpc_ckpt_10.ckpt"):
        (tmp_path / name).unlink()
    link = tmp_path / "last.ckpt"
    link.symlink_to(tmp_path / "gone.ckpt")
    with pytest.raises(CheckpointError, match="broken symbolic link"):
        resolve_checkpoint(link)
    (tmp_path / "d").mkdir()
    with pytest.raises(CheckpointError, match="is a folder"):
        resolve_checkpoint(tmp_path / "d")
    shutil.rmtree(tmp_path / "d")


def test_cli_resumes_a_moved_run_folder_onto_its_own_last_checkpoint_atomically(trained, tmp_path):
    """tools/train.py's trainer: LastAndBestCheckpoint and the atomic writer; a copied run folder resumes
    with --ckpt_path last and overwrites its last.ckpt (no last-v1.ckpt), keeping its best checkpoint."""
    from visiontf.callbacks import LastAndBestCheckpoint
    from visiontf.callbacks.checkpoint_io import AtomicCheckpointIO

    moved = tmp_path / "moved"
    shutil.copytree(trained["tmp"] / "run", moved)
    before = sorted(p.name for p in (moved / "checkpoints").iterdir())
    cli = make_cli(["fit", *_args(trained["data"], moved), "--trainer.max_epochs=2", "--ckpt_path=last"])
    assert isinstance(cli.trainer.strategy.checkpoint_io, AtomicCheckpointIO)
    assert isinstance(cli.trainer.checkpoint_callback, LastAndBestCheckpoint)
    after = sorted(p.name for p in (moved / "checkpoints").iterdir())
    assert "last.ckpt" in after and not [n for n in after if n.startswith("last-v")], after
    assert torch.load(moved / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["global_step"] == 2
    best = cli.trainer.checkpoint_callback.best_model_path
    assert best.startswith(str(moved)), best  # tracked in the new folder, not the old one
    assert len(after) <= len(before) + 1


@pytest.mark.slow
def test_eval_with_the_dino_config_refuses_a_detr_tiny_checkpoint_unless_asked(tmp_path, capsys):
    """LightningCLI merges the checkpoint's hyper-parameters into the config: a detr_tiny checkpoint with
    the dino_tiny recipe's config built detr_tiny and scored it silently at DINO's evaluation size
    (val_size 224, not 128). Now one line names both models and the fix; naming the checkpoint's model
    on the command line says it is meant, and runs."""
    import json

    from visiontf.tasks.detection.detection_synthetic import make_detection_dataset

    det = make_detection_dataset(tmp_path / "det", num_train=2, num_val=2, image_size=(64, 64))["root"]
    common = [f"--data.init_args.root={det}", "--data.init_args.num_workers=0", "--data.init_args.batch_size=2",
              "--trainer.devices=1", "--trainer.strategy=auto", "--trainer.precision=32-true", "--trainer.logger=false",
              "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]
    make_cli(["fit", "--config", "configs/detr/detr_tiny_shapes.yaml", *common, "--trainer.max_steps=1",
              "--trainer.max_epochs=1", "--trainer.num_sanity_val_steps=0", "--checkpoint.monitor=null",
              f"--trainer.default_root_dir={tmp_path / 'detr'}"])
    ckpt = tmp_path / "detr" / "checkpoints" / "last.ckpt"
    dino = "configs/deformable_detr/deformable_detr_tiny_shapes.yaml"
    args = ["--config", dino, *common, f"--trainer.default_root_dir={tmp_path / 'eval'}", f"--ckpt_path={ckpt}",
            "--output", str(tmp_path / "stats.json")]
    message = _one_line_error(capsys, eval_main, args)
    assert message.startswith(f"{ckpt}: a checkpoint of detr_tiny, but the config ({dino}) builds dino_tiny"), message
    assert "use the config the checkpoint was trained with" in message
    assert "--model.init_args.model_name=detr_tiny" in message
    assert not (tmp_path / "stats.json").exists()

    assert eval_main([*args, "--model.init_args.model_name=detr_tiny"]) == 0
    assert "val/mAP" in json.loads((tmp_path / "stats.json").read_text())


def test_the_task_check_reads_what_the_allow_list_takes(tmp_path):
    """A checkpoint whose data-module hyper-parameters hold a pathlib path (Lightning stores them as given)
    is of its task; the task check once read it with a plain torch.load, which refused the path."""
    from visiontf.io.weights import safe_torch_load
    from visiontf.tasks.checkpoints import check_checkpoint_task, checkpoint_arguments
    from visiontf.tasks.classification.classification_task import ClassificationTask
    from visiontf.tasks.detection.detection_task import DetectionTask

    path = tmp_path / "paths.ckpt"
    torch.save({"state_dict": {}, "hyper_parameters": {"model_name": "detr_tiny", "num_classes": 3},
                "datamodule_hyper_parameters": {"root": Path("data/shapes")}, "task": "detection"}, path)
    ckpt = safe_torch_load(path)
    check_checkpoint_task(ckpt, path, DetectionTask)
    assert checkpoint_arguments(ckpt, path).data_arguments == {"root": Path("data/shapes")}
    with pytest.raises(CheckpointError, match="a detection checkpoint"):
        check_checkpoint_task(ckpt, path, ClassificationTask)


def test_a_checkpoint_naming_a_file_outside_its_folder_is_refused_before_resuming(trained, tmp_path, capsys):
    """tools/train.py fit resuming from a checkpoint whose callback state names a file outside the run's folder (which
    Lightning would delete when replacing it): one line naming the file and the field, exit code 2, nothing deleted."""
    from visiontf.cli.train import train_main

    run = tmp_path / "run"
    shutil.copytree(trained["tmp"] / "run", run)
    folder = run / "checkpoints"
    ckpt = torch.load(folder / "last.ckpt", map_location="cpu", weights_only=True)
    [key] = [k for k in ckpt["callbacks"] if k.startswith("LastAndBestCheckpoint")]
    state = ckpt["callbacks"][key]
    victim = Path(state["dirpath"]).parents[1] / f"victim_of_{tmp_path.name}.txt"
    victim.write_text("kept")
    state["last_model_path"] = f"{state['dirpath']}/../../{victim.name}"
    hostile = tmp_path / "hostile.ckpt"
    torch.save(ckpt, hostile)
    line = _one_line_error(capsys, train_main, ["fit", *_args(trained["data"], run), "--trainer.max_epochs=2",
                                                f"--ckpt_path={hostile}"])
    assert line.startswith(f"{hostile}: callbacks[") and "].last_model_path is" in line, line
    assert "outside the checkpoint folder" in line and victim.read_text() == "kept"
    victim.unlink()


def test_resuming_from_weights_with_nan_is_one_line_naming_the_tensor(trained, tmp_path, capsys):
    """A checkpoint of a diverged run (NaN weights) resumed and then failed at its first steps with a
    NonFiniteLossError traceback; it is refused before training, as evaluation refuses it."""
    from visiontf.cli.train import train_main

    ckpt = torch.load(trained["ckpt"], map_location="cpu", weights_only=True)
    name = next(k for k, v in ckpt["state_dict"].items() if v.is_floating_point() and v.dim() == 2)
    ckpt["state_dict"][name] = torch.full_like(ckpt["state_dict"][name], float("nan"))
    torch.save(ckpt, tmp_path / "diverged.ckpt")
    line = _one_line_error(capsys, train_main, ["fit", *_args(trained["data"], tmp_path / "run"), "--trainer.max_epochs=2",
                                                f"--ckpt_path={tmp_path / 'diverged.ckpt'}"])
    assert re.search(rf"--ckpt_path .*diverged\.ckpt: tensor '{re.escape(name)}' has \d+ NaN/infinite value\(s\)", line), line


@pytest.mark.parametrize("edit, words", [
    (lambda t: torch.full_like(t, float("nan")), r"has \d+ NaN/infinite value\(s\)"),
    (lambda t: t.to(torch.int64), r"is torch\.int64 where the model holds torch\.float32"),
    (lambda t: torch.empty(t.shape, device="meta"), r"is a meta tensor, without values"),
    (lambda t: t.to_sparse(), r"is torch\.sparse_coo"),
    (lambda t: "weights", r"is a str, where the model holds a tensor|is a str, not a tensor"),
], ids=["nan", "int64", "meta", "sparse", "str"])
def test_weights_no_trained_model_holds_are_refused_by_every_loader_naming_the_tensor(trained, tmp_path, capsys, edit, words):
    """The task's own load_from_checkpoint took NaN weights, and cast integer ones, without a word; meta, sparse and
    non-tensor values gave tracebacks from deep inside the loaders. Each loader now names the file and the tensor."""
    from visiontf.cli.train import train_main
    from visiontf.io.weights import WeightsError
    from visiontf.tasks.checkpoints import load_checkpoint_model
    from visiontf.tasks.classification.classification_task import ClassificationTask

    ckpt = torch.load(trained["ckpt"], map_location="cpu", weights_only=True)
    name = next(k for k, v in ckpt["state_dict"].items() if v.is_floating_point() and v.dim() == 2)
    ckpt["state_dict"][name] = edit(ckpt["state_dict"][name])
    bad = tmp_path / "odd.ckpt"
    torch.save(ckpt, bad)
    where = rf"odd\.ckpt: (tensor )?'{re.escape(name)}' ({words})"
    with pytest.raises(WeightsError, match=where):
        ClassificationTask.load_from_checkpoint(bad)
    with pytest.raises((WeightsError, CheckpointError), match=rf"odd\.ckpt: .*({words})"):
        load_checkpoint_model(bad)
    line = _one_line_error(capsys, train_main, ["fit", *_args(trained["data"], tmp_path / "run"), "--trainer.max_epochs=2",
                                                f"--ckpt_path={bad}"])
    assert re.search(rf"odd\.ckpt.*({words})", line), line


def test_resuming_an_optimizer_state_of_other_shapes_is_one_line_before_any_step(trained, tmp_path, capsys):
    """torch's fused AdamW stepping over an ``exp_avg`` smaller than its parameter writes past the tensor (the process
    aborts with heap corruption): the resumed state is compared with the run's optimizer before Lightning loads it."""
    from visiontf.cli.train import train_main

    ckpt = torch.load(trained["ckpt"], map_location="cpu", weights_only=True)
    [state] = ckpt["optimizer_states"]
    assert state["param_groups"][0].get("fused"), "the config's AdamW is expected to be torch's fused one"
    index, param_state = next((i, s) for i, s in state["state"].items() if s["exp_avg"].dim() == 2)
    param_state["exp_avg"] = param_state["exp_avg"][:1].clone()
    torch.save(ckpt, tmp_path / "other_shapes.ckpt")
    line = _one_line_error(capsys, train_main, ["fit", *_args(trained["data"], tmp_path / "run"), "--trainer.max_epochs=2",
                                                f"--ckpt_path={tmp_path / 'other_shapes.ckpt'}"])
    assert re.fullmatch(rf".*other_shapes\.ckpt: optimizer_states\[0\]\['state'\]\[{index}\]\['exp_avg'\] is a floating "
                        r"tensor of shape \(1, \d+\), where this run needs a floating tensor of its parameter's shape "
                        r"\(\d+, \d+\); resume from a checkpoint this config wrote .*", line), line
    assert not (tmp_path / "run" / "checkpoints").exists() or not list((tmp_path / "run" / "checkpoints").glob("*.ckpt"))


def test_resuming_an_optimizer_moment_of_one_repeated_value_is_one_line(trained, tmp_path, capsys):
    """The parameter's shape, but one float of memory behind it (a zero-stride view): the fused step wrote past it as
    it did past a smaller tensor. Refused where the file is read."""
    from visiontf.cli.train import train_main

    ckpt = torch.load(trained["ckpt"], map_location="cpu", weights_only=True)
    index, param_state = next((i, s) for i, s in ckpt["optimizer_states"][0]["state"].items() if s["exp_avg"].dim() == 2)
    param_state["exp_avg"] = torch.zeros(1).expand(param_state["exp_avg"].shape)
    torch.save(ckpt, tmp_path / "repeated.ckpt")
    line = _one_line_error(capsys, train_main, ["fit", *_args(trained["data"], tmp_path / "run"), "--trainer.max_epochs=2",
                                                f"--ckpt_path={tmp_path / 'repeated.ckpt'}"])
    assert re.fullmatch(rf".*repeated\.ckpt: the tensor at \['optimizer_states'\]\[0\]\['state'\]\[{index}\]\['exp_avg'\] "
                        r"\(shape \(\d+, \d+\), strides \(0, 0\)\) claims \d+ bytes of values but holds 4: .*", line), line


def test_predicting_with_a_checkpoint_whose_preprocess_is_vast_is_one_line(trained, tmp_path, capsys):
    """A checkpoint's preprocess of 10000 x 10000 pixels kept the ViT's prediction of one small image running for many
    minutes (a helper's audit: 14 minutes on 2 cores, 3.7 GB, then killed)."""
    ckpt = torch.load(trained["ckpt"], map_location="cpu", weights_only=True)
    ckpt["preprocess"]["input_size"] = [3, 10000, 10000]
    torch.save(ckpt, tmp_path / "vast.ckpt")
    line = _one_line_error(capsys, predict_main, ["--ckpt_path", str(tmp_path / "vast.ckpt"), "--input",
                                                  str(trained["data"]), "--output", str(tmp_path / "out")])
    assert re.fullmatch(r".*vast\.ckpt: its saved preprocess: input_size is \(3, 10000, 10000\): each size is 1 to 8192 "
                        r"pixels", line), line


def test_predicting_with_class_names_that_do_not_fit_the_model_names_the_file_not_a_config(trained, tmp_path, capsys):
    """A checkpoint (or an export's labels file) whose class_names disagree in number with its own model: the error
    once blamed a ``--config None`` nobody gave (a checkpoint) or was a traceback (an export)."""
    from visiontf.io.weights import labels_path

    ckpt = torch.load(trained["ckpt"], map_location="cpu", weights_only=True)
    ckpt["class_names"] = ["a", "b"]
    torch.save(ckpt, tmp_path / "two.ckpt")
    out = ["--input", str(trained["data"]), "--output", str(tmp_path / "out")]
    line = _one_line_error(capsys, predict_main, ["--ckpt_path", str(tmp_path / "two.ckpt"), *out])
    assert re.fullmatch(r"--ckpt_path .*two\.ckpt: its saved class_names hold 2 names but its model has 3 classes; .*", line), line
    weights = tmp_path / "m.safetensors"
    assert export_main(["--ckpt_path", str(trained["ckpt"]), "--output", str(weights)]) == 0
    labels = json.loads(labels_path(weights).read_text())
    labels_path(weights).write_text(json.dumps({**labels, "class_names": ["a", "b"]}))
    line = _one_line_error(capsys, predict_main, ["--weights", str(weights), *out])
    assert re.fullmatch(r"--weights .*m\.safetensors: its saved class_names hold 2 names but its model has 3 classes; .*", line), line


def test_a_checkpoint_whose_settings_build_a_vast_model_is_refused_before_building_by_every_loader(trained, tmp_path, capsys):
    """``embed_dim`` 60000 beside a tiny ViT's weights: eval and fit built the model (tens of GB, or the allocator's
    traceback) before any comparison; predict and export refused it. Every loader now refuses it unbuilt."""
    from visiontf.cli.train import train_main
    from visiontf.tasks.classification.classification_task import ClassificationTask

    ckpt = torch.load(trained["ckpt"], map_location="cpu", weights_only=True)
    ckpt["hyper_parameters"]["model_kwargs"] = {**ckpt["hyper_parameters"]["model_kwargs"], "embed_dim": 60000}
    torch.save(ckpt, tmp_path / "vast_model.ckpt")
    refusal = r"vast_model\.ckpt: its saved settings build \S+ with [\d,]+ values, but the file holds [\d,]+"
    with pytest.raises(CheckpointError, match=refusal):
        ClassificationTask.load_from_checkpoint(tmp_path / "vast_model.ckpt")
    for main, argv in ((eval_main, _args(trained["data"], tmp_path / "run")),
                       (train_main, ["fit", *_args(trained["data"], tmp_path / "run"), "--trainer.max_epochs=2"])):
        line = _one_line_error(capsys, main, [*argv, f"--ckpt_path={tmp_path / 'vast_model.ckpt'}"])
        assert re.search(refusal, line), line
