"""A checkpoint's hyper-parameters import nothing by themselves.

LightningCLI merges ``--ckpt_path``'s hyper-parameters into the config, and jsonargparse imports the
module a ``class_path`` names before checking the class: an ``ipt_tiny`` checkpoint naming
``this.Zen`` made ``tools/eval.py`` print the Zen of Python. Every class path of a checkpoint is now
checked against the task table first (:func:`visiontf.tasks.checkpoints.check_checkpoint_classes`).

Each foreign class path below (a module with side effects, one planted on the path that writes a
marker file when imported, real classes outside visiontf, nested at any depth) goes through every
tool and Python loader in one fresh process: each must be refused in one line naming the key and the
file (exit code 2), and none of the named modules may be in ``sys.modules`` afterwards. A clean copy
of the same checkpoint evaluates, and importing the planted module does write its marker, so the
checks can fail.
"""
from __future__ import annotations

import copy
import typing
from pathlib import Path

import cv2
import lightning as L
import numpy as np
import pytest
import torch
from cli_runner import run_tools

from visiontf.tasks.checkpoints import CheckpointError, check_checkpoint_classes, checkpoint_class_paths

CONFIG = "configs/ipt/ipt_tiny_sr_x2.yaml"
SMALL = {"scale": 2, "n_feats": 4, "num_layers": 1, "num_heads": 2}
PLANTED = "planted_by_a_checkpoint"

#: modules that must never be imported: the foreign class paths' own ones (collections and torch are
#: imported by every tool anyway, so those cases are checked by their message)
WATCHED = ["this", "antigravity", "smtplib", PLANTED]

#: variant -> (where in the checkpoint, the class path)
VARIANTS = {
    "zen": (("hyper_parameters", "_class_path"), "this.Zen"),
    "antigravity": (("hyper_parameters", "model_kwargs", "extra", "class_path"), "antigravity.geohash"),
    "planted": (("hyper_parameters", "_class_path"), f"{PLANTED}.Task"),
    "smtplib": (("hyper_parameters", "_class_path"), "smtplib.SMTP"),
    "torch_linear": (("hyper_parameters", "model_kwargs", "head", "class_path"), "torch.nn.Linear"),
    "ordered_dict": (("datamodule_hyper_parameters", "_class_path"), "collections.OrderedDict"),
}

API = '''import sys
from visiontf.cli.errors import run_tool

def main(argv):
    which, ckpt = argv
    if which == "load_checkpoint_model":
        from visiontf.tasks.checkpoints import load_checkpoint_model
        load_checkpoint_model(ckpt)
    elif which == "Predictor.from_checkpoint":
        from visiontf.inference import Predictor
        Predictor.from_checkpoint(ckpt)
    elif which == "RestorationTask.load_from_checkpoint":
        from visiontf.tasks.restoration import RestorationTask
        RestorationTask.load_from_checkpoint(ckpt)
    elif which == "TransformerTask(first_stage_ckpt)":
        from visiontf.tasks.transformer import TransformerTask
        TransformerTask(first_stage_ckpt=ckpt)
    elif which == "import":
        __import__(ckpt)
    return 0

sys.exit(run_tool(main, sys.argv[1:], prog="api"))
'''


def _clean_checkpoint() -> dict:
    """What ``tools/train.py fit`` writes for an ``ipt_tiny`` run, at step 0 (hyper-parameters as LightningCLI saves them)."""
    from visiontf.tasks.restoration import RestorationTask

    torch.manual_seed(0)
    task = RestorationTask("ipt_tiny", model_kwargs=dict(SMALL), lr=1e-3, schedule="constant")
    hp = {"_class_path": "visiontf.tasks.restoration.RestorationTask",
          "_instantiator": "lightning.pytorch.cli.instantiate_module", **dict(task.hparams)}
    dm = {"_class_path": "visiontf.data.restoration.RestorationDataModule",
          "_instantiator": "lightning.pytorch.cli.instantiate_module", "root": "data", "tasks": ["sr_x2"]}
    return {"epoch": 0, "global_step": 0, "pytorch-lightning_version": L.__version__, "state_dict": task.state_dict(),
            "callbacks": {}, "optimizer_states": [], "lr_schedulers": [], "hparams_name": "kwargs",
            "hyper_parameters": hp, "datamodule_hparams_name": "kwargs", "datamodule_hyper_parameters": dm,
            "preprocess": {"tasks": ("sr_x2",), "restore_task": "sr_x2", "self_ensemble": False},
            "task": "restoration"}


def _with(ckpt: dict, keys: tuple[str, ...], value: str) -> dict:
    out = copy.deepcopy(ckpt)
    node = out
    for k in keys[:-1]:
        node = node.setdefault(k, {})
    node[keys[-1]] = value
    return out


def _photos(root: Path) -> Path:
    y, x = np.mgrid[0:64, 0:64]
    for split in ("train", "val"):
        (root / split).mkdir(parents=True)
        img = np.stack([128 + 80 * np.sin(x / 5.0 + c) * np.cos(y / 6.0) for c in range(3)], axis=2)
        cv2.imwrite(str(root / split / "p0.png"), img.astype(np.uint8))
    return root


def test_the_allow_list_is_the_task_table_and_nested_paths_are_found(tmp_path):
    clean = _clean_checkpoint()
    check_checkpoint_classes(clean, "x.ckpt")  # what visiontf writes passes
    assert "visiontf.tasks.restoration.RestorationTask" in checkpoint_class_paths()
    assert "RestorationTask" in checkpoint_class_paths()  # a config's short name
    for name, (keys, value) in VARIANTS.items():
        with pytest.raises(CheckpointError) as e:
            check_checkpoint_classes(_with(clean, keys, value), tmp_path / "x.ckpt")
        message = str(e.value)
        assert str(tmp_path / "x.ckpt") in message and ".".join(keys) in message and repr(value) in message, name
    # deeper: inside a list, and an instantiator that is not Lightning's
    deep = _with(clean, ("hyper_parameters", "model_kwargs"), {"blocks": [{"a": {"class_path": "os.system"}}]})
    with pytest.raises(CheckpointError, match=r"hyper_parameters\.model_kwargs\.blocks\[0\]\.a\.class_path is 'os\.system'"):
        check_checkpoint_classes(deep, "x.ckpt")
    with pytest.raises(CheckpointError, match=r"hyper_parameters\._instantiator is 'os\.system', not Lightning's"):
        check_checkpoint_classes(_with(clean, ("hyper_parameters", "_instantiator"), "os.system"), "x.ckpt")
    with pytest.raises(CheckpointError, match=r"_class_path is \{'x': 1\}"):
        check_checkpoint_classes(_with(clean, ("hyper_parameters", "_class_path"), {"x": 1}), "x.ckpt")
    # the user's own config may name its own task class (the CLI passes the config's class paths as trusted)
    mine = _with(clean, ("hyper_parameters", "_class_path"), "my_project.tasks.MyTask")
    check_checkpoint_classes(mine, "x.ckpt", trusted=("my_project.tasks.MyTask",))


def test_the_table_classes_take_only_plain_data():
    """The allow-list covers class paths only because no table class takes a class-typed or callable argument,
    whose string value jsonargparse would import."""
    from visiontf.adapters.task_table import import_class

    plain = (str, int, float, bool, Path, type(None), typing.Any, dict, list, tuple)
    containers = (dict, list, tuple, typing.Union, typing.Literal, __import__("types").UnionType,
                  __import__("collections.abc", fromlist=["Sequence"]).Sequence)

    def ok(hint) -> bool:
        origin = typing.get_origin(hint)
        if origin is None:
            return hint in plain or isinstance(hint, (str, int, float, bool))
        return origin in containers and all(ok(a) for a in typing.get_args(hint) if a is not Ellipsis)

    for path in checkpoint_class_paths():
        if "." not in path or ":" in path:
            continue
        cls = import_class(path)
        hints = typing.get_type_hints(cls.__init__)
        bad = {k: v for k, v in hints.items() if k != "return" and not ok(v)}
        assert not bad, f"{path} takes {bad}: extend visiontf.tasks.checkpoints.check_checkpoint_classes first"


@pytest.mark.slow  # one process: 6 checkpoints x 12 tools and loaders, each refused before building anything (~40 s)
def test_a_foreign_class_path_imports_nothing_in_any_tool(tmp_path):
    data = _photos(tmp_path / "photos")
    planted_dir, marker = tmp_path / "planted", tmp_path / "planted_was_imported"
    planted_dir.mkdir()
    (planted_dir / f"{PLANTED}.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('imported')\nclass Task:\n    pass\n")
    api = tmp_path / "api.py"
    api.write_text(API)
    clean = _clean_checkpoint()
    torch.save(clean, tmp_path / "clean.ckpt")
    ckpts = {}
    for name, (keys, value) in VARIANTS.items():
        ckpts[name] = tmp_path / f"{name}.ckpt"
        torch.save(_with(clean, keys, value), ckpts[name])

    data_args = [f"--data.init_args.root={data}", "--data.init_args.num_workers=0", "--data.init_args.val_crop=32",
                 f"--model.init_args.model_kwargs={SMALL}", "--trainer.logger=false", "--trainer.enable_progress_bar=false",
                 f"--trainer.default_root_dir={tmp_path / 'run'}"]

    def commands(ckpt: Path) -> dict[str, list[str]]:
        out = tmp_path / "out"
        return {
            "tools/eval.py": ["tools/eval.py", "--config", CONFIG, "--ckpt_path", ckpt, *data_args],
            **{f"tools/train.py {sub}": ["tools/train.py", sub, "--config", CONFIG, "--ckpt_path", ckpt, *data_args]
               for sub in ("fit", "validate", "test", "predict")},
            "tools/predict.py": ["tools/predict.py", "--ckpt_path", ckpt, "--input", data / "val", "--output", out],
            "tools/export.py": ["tools/export.py", "--ckpt_path", ckpt, "--output", out / "m.safetensors"],
            "tools/sample.py": ["tools/sample.py", "--ckpt_path", ckpt, "--output", out / "s.png"],
            **{which: [api, which, ckpt] for which in ("load_checkpoint_model", "Predictor.from_checkpoint",
                                                       "RestorationTask.load_from_checkpoint",
                                                       "TransformerTask(first_stage_ckpt)")},
        }

    env = {"BROWSER": "true"}  # should antigravity be imported after all, its web browser is `true`
    cases = [{"argv": commands(tmp_path / "clean.ckpt")["tools/eval.py"], "env": env, "watch_modules": WATCHED}]
    labels = []
    for name, ckpt in ckpts.items():
        for tool, argv in commands(ckpt).items():
            cases.append({"argv": argv, "env": env, "watch_modules": WATCHED})
            labels.append((name, tool))
    results = run_tools(cases, tmp_path, pythonpath=[planted_dir])

    control, refused = results[0], results[1:]
    assert control["code"] == 0, control["stderr"][-3000:]
    assert '"val/psnr_y"' in control["stdout"] and control["imported"] == []
    assert not marker.exists()
    for (name, tool), result in zip(labels, refused):
        keys, value = VARIANTS[name]
        where = f"{name} via {tool}"
        assert result["code"] == 2, (where, result["stderr"][-3000:])
        assert "Traceback" not in result["stderr"], (where, result["stderr"][-3000:])
        last = [ln for ln in result["stderr"].splitlines() if ln.strip()][-1]
        assert f"{ckpts[name]}: {'.'.join(keys)} is {value!r}" in last, (where, last)
        assert result["imported"] == [], (where, result["imported"])
        assert "Beautiful is better than ugly" not in result["stdout"] + result["stderr"], where
        assert not marker.exists(), f"{where} imported the planted module"
    # the watch can fail: importing the planted module writes its marker and shows in sys.modules
    [planted] = run_tools([{"argv": [api, "import", PLANTED], "watch_modules": WATCHED}], tmp_path,
                          pythonpath=[planted_dir])
    assert planted["code"] == 0 and planted["imported"] == [PLANTED] and marker.read_text() == "imported"
