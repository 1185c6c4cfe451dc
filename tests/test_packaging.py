"""Install settings: the SPDX licence string, and `make ... TORCH_INDEX=...` for CPU-only torch."""
import shutil
import subprocess
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]


def test_license_is_an_spdx_string_with_a_setuptools_that_reads_it():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert cfg["project"]["license"] == "Apache-2.0"  # not the deprecated {text = ...} table
    setuptools = next(r for r in cfg["build-system"]["requires"] if r.startswith("setuptools"))
    assert setuptools == "setuptools>=77"  # PEP 639 license expressions


@pytest.mark.skipif(shutil.which("make") is None, reason="make not installed")
def test_torch_index_installs_torch_first_and_only_when_given():
    def commands(*args):
        out = subprocess.run(["make", "-n", "-B", "install", *args], cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return [line for line in out.stdout.splitlines() if "pip install" in line]

    default = commands()
    assert not any("--index-url" in c for c in default)
    assert default[-1].endswith('-e ".[dev]"')
    cpu = commands("TORCH_INDEX=https://download.pytorch.org/whl/cpu")
    torch_line = next(i for i, c in enumerate(cpu) if "torch torchvision --index-url https://download.pytorch.org/whl/cpu" in c)
    assert torch_line < next(i for i, c in enumerate(cpu) if '-e ".[dev]"' in c)
