"""The docs' examples cannot rot: every ```python or ```bash block of docs/*.md that is followed by
"prints" and a ```text block runs here, from the repository root, and must print exactly that text.

Each block runs in its own process (random weights, random or synthetic inputs, no network):
a few seconds each, about a minute for all of them on two shared cores.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

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


@pytest.mark.parametrize(("lang", "code", "printed"), examples())
def test_an_example_prints_what_its_doc_says(lang, code, printed):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    argv = [sys.executable, "-c", code] if lang == "python" else ["bash", "-o", "pipefail", "-c",
                                                                  code.replace("python ", f"{sys.executable} ", 1)]
    run = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == printed.strip(), f"the doc says:\n{printed}\nthe code printed:\n{run.stdout}"
