"""The docs' examples cannot rot: every ```python or ```bash block of docs/*.md that is followed by
"prints" and a ```text block runs here, from the repository root, and must print exactly that text.

The python blocks run in one process (tests/cli_runner.py), each as its own ``__main__`` script with a
fresh namespace, so a block still needs its own imports and seeds; each bash block is its own process
(random weights, random or synthetic inputs, no network). About a minute for all of them on two shared cores.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from cli_runner import run_tools

ROOT = Path(__file__).resolve().parents[2]
#: a runnable block, the word "prints" alone on its line, then the block of what it prints
EXAMPLE = re.compile(r"```(python|bash)\n((?:(?!```).)*)```\n\nprints\n\n```text\n((?:(?!```).)*)```", re.S)

pytestmark = pytest.mark.slow


def examples() -> list:
    found = []
    for doc in sorted((ROOT / "docs").glob("*.md")):
        for i, (lang, code, printed) in enumerate(EXAMPLE.findall(doc.read_text())):
            found.append(pytest.param(lang, code, printed, id=f"{doc.name}-{i}"))
    return found


def test_the_docs_have_examples_with_their_output():
    names = {p.id.rsplit("-", 1)[0] for p in examples()}
    assert {"inference.md", "dino.md", "backbones.md", "depth.md", "distributed.md"} <= names, names


@pytest.fixture(scope="module")
def python_blocks(tmp_path_factory) -> dict[str, dict]:
    """Every python block run in one process, each from its own file: block code -> its result
    (``code``, ``stdout``, ``stderr``); an interpreter start costs more than most blocks."""
    tmp = tmp_path_factory.mktemp("doc_blocks")
    codes = list(dict.fromkeys(p.values[1] for p in examples() if p.values[0] == "python"))
    scripts = []
    for i, code in enumerate(codes):
        scripts.append(tmp / f"block_{i}.py")
        scripts[-1].write_text(code)
    results = run_tools([{"argv": [script], "env": {"OMP_NUM_THREADS": "1"}} for script in scripts], tmp, timeout=900)
    return dict(zip(codes, results))


@pytest.mark.parametrize(("lang", "code", "printed"), examples())
def test_an_example_prints_what_its_doc_says(lang, code, printed, request):
    if lang == "python":
        run = request.getfixturevalue("python_blocks")[code]
        returncode, stdout, stderr = run["code"], run["stdout"], run["stderr"]
    else:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
        argv = ["bash", "-o", "pipefail", "-c", code.replace("python ", f"{sys.executable} ", 1)]
        proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        returncode, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
    assert returncode == 0, stderr[-2000:]
    assert stdout.strip() == printed.strip(), f"the doc says:\n{printed}\nthe code printed:\n{stdout}"
