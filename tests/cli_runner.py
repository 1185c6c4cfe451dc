"""Run several ``tools/*.py`` command lines in one Python process, each as ``python tools/X.py ARGS`` would.

Importing torch and Lightning costs most of a tool's start (5-10 s on two shared cores), so the CLI
tests pay it once per batch: this script runs each command's ``__main__`` with ``runpy`` and its own
``sys.argv``, environment, stdout and stderr (captured at the file-descriptor level, so logging and
Lightning's output are caught too), and records the exit code a real process would have had
(``SystemExit``'s code; 1 and the traceback on stderr for an exception that escapes).

    python tests/cli_runner.py CASES.json RESULTS.json

``CASES.json``: ``[{"argv": ["tools/predict.py", ...], "env": {...}, "stdout_to": "file"?,
"watch_modules": [...]?, "cwd": "folder"?}, ...]`` (``cwd``: the working folder, the repository by default); ``watch_modules``: the result's ``imported`` lists those of them in
``sys.modules`` once the command has run. Tests call :func:`run_tools`.
"""
from __future__ import annotations

import json
import os
import runpy
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run_one(argv: list[str], env: dict[str, str], cwd: str | None = None) -> tuple[int, str, str]:
    saved_env, saved_argv = dict(os.environ), sys.argv
    os.environ.update(env)
    os.chdir(cwd or ROOT)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        sys.stdout.flush()
        sys.stderr.flush()
        keep_out, keep_err = os.dup(1), os.dup(2)
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        try:
            script = argv[0] if Path(argv[0]).is_absolute() else str(ROOT / argv[0])
            sys.argv = [script, *argv[1:]]
            runpy.run_path(script, run_name="__main__")
            code = 0
        except SystemExit as e:
            if isinstance(e.code, str):
                print(e.code, file=sys.stderr)
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:  # noqa: BLE001 - what the interpreter would print before exiting with 1
            traceback.print_exc()
            code = 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(keep_out, 1)
            os.dup2(keep_err, 2)
            os.close(keep_out)
            os.close(keep_err)
            sys.argv = saved_argv
            os.chdir(ROOT)
            os.environ.clear()
            os.environ.update(saved_env)
        out.seek(0)
        err.seek(0)
        return code, out.read().decode(errors="replace"), err.read().decode(errors="replace")


def main(cases_file: str, results_file: str) -> int:
    os.chdir(ROOT)
    results = []
    for case in json.loads(Path(cases_file).read_text()):
        start = time.monotonic()
        code, out, err = _run_one(case["argv"], case.get("env") or {}, case.get("cwd"))
        if case.get("stdout_to"):
            Path(case["stdout_to"]).write_text(out)
        results.append({"argv": case["argv"], "code": code, "stdout": out, "stderr": err,
                        "seconds": round(time.monotonic() - start, 2),
                        "imported": [m for m in case.get("watch_modules") or [] if m in sys.modules]})
    Path(results_file).write_text(json.dumps(results))
    return 0


def run_tools(cases: list[dict], tmp_path: Path, timeout: float = 600, pythonpath: list[Path] = ()) -> list[dict]:
    """Run ``cases`` (see the module docstring) in one fresh Python process; one result dict per case
    with ``code``, ``stdout``, ``stderr``, ``seconds`` and ``imported``. ``pythonpath``: folders put on
    the process's path after the repository."""
    cases_file, results_file = tmp_path / "cli_cases.json", tmp_path / "cli_results.json"
    cases_file.write_text(json.dumps([{**c, "argv": [str(a) for a in c["argv"]], **({"cwd": str(c["cwd"])} if c.get("cwd") else {})}
                                      for c in cases]))
    path = os.pathsep.join([str(ROOT), *(str(p) for p in pythonpath)])
    env = {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, str(Path(__file__)), str(cases_file), str(results_file)], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == 0 and results_file.is_file(), proc.stderr[-5000:]
    return json.loads(results_file.read_text())


def error_line(result: dict) -> str:
    """The last line on stderr, after asserting it is the only error output: no traceback."""
    assert "Traceback" not in result["stderr"], result["stderr"][-3000:]
    lines = [ln for ln in result["stderr"].splitlines() if ln.strip()]
    assert lines, f"nothing on stderr; stdout: {result['stdout'][-2000:]}"
    return lines[-1]


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
