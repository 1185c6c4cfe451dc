"""The console commands (``[project.scripts]``) and the thin ``tools/*.py`` entry points behind them."""
import subprocess
import sys
from importlib import import_module
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = ("visiontf-train", "visiontf-eval", "visiontf-predict", "visiontf-export", "visiontf-app")
REINSTALL = "re-run `.venv/bin/pip install -q -e . --no-deps` to refresh the console scripts"


def _scripts() -> dict[str, str]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]


def _installed(name: str) -> Path:
    path = Path(sys.executable).parent / name
    assert path.is_file(), f"{path} missing: {REINSTALL}"
    return path


def test_every_console_command_names_a_callable_in_visiontf_cli():
    scripts = _scripts()
    assert sorted(scripts) == sorted(COMMANDS)
    for name, target in scripts.items():
        module, _, attr = target.partition(":")
        assert module.startswith("visiontf.cli."), name
        assert callable(getattr(import_module(module), attr)), target


def test_tools_never_edit_sys_path_and_each_documents_its_use():
    for tool in sorted((ROOT / "tools").glob("*.py")):
        text = tool.read_text()
        assert "sys.path" not in text, f"{tool.name} edits sys.path; visiontf is an installed package"
        body = text.removeprefix("#!/usr/bin/env python\n")
        assert body.startswith('"""'), f"{tool.name} has no docstring"


def test_installed_eval_runs_the_results_file_mode_without_torch(tmp_path):
    proc = subprocess.run([str(_installed("visiontf-eval")), "--annotations", str(tmp_path / "absent.json"),
                           "--predictions", str(tmp_path / "r.json")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.startswith("eval.py: error: ") and "absent.json" in proc.stderr


def test_the_old_results_script_is_a_shim_that_says_so(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "eval_coco_results.py"), "--annotations",
                           str(tmp_path / "absent.json"), "--predictions", str(tmp_path / "r.json")],
                          capture_output=True, text=True, timeout=120)
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2 and len(lines) == 2, proc.stderr
    assert "deprecated: use tools/eval.py --annotations" in lines[0] and lines[1].startswith("eval.py: error: ")


@pytest.mark.slow
@pytest.mark.parametrize("name", COMMANDS)
def test_installed_command_prints_its_help(name):
    proc = subprocess.run([str(_installed(name)), "--help"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "usage:" in proc.stdout, proc.stdout
    if name == "visiontf-train":
        assert "{fit,validate,test,predict}" in proc.stdout
    else:
        assert "--ckpt_path" in proc.stdout
    if name == "visiontf-eval":
        assert "--annotations A --predictions P" in proc.stdout
