"""Experiment trackers through ``--trainer.logger``: a Weights & Biases run in offline mode and an MLflow run in
a local file store, together in one fit of the tiny DETR, hold the metrics, the hyper-parameters, the per-class
tables, the prediction pictures, the readout pictures and the checkpoint.

Nothing may reach the network: W&B runs offline (``offline: true`` and ``WANDB_MODE=offline``) with every
folder of its own (``WANDB_DIR``, cache, data, config) under the test's temporary folder, and the
subprocess gets a proxy that does not exist, so that any connection attempt would fail rather than leave.
MLflow >= 3.2 sends usage telemetry unless ``MLFLOW_DISABLE_TELEMETRY=true`` (or ``DO_NOT_TRACK=true``): both set.
MLflow >= 3 refuses a ``file:`` store unless ``MLFLOW_ALLOW_FILE_STORE=true`` (it is "in maintenance
mode"; ``sqlite:///`` needs the full ``mlflow`` package and SQLAlchemy, which ``mlflow-skinny`` leaves out).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from ddp_utils import run, subprocess_env
from test_ddp import DET_CONFIG, NUM_VAL, _det_overrides, _prepare_val_split

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tracked(tmp_path_factory) -> dict:
    from visiontf.tasks.detection.detection_synthetic import make_detection_dataset

    tmp = tmp_path_factory.mktemp("trackers")
    paths = make_detection_dataset(tmp / "data", num_train=8, num_val=NUM_VAL, image_size=(64, 64), num_classes=2)
    _prepare_val_split(paths["val_images"], paths["val_ann"])
    wandb_home = tmp / "wandb_home"
    env = subprocess_env(
        WANDB_MODE="offline", WANDB_DIR=str(wandb_home / "dir"), WANDB_CACHE_DIR=str(wandb_home / "cache"),
        WANDB_DATA_DIR=str(wandb_home / "data"), WANDB_CONFIG_DIR=str(wandb_home / "config"), WANDB_SILENT="true",
        MLFLOW_ALLOW_FILE_STORE="true", MLFLOW_DISABLE_TELEMETRY="true", DO_NOT_TRACK="true",
        HTTP_PROXY="http://127.0.0.1:9", HTTPS_PROXY="http://127.0.0.1:9", NO_PROXY="127.0.0.1,localhost")
    (wandb_home / "dir").mkdir(parents=True)
    run(["tools/train.py", "fit", "--config", DET_CONFIG, *_det_overrides(paths["root"]),
         "--trainer.max_epochs=1", "--trainer.limit_train_batches=2", "--trainer.check_val_every_n_epoch=1",
         "--model.init_args.warmup_steps=0", "--checkpoint.monitor=val/mAP", "--checkpoint.mode=max",
         f"--trainer.default_root_dir={tmp / 'run'}", "--trainer.enable_progress_bar=false",
         "--readouts.pictures_every_n_epochs=1",
         "--trainer.logger+=WandbLogger", "--trainer.logger.offline=true", f"--trainer.logger.save_dir={tmp / 'wandb'}",
         "--trainer.logger.project=visiontf-test",
         "--trainer.logger+=MLFlowLogger", f"--trainer.logger.tracking_uri=file:{tmp / 'mlruns'}",
         "--trainer.logger.experiment_name=visiontf-test", "--trainer.logger.log_model=true",
         "--trainer.callbacks+=visiontf.callbacks.LogPredictionImages", "--trainer.callbacks.num_images=2",
         "--trainer.callbacks+=visiontf.callbacks.WandbCheckpoints"], timeout=600, env=env)
    per_class = json.loads((tmp / "run" / "readouts" / "val" / "per_class.json").read_text())["rows"]
    return {"tmp": tmp, "per_class": per_class, "wandb_home": wandb_home}


def test_wandb_offline_run_holds_metrics_hparams_tables_pictures_and_the_checkpoint(tracked):
    from wandb_records import summarize

    (run_dir,) = (tracked["tmp"] / "wandb" / "wandb").glob("offline-run-*")
    got = summarize(run_dir)
    assert "exit" in got["kinds"]  # the run finished cleanly
    history = got["history"]
    per_class = {r["name"]: r for r in tracked["per_class"]}
    for name, row in per_class.items():
        if row["AP"] is not None:
            assert history[f"val/per_class/AP/{name}"][-1] == pytest.approx(row["AP"])
    aps = [r["AP"] for r in tracked["per_class"] if r["AP"] is not None]
    assert history["val/map"][-1] == pytest.approx(sum(aps) / len(aps), abs=1e-6)  # mAP: the mean of the rows
    assert got["config"]["model_name"] == "detr_tiny" and got["config"]["num_classes"] == 2
    assert got["config"]["lr"] == pytest.approx(2e-4)
    # the per-class table: a W&B table whose rows are per_class.json's
    table_files = sorted((run_dir / "files" / "media" / "table" / "val").glob("per_class_*.table.json"))
    table = json.loads(table_files[-1].read_text())
    assert table["columns"] == ["category_id", "name", "AP", "AP50", "AP75", "AR100", "num_gt"]
    assert [row[1] for row in table["data"]] == list(per_class)
    # pictures: the validation predictions and the readouts, as W&B images in the run
    images = run_dir / "files" / "media" / "images"
    assert list((images / "val_predictions").glob("0_*.png")) and list((images / "val_predictions").glob("1_*.png"))
    for name in ("pr_curves_iou50", "pr_curves_iou75", "confusion_matrix", "tide"):
        assert list((images / "val" / "readouts").glob(f"{name}_*.png")), name
    assert {"val/per_class.json", "val/tide.json", "val/confusion_matrix.png"} <= set(got["files"])
    # the checkpoint: a "model" artifact holding the best and last file (one file here: the best is the last)
    models = [a for a in got["artifacts"] if a["type"] == "model"]
    assert models and any(f.endswith(".ckpt") for a in models for f in a["files"]), got["artifacts"]


def test_mlflow_file_store_run_holds_metrics_hparams_tables_pictures_and_the_checkpoint(tracked, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    client = MlflowClient(tracking_uri=f"file:{tracked['tmp'] / 'mlruns'}")
    experiment = client.get_experiment_by_name("visiontf-test")
    (run_info,) = client.search_runs([experiment.experiment_id])
    metrics, params = run_info.data.metrics, run_info.data.params
    aps = [r["AP"] for r in tracked["per_class"] if r["AP"] is not None]
    assert metrics["val/map"] == pytest.approx(sum(aps) / len(aps), abs=1e-6)
    for row in tracked["per_class"]:
        if row["AP"] is not None:
            assert metrics[f"val/per_class/AP/{row['name']}"] == pytest.approx(row["AP"])
    assert params["model_name"] == "detr_tiny" and float(params["lr"]) == pytest.approx(2e-4)
    root = Path(run_info.info.artifact_uri.removeprefix("file://").removeprefix("file:"))

    def listed(path: str = "") -> set[str]:
        out = set()
        for item in client.list_artifacts(run_info.info.run_id, path):
            out |= listed(item.path) if item.is_dir else {item.path}
        return out

    artifacts = listed()
    tables = sorted(a for a in artifacts if a.startswith("val/per_class_step"))
    table = json.loads((root / tables[-1]).read_text())
    assert table["columns"] == ["category_id", "name", "AP", "AP50", "AP75", "AR100", "num_gt"]
    assert [row[1] for row in table["data"]] == [r["name"] for r in tracked["per_class"]]
    assert {"val_predictions/0_step2.png", "val_predictions/1_step2.png", "val/readouts/tide_step2.png",
            "readouts/val/per_class.json", "readouts/val/confusion_matrix.json", "readouts/val/pr_curves_iou50.png"} <= artifacts
    assert any(a.endswith("/last.ckpt") for a in artifacts), sorted(artifacts)  # Lightning's log_model
