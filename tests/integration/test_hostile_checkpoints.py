"""A checkpoint is data: loading one through any tool or API imports and runs nothing that the file names.

What the attacks were: LightningCLI merged ``--ckpt_path``'s hyper-parameters into its config through
jsonargparse, and Lightning's ``load_from_checkpoint`` handed them to the ``_instantiator`` the file named
(jsonargparse again). jsonargparse parses the string of an ``Any``-typed field as YAML or JSON and imports
and builds what a ``class_path`` in it names: ``model_kwargs.backbone = "{class_path: subprocess.Popen,
init_args: {args: touch X, shell: true}}"`` ran ``touch X`` during ``tools/eval.py``.

What holds now (:mod:`visiontf.core.saved_arguments`, :mod:`visiontf.io.lightning_checkpoint`,
:func:`visiontf.tasks.checkpoints.checkpoint_arguments`): hyper-parameters are checked against the task's
typed signature as plain data and reach its constructor by a plain call; no parser sees them.

Here: every spelling (dict, YAML string, JSON string, escaped JSON, block YAML, short name), every target
(``subprocess.Popen`` with a shell, ``builtins.exec``, ``os.system``, a path through visiontf's own modules,
a module planted on the path), every position (the task's and the data module's ``_class_path``,
``_instantiator``, a dict field, a string field, a list) is refused in one line naming the file and the key,
with exit code 2, through every tool and loader, and no payload runs: each one would write a marker file, and
the planted module writes one when imported. Files named ``best``/``last`` in the working folder are never read
for ``--ckpt_path best|last``. With the refusal of class-shaped strings switched off, the same strings still
run nothing (the structure, not the check, is what keeps them inert).
"""
from __future__ import annotations

import copy
import dataclasses
import inspect
import json
import typing
from pathlib import Path

import cv2
import lightning as L
import numpy as np
import pytest
import torch
from cli_runner import run_tools

from visiontf.core.saved_arguments import SavedArgumentsError, check_arguments, check_value, plain_data
from visiontf.tasks.checkpoints import CheckpointError, checkpoint_arguments, checkpoint_classes

ROOT = Path(__file__).resolve().parents[2]
CONFIG = str(ROOT / "configs/ipt/ipt_tiny_sr_x2.yaml")
SMALL = {"scale": 2, "n_feats": 4, "num_layers": 1, "num_heads": 2}
PLANTED = "planted_by_a_checkpoint"
MARK = "@MARKER@"  # replaced by the path of the marker file a payload writes


def _popen(spelling: str) -> dict:
    return {"class_path": spelling, "init_args": {"args": f"touch {MARK}", "shell": True}}


#: name -> (where in the checkpoint, the value); every value would write the marker if anything ran it
VARIANTS: dict[str, tuple[tuple[str, ...], object]] = {
    "dict": (("hyper_parameters", "model_kwargs", "backbone"), _popen("subprocess.Popen")),
    "yaml": (("hyper_parameters", "model_kwargs", "backbone"),
             f"{{class_path: subprocess.Popen, init_args: {{args: touch {MARK}, shell: true}}}}"),
    "json": (("hyper_parameters", "model_kwargs", "backbone"), json.dumps(_popen("subprocess.Popen"))),
    "escaped_json": (("hyper_parameters", "model_kwargs", "backbone"),
                     json.dumps(_popen("subprocess.Popen")).replace("class_path", "cl\\u0061ss_path")),
    "block_yaml": (("hyper_parameters", "model_kwargs", "backbone"),
                   f"class_path: subprocess.Popen\ninit_args:\n  args: touch {MARK}\n  shell: true\n"),
    "short_name": (("hyper_parameters", "model_kwargs", "backbone"),
                   f"{{class_path: Popen, init_args: {{args: touch {MARK}, shell: true}}}}"),
    "exec": (("hyper_parameters", "model_kwargs", "norm"),
             {"class_path": "builtins.exec", "init_args": {"source": f"open({MARK!r}, 'w')"}}),
    "os_system_in_a_string_field": (("hyper_parameters", "pretrained"),
                                    f"{{class_path: os.system, init_args: {{command: touch {MARK}}}}}"),
    "in_a_list": (("hyper_parameters", "model_kwargs", "blocks"),
                  [{"a": f"{{class_path: os.system, init_args: {{command: touch {MARK}}}}}"}]),
    "through_visiontf": (("hyper_parameters", "model_kwargs", "backbone"),
                         {"class_path": "visiontf.tasks.fsdp.importlib.import_module", "init_args": {"name": PLANTED}}),
    "task_class_path": (("hyper_parameters", "_class_path"), "visiontf.tasks.fsdp.importlib.import_module"),
    "planted_task": (("hyper_parameters", "_class_path"), f"{PLANTED}.Task"),
    "instantiator": (("hyper_parameters", "_instantiator"), "os.system"),
    "data_class_path": (("datamodule_hyper_parameters", "_class_path"), "subprocess.Popen"),
    "data_string": (("datamodule_hyper_parameters", "lq_dir"),
                    f"{{class_path: os.system, init_args: {{command: touch {MARK}}}}}"),
    # an impossible date fails PyYAML's safe reader, and jsonargparse's reader (no timestamps) reads a document
    "impossible_date": (("hyper_parameters", "model_kwargs", "backbone"),
                        f"{{class_path: subprocess.Popen, init_args: {{args: touch {MARK}, shell: true}}, x: 2001-13-45}}"),
    # longer than any string visiontf reads as a document
    "long_string": (("hyper_parameters", "model_kwargs", "backbone"),
                    f"{{class_path: os.system, init_args: {{command: touch {MARK}}}, pad: {'x' * 100_001}}}"),
}


def _clean_checkpoint() -> dict:
    """What ``tools/train.py fit`` writes for an ``ipt_tiny`` run, at step 0 (hyper-parameters as LightningCLI saves them)."""
    from visiontf.tasks.restoration.restoration_task import RestorationTask

    torch.manual_seed(0)
    task = RestorationTask("ipt_tiny", model_kwargs=dict(SMALL), lr=1e-3, schedule="constant")
    hp = {"_class_path": "visiontf.tasks.restoration.restoration_task.RestorationTask",
          "_instantiator": "lightning.pytorch.cli.instantiate_module", **dict(task.hparams)}
    dm = {"_class_path": "visiontf.tasks.restoration.restoration_data.RestorationDataModule",
          "_instantiator": "lightning.pytorch.cli.instantiate_module", "root": "data", "tasks": ["sr_x2"]}
    return {"epoch": 0, "global_step": 0, "pytorch-lightning_version": L.__version__, "state_dict": task.state_dict(),
            "callbacks": {}, "optimizer_states": [], "lr_schedulers": [], "hparams_name": "kwargs",
            "hyper_parameters": hp, "datamodule_hparams_name": "kwargs", "datamodule_hyper_parameters": dm,
            "preprocess": {"tasks": ("sr_x2",), "restore_task": "sr_x2", "self_ensemble": False},
            "task": "restoration"}


def _marked(value: object, marker: Path) -> object:
    return json.loads(json.dumps(value).replace(MARK, str(marker)))


def _with(ckpt: dict, keys: tuple[str, ...], value: object) -> dict:
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


# ------------------------------------------------------------------------------------------- the checker itself
def test_every_variant_is_refused_naming_the_file_and_the_key(tmp_path):
    clean = _clean_checkpoint()
    saved = checkpoint_arguments(clean, "x.ckpt")  # what visiontf writes passes, as the classes it names
    from visiontf.tasks.restoration.restoration_data import RestorationDataModule
    from visiontf.tasks.restoration.restoration_task import RestorationTask

    assert saved.task is RestorationTask and saved.data is RestorationDataModule
    assert saved.task_arguments["model_kwargs"] == SMALL and "_class_path" not in saved.task_arguments
    assert isinstance(saved.task_arguments["betas"], tuple)  # the declared type, as jsonargparse would give it
    for name, (keys, value) in VARIANTS.items():
        bad = _with(clean, keys, _marked(value, tmp_path / "m"))
        with pytest.raises(CheckpointError) as e:
            checkpoint_arguments(bad, tmp_path / "x.ckpt")
        message = str(e.value)
        assert message.startswith(f"{tmp_path / 'x.ckpt'}: {'.'.join(keys)}"), (name, message)
        assert "\n" not in message, name
    assert not (tmp_path / "m").exists()


def test_types_keys_and_shapes_are_those_the_constructor_declares():
    from visiontf.tasks.detection.detection_task import DetectionTask

    ok = check_arguments(DetectionTask, {"model_name": "detr_tiny", "num_classes": 3, "lr": 1, "schedule": "step",
                                         "compile": "transformer", "matcher_kwargs": None}, "f.ckpt", "hyper_parameters")
    assert ok["lr"] == 1.0 and isinstance(ok["lr"], float) and ok["compile"] == "transformer"
    refused = {
        "num_classes": ("3", "not int"), "lr": (True, "not float"), "schedule": ("linear", "not one of"),
        "model_kwargs": ("depth: 2", "not dict"), "log_per_class": (1, "not bool"),
        "no_such_argument": (1, "not an argument of DetectionTask"),
        "matcher_kwargs": ({"cost": torch.zeros(1)}, "torch.Tensor, not plain data"),
        "criterion_kwargs": ({"w": {"init_args": {}}}, "a class specification"),
    }
    for key, (value, why) in refused.items():
        with pytest.raises(SavedArgumentsError, match=rf"^f\.ckpt: hyper_parameters\.{key}.* is .*{why}"):
            check_arguments(DetectionTask, {"model_name": "m", key: value}, "f.ckpt", "hyper_parameters")
    # plain data: argparse Namespaces become dicts, tuples stay tuples, nothing else is taken
    import argparse

    assert plain_data(argparse.Namespace(a=[1, (2.0, "x")]), "f", "k") == {"a": [1, (2.0, "x")]}
    for value in (object(), print, torch.nn.Linear, {1: "int key"}, b"bytes"):
        with pytest.raises(SavedArgumentsError):
            plain_data(value, "f", "k")
    # numbers of any library, an integral float as an int (settings given in Python); a fraction is not an int
    import numpy as np

    assert check_value(np.int64(3), int, "f", "k") == 3 and type(check_value(3.0, int, "f", "k")) is int
    assert type(check_value(np.float32(0.5), float, "f", "k")) is float
    with pytest.raises(SavedArgumentsError, match="not int"):
        check_value(2.5, int, "f", "k")
    # containers, tuples and typed option groups (dataclasses) by their declared shape
    assert check_value([1, 2], tuple[float, float], "f", "k") == (1.0, 2.0)
    with pytest.raises(SavedArgumentsError, match="not tuple"):
        check_value([1, 2, 3], tuple[float, float], "f", "k")

    @dataclasses.dataclass
    class Options:
        depth: int = 2
        names: list[str] = dataclasses.field(default_factory=list)

    assert check_value({"depth": 3, "names": ["a"]}, Options, "f", "k") == Options(3, ["a"])
    with pytest.raises(SavedArgumentsError, match=r"k\.width .*not a field of Options"):
        check_value({"width": 3}, Options, "f", "k")
    with pytest.raises(SavedArgumentsError, match="k.depth"):
        check_value({"depth": "{class_path: os.system}"}, Options, "f", "k")


def _aliased_yaml(levels: int) -> str:
    """A few hundred characters of YAML whose last list reaches ``10 ** levels`` strings through anchors and aliases."""
    text = "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n"
    for i in range(1, levels + 1):
        text += f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]\n"
    return text


def _shared_lists(levels: int) -> list:
    """One list twice at every level: what a pickle's memo holds in ``levels`` small records, ``2 ** levels`` leaves."""
    node: list = ["x"]
    for _ in range(levels):
        node = [node, node]
    return node


def test_values_that_expand_are_refused_before_they_are_walked(tmp_path):
    """A file cannot stall a loader: a YAML string of 511 characters (10 ** 9 strings through aliases) and 30 levels
    of one shared list (2 ** 30 leaves; within the nesting cap of 32) each took a loader past 90 s. Counting every
    value reached stops the walk at :data:`_MOST_VALUES` and refuses the file in one line naming it and the key."""
    import time

    from visiontf.core import saved_arguments

    assert len(_aliased_yaml(8)) < 520
    for bomb in (_aliased_yaml(8), _shared_lists(30), {"a": _shared_lists(30)}):
        started = time.perf_counter()
        with pytest.raises(SavedArgumentsError, match=r"^f\.ckpt: k holds more than 200,000 values"):
            check_value(bomb, typing.Any, "f.ckpt", "k")
        with pytest.raises(SavedArgumentsError, match=r"^f\.ckpt: k holds more than"):
            plain_data(bomb, "f.ckpt", "k")
        assert time.perf_counter() - started < 20
    # through a checkpoint's sections, and the count is per walk: the largest legitimate sections still pass
    clean = _clean_checkpoint()
    for keys in (("hyper_parameters", "model_kwargs", "x"), ("datamodule_hyper_parameters", "lq_dir")):
        for bomb in (_aliased_yaml(8), _shared_lists(30)):
            started = time.perf_counter()
            with pytest.raises(CheckpointError) as e:  # too many values, or not the declared type (lq_dir: a path)
                checkpoint_arguments(_with(clean, keys, bomb), tmp_path / "x.ckpt")
            assert str(e.value).startswith(f"{tmp_path / 'x.ckpt'}: {keys[0]}.{keys[1]}") and len(str(e.value)) < 1000
            assert time.perf_counter() - started < 20  # the message's value is shown bounded too
    names = [f"class {i}" for i in range(saved_arguments._MOST_VALUES // 4)]  # V3Det has 13,204 classes
    assert plain_data({"class_names": names, "ids": dict(zip(names, range(len(names))))}, "f", "k")["ids"]["class 7"] == 7
    assert plain_data([_shared_lists(10)] * 8, "f", "k") == [_shared_lists(10)] * 8  # 8,192 leaves: fine
    assert check_value(_aliased_yaml(3), str, "f", "k") == _aliased_yaml(3)  # a plain string whose document is small


def test_every_table_class_declares_types_the_checker_reads():
    """Each task and data module of the task table takes only arguments whose types the checker reads: its
    defaults pass as they are (a class-typed or callable argument would be refused, as it must be)."""
    from visiontf.tasks.task_table import data_module_class_paths, task_class_paths

    classes = set(checkpoint_classes().values())
    assert len(classes) == len(task_class_paths()) + len(data_module_class_paths()) > 10
    for cls in classes:
        hints = typing.get_type_hints(cls.__init__)
        for name, param in inspect.signature(cls.__init__).parameters.items():
            if name == "self":
                continue
            assert name in hints, f"{cls.__name__}.{name} has no type: its saved value could only be checked as Any"
            if param.default is not inspect.Parameter.empty:
                check_value(param.default, hints[name], cls.__name__, name)


def test_the_short_names_and_the_config_own_class_are_the_allowed_spellings():
    from visiontf.tasks.restoration.restoration_task import RestorationTask

    allowed = checkpoint_classes()
    for spelling in ("visiontf.tasks.restoration.restoration_task.RestorationTask", "visiontf.tasks.restoration.restoration_task:RestorationTask",
                     "RestorationTask"):
        assert allowed[spelling] is RestorationTask

    class MyTask(RestorationTask):
        pass

    from visiontf.io.lightning_checkpoint import class_spellings

    mine = _with(_clean_checkpoint(), ("hyper_parameters", "_class_path"), class_spellings(MyTask)[0])
    with pytest.raises(CheckpointError, match="_class_path is"):
        checkpoint_arguments(mine, "x.ckpt")
    assert checkpoint_arguments(mine, "x.ckpt", task=MyTask).task is MyTask  # the user's own config or call names it
    with pytest.raises(CheckpointError, match="names RestorationTask, but MyTask is being built"):
        checkpoint_arguments(_clean_checkpoint(), "x.ckpt", task=MyTask)


# ------------------------------------------------------------------------------------------- through every tool
API = '''import sys
from visiontf.cli.tool_errors import run_tool

def main(argv):
    which, ckpt = argv
    if which == "load_checkpoint_model":
        from visiontf.tasks.checkpoints import load_checkpoint_model
        load_checkpoint_model(ckpt)
    elif which == "Predictor.from_checkpoint":
        from visiontf.inference import Predictor
        Predictor.from_checkpoint(ckpt)
    elif which == "RestorationTask.load_from_checkpoint":
        from visiontf.tasks.restoration.restoration_task import RestorationTask
        RestorationTask.load_from_checkpoint(ckpt)
    elif which == "RestorationDataModule.load_from_checkpoint":
        from visiontf.tasks.restoration.restoration_data import RestorationDataModule
        RestorationDataModule.load_from_checkpoint(ckpt)
    elif which == "TransformerTask(first_stage_ckpt)":
        from visiontf.tasks.generation.gpt_task import TransformerTask
        TransformerTask(first_stage_ckpt=ckpt)
    elif which == "import":
        __import__(ckpt)
    return 0

sys.exit(run_tool(main, sys.argv[1:], prog="api"))
'''

#: the loaders that read only the task's hyper-parameters (a data-section attack is refused by the others)
_READS_TASK_ONLY = {"RestorationTask.load_from_checkpoint"}
_READS_DATA_ONLY = {"RestorationDataModule.load_from_checkpoint"}


@pytest.fixture
def planted(tmp_path):
    """A module on the path that writes a marker when imported, and the marker every payload would write."""
    folder, marker = tmp_path / "planted", tmp_path / "payload_ran"
    folder.mkdir()
    (folder / f"{PLANTED}.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('imported')\nclass Task:\n    pass\n")
    return folder, marker


@pytest.mark.slow  # one process: 15 checkpoints x 13 tools and loaders, each refused before building anything
def test_no_hostile_checkpoint_runs_anything_in_any_tool(tmp_path, planted):
    planted_dir, marker = planted
    data = _photos(tmp_path / "photos")
    api = tmp_path / "api.py"
    api.write_text(API)
    clean = _clean_checkpoint()
    torch.save(clean, tmp_path / "clean.ckpt")
    ckpts = {}
    for name, (keys, value) in VARIANTS.items():
        ckpts[name] = tmp_path / f"{name}.ckpt"
        torch.save(_with(clean, keys, _marked(value, marker)), ckpts[name])

    data_args = [f"--data.init_args.root={data}", "--data.init_args.num_workers=0", "--data.init_args.val_crop=32",
                 f"--model.init_args.model_kwargs={SMALL}", "--trainer.logger=false", "--trainer.enable_progress_bar=false",
                 f"--trainer.default_root_dir={tmp_path / 'run'}"]

    def commands(ckpt: Path) -> dict[str, list]:
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
                                                       "RestorationDataModule.load_from_checkpoint",
                                                       "TransformerTask(first_stage_ckpt)")},
        }

    env = {"BROWSER": "true"}
    watched = [PLANTED]
    cases = [{"argv": commands(tmp_path / "clean.ckpt")[tool], "env": env, "watch_modules": watched}
             for tool in ("tools/eval.py", "RestorationTask.load_from_checkpoint",
                          "RestorationDataModule.load_from_checkpoint")]
    labels = []
    for name, ckpt in ckpts.items():
        section = VARIANTS[name][0][0]
        for tool, argv in commands(ckpt).items():
            if (tool in _READS_TASK_ONLY and section != "hyper_parameters") or \
                    (tool in _READS_DATA_ONLY and section != "datamodule_hyper_parameters"):
                continue
            cases.append({"argv": argv, "env": env, "watch_modules": watched})
            labels.append((name, tool))
    results = run_tools(cases, tmp_path, pythonpath=[planted_dir])

    controls, refused = results[:3], results[3:]
    for control in controls:
        assert control["code"] == 0, control["stderr"][-3000:]
    assert '"val/psnr_y"' in controls[0]["stdout"]
    for (name, tool), result in zip(labels, refused):
        keys, _ = VARIANTS[name]
        where = f"{name} via {tool}"
        assert result["code"] == 2, (where, result["stderr"][-3000:])
        assert "Traceback" not in result["stderr"], (where, result["stderr"][-3000:])
        last = [ln for ln in result["stderr"].splitlines() if ln.strip()][-1]
        assert f"{ckpts[name]}: {'.'.join(keys)}" in last, (where, last)
        assert result["imported"] == [], (where, result["imported"])
        assert not marker.exists(), f"{where} ran its payload or imported the planted module"
    assert len(refused) >= 150
    # the watch can fail: importing the planted module writes the marker and shows in sys.modules
    [imported] = run_tools([{"argv": [api, "import", PLANTED], "watch_modules": watched}], tmp_path,
                           pythonpath=[planted_dir])
    assert imported["code"] == 0 and imported["imported"] == [PLANTED] and marker.read_text() == "imported"


def test_files_named_best_or_last_in_the_working_folder_are_never_read(tmp_path, planted):
    """``--ckpt_path best|last|hpc`` mean the run's files; LightningCLI read a file of that name in the working
    folder instead, unchecked. Here the run's own hostile last.ckpt, and a best it records, are refused."""
    planted_dir, marker = planted
    work = tmp_path / "work"
    work.mkdir()
    clean = _clean_checkpoint()
    hostile = _with(clean, *VARIANTS["yaml"][:1], _marked(VARIANTS["yaml"][1], marker))
    for name in ("best", "last", "hpc"):
        torch.save(hostile, work / name)
    empty_run, run = tmp_path / "empty_run", tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    best = run / "checkpoints" / "epoch000.ckpt"
    torch.save(hostile, best)
    torch.save({**clean, "callbacks": {"LastAndBestCheckpoint{}": {"best_model_path": str(best)}}},
               run / "checkpoints" / "last.ckpt")
    data = _photos(tmp_path / "photos")
    common = ["tools/eval.py", "--config", CONFIG, f"--data.init_args.root={data}", "--trainer.logger=false"]
    cases = [{"argv": [*common, "--ckpt_path", keyword, f"--trainer.default_root_dir={empty_run}"], "cwd": work}
             for keyword in ("best", "last", "hpc")]
    cases.append({"argv": [*common, "--ckpt_path", "best", f"--trainer.default_root_dir={run}"], "cwd": work})
    torch.save(hostile, tmp_path / "hpc_ckpt_3.ckpt")
    cases.append({"argv": [*common, "--ckpt_path", "hpc", f"--trainer.default_root_dir={tmp_path}"], "cwd": work})
    results = run_tools(cases, tmp_path, pythonpath=[planted_dir])
    expected = ["no last.ckpt in", "no last.ckpt in", "no hpc_ckpt_<N>.ckpt in",
                f"{best}: hyper_parameters.model_kwargs.backbone is", f"{tmp_path / 'hpc_ckpt_3.ckpt'}: hyper_parameters"]
    for result, words in zip(results, expected):
        assert result["code"] == 2, result["stderr"][-3000:]
        last = [ln for ln in result["stderr"].splitlines() if ln.strip()][-1]
        assert words in last and "Traceback" not in result["stderr"], last
    assert not marker.exists()


# ------------------------------------------------------------------------------------------- a config is data too
def _through_visiontf(name: str) -> dict:
    return {"class_path": "visiontf.tasks.fsdp.importlib.import_module", "init_args": {"name": name}}


#: name -> (what the config file has over CONFIG, words the one error line has); every one would write the
#: marker or import the planted module if anything built or imported what it names
HOSTILE_CONFIGS: dict[str, tuple[dict, str]] = {
    "task_class_path": ({"model": {"class_path": f"{PLANTED}.Task"}}, f"--model: class path {PLANTED}.Task is not"),
    "data_class_path": ({"data": {"class_path": f"{PLANTED}.Task"}}, f"--data: class path {PLANTED}.Task is not"),
    "logger": ({"trainer": {"logger": {"class_path": f"{PLANTED}.Task"}}}, "--trainer.logger: class path"),
    "callback": ({"trainer": {"callbacks": [{"class_path": f"{PLANTED}.Task"}]}}, "--trainer.callbacks"),
    "strategy": ({"trainer": {"strategy": {"class_path": f"{PLANTED}.Task"}}}, "--trainer.strategy"),
    "data_through_visiontf": ({"data": _through_visiontf(PLANTED)},
                              "class path importlib.import_module (reached through visiontf.tasks.fsdp.importlib.import_module)"),
    "model_kwargs": ({"model": {"init_args": {"model_kwargs": {**SMALL, "x": _popen("subprocess.Popen")}}}},
                     "model.init_args.model_kwargs.x.class_path: a class specification"),
    "model_kwargs_string": ({"model": {"init_args": {"model_kwargs": {
        **SMALL, "x": f"{{class_path: subprocess.Popen, init_args: {{args: touch {MARK}, shell: true}}}}"}}}},
        "model.init_args.model_kwargs.x"),
    "model_kwargs_through_visiontf": ({"model": {"init_args": {"model_kwargs": {**SMALL, "x": _through_visiontf(PLANTED)}}}},
                                      "model.init_args.model_kwargs.x.class_path"),
    "weights_only": ({"weights_only": False}, "--weights_only false"),
    # jsonargparse calls a function a class path names for a Callable-typed parameter (a callback's hooks), and
    # allowed packages hold functions that import or run what they are given
    "function_that_runs_a_command": ({"trainer": {"callbacks": [{
        "class_path": "lightning.pytorch.callbacks.LambdaCallback", "init_args": {"on_fit_start": {
            "class_path": "lightning.pytorch.cli.instantiate_class", "init_args": {
                "args": f"touch {MARK}", "init": {**_popen("subprocess.Popen"), "not_a_spec": 1}}}}}]}},
        "class path lightning.pytorch.cli.instantiate_class (reached through"),
    "function_that_imports": ({"trainer": {"callbacks": [{
        "class_path": "lightning.pytorch.callbacks.LambdaCallback", "init_args": {"on_fit_start": {
            "class_path": "visiontf.tasks.task_table.import_class", "init_args": {"class_path": f"{PLANTED}.Task"}}}}]}},
        "class path visiontf.tasks.task_table.import_class"),
    "function_of_an_allowed_module": ({"trainer": {"callbacks": [{
        "class_path": "lightning.pytorch.callbacks.ThroughputMonitor", "init_args": {"batch_size_fn": {
            "class_path": "visiontf.tasks.fsdp._import_class", "init_args": {"path": f"{PLANTED}.Task"}}}}]}},
        "visiontf.tasks.fsdp._import_class is not a class"),
    "a_strategy_that_imports_its_argument": ({"trainer": {"strategy": {
        "class_path": "visiontf.tasks.fsdp.FSDPStrategy", "init_args": {"wrap_modules": [f"{PLANTED}.Task"]}}}},
        f"trainer.strategy.init_args.wrap_modules[0]: {PLANTED}.Task is not a class of"),
    "function_as_a_string": ({"trainer": {"callbacks": [{
        "class_path": "lightning.pytorch.callbacks.LambdaCallback",
        "init_args": {"on_validation_start": "visiontf.tasks.fsdp._import_class"}}]}},
        "trainer.callbacks[0].init_args.on_validation_start: visiontf.tasks.fsdp._import_class is a function"),
    # torch's and timm's block classes are looked up among the modules already imported, never imported for a file
    "a_torch_module_not_imported": ({"trainer": {"strategy": {
        "class_path": "visiontf.tasks.fsdp.FSDPStrategy",
        "init_args": {"wrap_modules": ["torch.testing._internal.common_utils.TestCase"]}}}},
        "wrap_modules[0]: torch.testing._internal.common_utils.TestCase is not a class of"),
    # an allowed class that is no component (its constructor imports its mapping's keys), under an untyped slot
    "not_a_component": ({"trainer": {"strategy": {
        "class_path": "lightning.pytorch.strategies.DDPStrategy", "init_args": {"ddp_comm_state": {
            "class_path": "lightning.fabric.plugins.precision.utils._ClassReplacementContextManager",
            "init_args": {"mapping": {f"{PLANTED}.Task": "visiontf.tasks.fsdp.FSDPStrategy"}}}}}}},
        "_ClassReplacementContextManager is not a component a config builds"),
    "dict_kwargs": ({"trainer": {"logger": {"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": "x"},
                                            "dict_kwargs": {"x": {"class_path": f"{PLANTED}.Task"}}}}},
                    "trainer.logger.dict_kwargs.x.class_path: a class specification written as plain values"),
}


def _merged(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = _merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


@pytest.mark.slow  # one process: 18 configs through three tools, each refused before building anything
def test_no_hostile_config_imports_or_runs_anything(tmp_path, planted):
    """A run's config.yaml travels with its checkpoint (the tools' messages point at it), so it is a file users load:
    it may name visiontf's and Lightning's classes and nothing else (jsonargparse's import policy,
    visiontf.cli.config_imports), a class specification where the task takes plain data is refused (jsonargparse
    built one under ``Any``: ``{class_path: subprocess.Popen, ...}`` in model_kwargs ran its command), and
    ``weights_only: false`` (which would unpickle the checkpoint) is refused."""
    import yaml

    planted_dir, marker = planted
    data = _photos(tmp_path / "photos")
    torch.save(_clean_checkpoint(), tmp_path / "clean.ckpt")
    base = yaml.safe_load(Path(CONFIG).read_text())
    base["data"]["init_args"].update({"root": str(data), "val_crop": 32})
    base["trainer"].update({"logger": False, "default_root_dir": str(tmp_path / "run")})
    base["model"]["init_args"]["model_kwargs"] = dict(SMALL)
    configs = {}
    for name, (over, _) in {"clean": ({}, ""), **HOSTILE_CONFIGS}.items():
        configs[name] = tmp_path / f"{name}.yaml"
        configs[name].write_text(yaml.safe_dump(_marked(_merged(base, over), marker)))

    def commands(config: Path) -> dict[str, list]:
        return {"tools/train.py fit --print_config": ["tools/train.py", "fit", "--config", config, "--print_config"],
                "tools/eval.py": ["tools/eval.py", "--config", config, "--ckpt_path", tmp_path / "clean.ckpt"],
                "tools/predict.py": ["tools/predict.py", "--config", config, "--ckpt_path", tmp_path / "clean.ckpt",
                                     "--input", data / "val", "--output", tmp_path / "out"]}

    watched = [PLANTED, "torch.testing._internal.common_utils"]
    cases = [{"argv": argv, "watch_modules": watched} for argv in commands(configs["clean"]).values()]
    labels = []
    for name in HOSTILE_CONFIGS:
        for tool, argv in commands(configs[name]).items():
            # predict reads the data section alone, and never a checkpoint through Lightning; --print_config
            # reads no checkpoint (weights_only is refused where one would be read)
            if (tool == "tools/predict.py" and not name.startswith("data")) or \
                    (name == "weights_only" and tool.endswith("--print_config")):
                continue
            cases.append({"argv": argv, "watch_modules": watched})
            labels.append((name, tool))
    results = run_tools(cases, tmp_path, pythonpath=[planted_dir])
    for control in results[:3]:  # visiontf's and Lightning's classes still resolve under the policy
        assert control["code"] == 0, (control["argv"], control["stderr"][-3000:])
    for (name, tool), result in zip(labels, results[3:]):
        where = f"{name} via {tool}"
        assert result["code"] == 2, (where, result["stderr"][-3000:])
        assert "Traceback" not in result["stderr"], (where, result["stderr"][-3000:])
        last = [ln for ln in result["stderr"].splitlines() if ln.strip()][-1]
        assert HOSTILE_CONFIGS[name][1] in last, (where, last)
        assert result["imported"] == [], (where, result["imported"])
        assert not marker.exists(), f"{where} ran its payload or imported the planted module"
    assert len(labels) == 2 * len(HOSTILE_CONFIGS) + 1


def test_the_environment_admits_a_users_own_callbacks_and_a_file_cannot(tmp_path):
    """A callback of the user's own package on the command line is refused, naming the variable that admits it; with
    VISIONTF_IMPORTABLE set (the environment: no file can set it) it is built."""
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "my_callbacks.py").write_text("import lightning as L\nclass Mark(L.Callback):\n    pass\n")
    argv = ["tools/train.py", "fit", "--config", CONFIG, "--trainer.callbacks+=my_callbacks.Mark", "--print_config"]
    refused, admitted = run_tools([{"argv": argv, "env": {"VISIONTF_IMPORTABLE": ""}},
                                   {"argv": argv, "env": {"VISIONTF_IMPORTABLE": "my_callbacks"}}], tmp_path,
                                  pythonpath=[folder])
    assert refused["code"] == 2 and "Traceback" not in refused["stderr"], refused["stderr"][-3000:]
    last = [ln for ln in refused["stderr"].splitlines() if ln.strip()][-1]
    assert "class path my_callbacks.Mark is not a class of visiontf or Lightning" in last and \
        "VISIONTF_IMPORTABLE=PACKAGE" in last, last
    assert admitted["code"] == 0 and "class_path: my_callbacks.Mark" in admitted["stdout"], admitted["stderr"][-3000:]


# ------------------------------------------------------------------------------------------- the structure alone
def test_with_the_string_check_off_the_strings_still_run_nothing(tmp_path, monkeypatch):
    """Refusing class-shaped strings is a courtesy: switched off, the YAML and JSON payloads reach the task
    as the plain strings they are (the model refuses an unknown argument), through the CLI and the Python API."""
    import visiontf.core.saved_arguments as saved_arguments
    from visiontf.cli.train import make_cli
    from visiontf.tasks.restoration.restoration_task import RestorationTask

    monkeypatch.setattr(saved_arguments, "_embedded_document", lambda text: None)
    marker = tmp_path / "payload_ran"
    data = _photos(tmp_path / "photos")
    clean = _clean_checkpoint()
    for name in ("yaml", "json", "block_yaml", "short_name"):
        keys, value = VARIANTS[name]
        ckpt = tmp_path / f"{name}.ckpt"
        torch.save(_with(clean, keys, _marked(value, marker)), ckpt)
        with pytest.raises(Exception, match="unexpected keyword argument 'backbone'"):
            RestorationTask.load_from_checkpoint(ckpt)
        with pytest.raises(Exception, match="unexpected keyword argument 'backbone'"):
            make_cli(["validate", "--config", CONFIG, "--ckpt_path", str(ckpt), f"--data.init_args.root={data}",
                      "--trainer.logger=false", f"--trainer.default_root_dir={tmp_path / 'run'}"])
        assert not marker.exists(), name
    # and the checker itself let them through: nothing but the structure stood in the way
    strings = _with(clean, VARIANTS["yaml"][0], "{class_path: os.system}")
    assert checkpoint_arguments(strings, "x.ckpt").task_arguments["model_kwargs"]["backbone"] == "{class_path: os.system}"


def test_the_python_api_loads_a_clean_checkpoint_as_lightning_does(tmp_path):
    """``load_from_checkpoint``'s own arguments keep their meaning: overrides on top, a YAML ``hparams_file`` in
    place of the saved hyper-parameters, the weights loaded, the data module's state restored."""
    from visiontf.tasks.restoration.restoration_data import RestorationDataModule
    from visiontf.tasks.restoration.restoration_task import RestorationTask

    clean = _clean_checkpoint()
    clean["RestorationDataModule"] = {}
    torch.save(clean, tmp_path / "clean.ckpt")
    task = RestorationTask.load_from_checkpoint(tmp_path / "clean.ckpt", lr=5e-4)
    assert task.hparams.lr == 5e-4 and task.hparams.model_kwargs == SMALL
    assert all(torch.equal(v, clean["state_dict"][k]) for k, v in task.state_dict().items())
    (tmp_path / "h.yaml").write_text("model_name: ipt_tiny\nmodel_kwargs: {scale: 2, n_feats: 4, num_layers: 1, "
                                     "num_heads: 2}\nlr: 0.002\n")
    assert RestorationTask.load_from_checkpoint(tmp_path / "clean.ckpt", hparams_file=tmp_path / "h.yaml").hparams.lr == 0.002
    (tmp_path / "bad.yaml").write_text("model_name: ipt_tiny\nmodel_kwargs: {x: '{class_path: os.system}'}\n")
    with pytest.raises(CheckpointError, match=r"bad\.yaml: hyper_parameters\.model_kwargs\.x is"):
        RestorationTask.load_from_checkpoint(tmp_path / "clean.ckpt", hparams_file=tmp_path / "bad.yaml")
    dm = RestorationDataModule.load_from_checkpoint(tmp_path / "clean.ckpt")
    assert isinstance(dm, RestorationDataModule) and dm.hparams.root == "data"


@pytest.mark.slow  # two CLI fits of a few steps (~15 s)
def test_a_resumed_run_is_built_with_and_saves_the_checkpoint_arguments(tmp_path):
    """LightningCLI's merge let the checkpoint's model settings win over the config's, and the run saved them
    again: both still hold, with the arguments handed over as data."""
    from visiontf.cli.train import make_cli
    from visiontf.io.weights import safe_torch_load

    data = _photos(tmp_path / "photos")
    common = [f"--data.init_args.root={data}", "--data.init_args.num_workers=0", "--data.init_args.val_crop=32",
              "--data.init_args.repeat=2", "--data.init_args.batch_size=1", "--data.init_args.patch_size=24",
              "--trainer.logger=false",
              "--trainer.enable_progress_bar=false", "--trainer.callbacks=[]", "--trainer.check_val_every_n_epoch=1",
              f"--trainer.default_root_dir={tmp_path / 'run'}"]
    make_cli(["fit", "--config", CONFIG, *common, f"--model.init_args.model_kwargs={SMALL}", "--trainer.max_epochs=1"])
    first = safe_torch_load(tmp_path / "run" / "checkpoints" / "last.ckpt")
    assert first["hyper_parameters"]["model_kwargs"] == SMALL
    # resumed with the config's own model_kwargs (16 features): the checkpoint's (4) are what is built and saved
    cli = make_cli(["fit", "--config", CONFIG, *common, "--trainer.max_epochs=2", "--ckpt_path=last"])
    assert cli.model.hparams.model_kwargs == SMALL and cli.model.model.head[0][0].out_channels == SMALL["n_feats"]
    resumed = safe_torch_load(tmp_path / "run" / "checkpoints" / "last.ckpt")
    assert resumed["global_step"] > first["global_step"]
    hp = resumed["hyper_parameters"]
    assert hp["_class_path"] == "visiontf.tasks.restoration.restoration_task.RestorationTask" and hp["model_kwargs"] == SMALL
    assert {k: v for k, v in hp.items() if k != "model_kwargs"} == \
        {k: v for k, v in first["hyper_parameters"].items() if k != "model_kwargs"}
