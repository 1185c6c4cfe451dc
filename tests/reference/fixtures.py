"""Recorded fixtures: what an original project computed, in one safetensors file per case.

``tests/fixtures/<family>/<case>.safetensors`` holds, as tensors:

* ``weights/<key>``: a small random-weight checkpoint in the original's own key layout;
* ``inputs/<name>``: the inputs it was run on (padded batches, masks, targets);
* ``float32/<name>``, ``float64/<name>``: the original's outputs with the weights and inputs in that dtype;

and, as the file's metadata, ``meta``: a JSON object naming the original (repository, commit), the command that
wrote the file and the settings it was built with (toy widths, levels, queries), plus whatever the case needs
(parameter counts, key mappings). The file is written by ``scripts/fixtures/make_<family>.py --repo PATH``, which
runs the real original from a checkout; the tests read it with no code of the original present.

Both sides import only this module: ``from reference.fixtures import load_fixture`` in tests (``tests/`` is on the
path) and ``write_fixture`` in the generator scripts (which put ``tests/`` on the path).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import torch

#: the folder of the recorded fixtures
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
_SECTIONS = ("weights", "inputs", "float32", "float64")


@dataclass
class Fixture:
    """One recorded case: ``weights`` (original key -> tensor), ``inputs``, ``outputs[dtype]`` and ``meta``."""

    weights: dict[str, torch.Tensor]
    inputs: dict[str, torch.Tensor]
    outputs: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None


def fixture_path(family: str, case: str) -> Path:
    return FIXTURES / family / f"{case}.safetensors"


def load_fixture(family: str, case: str) -> Fixture:
    """The recorded case ``tests/fixtures/<family>/<case>.safetensors``."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    path = fixture_path(family, case)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such fixture; scripts/fixtures/make_{family}.py --repo PATH writes it")
    tensors = load_file(path)
    with safe_open(path, framework="pt") as f:
        meta = json.loads((f.metadata() or {}).get("meta", "{}"))
    parts: dict[str, dict[str, torch.Tensor]] = {s: {} for s in _SECTIONS}
    for name, tensor in tensors.items():
        section, _, key = name.partition("/")
        parts[section][key] = tensor
    outputs = {dtype: parts[dtype] for dtype in ("float32", "float64") if parts[dtype]}
    return Fixture(parts["weights"], parts["inputs"], outputs, meta, path)


def write_fixture(path: str | Path, *, weights: dict[str, torch.Tensor], inputs: dict[str, torch.Tensor],
                  outputs: dict[str, dict[str, torch.Tensor]], meta: dict[str, Any]) -> Path:
    """Write one case (see the module docstring); ``outputs`` maps ``"float32"``/``"float64"`` to named tensors."""
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    for section, named in (("weights", weights), ("inputs", inputs), *outputs.items()):
        if section not in _SECTIONS:
            raise ValueError(f"{section}: a fixture holds {_SECTIONS}")
        for key, tensor in named.items():
            tensors[f"{section}/{key}"] = tensor.detach().cpu().contiguous()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, path, metadata={"meta": json.dumps(meta, sort_keys=True)})
    return path


@cache
def read_layouts(path: Path) -> dict[str, tuple[int, dict[str, torch.Size]]]:
    """A generator's listing of published models (``published_layouts.txt``): a ``## <name>: <count> parameters, ...``
    line opens each model's section, its lines ``<key> [<shape>]`` (and a dtype when not float32) follow; ``#`` lines
    are comments. Returns name -> (parameter count, {key: shape}); read once per path (do not change what it returns)."""
    sections: dict[str, tuple[int, dict[str, torch.Size]]] = {}
    current = None
    for line in Path(path).read_text().splitlines():
        if line.startswith("## "):
            name, count = re.match(r"## (\S+): (\d+) parameters", line).groups()
            current = sections[name] = (int(count), {})
        elif line and not line.startswith("#"):
            key, shape = re.match(r"(\S+) \[([\d, ]*)\]", line).groups()
            current[1][key] = torch.Size(int(d) for d in shape.split(",") if d.strip())
    return sections


__all__ = ["FIXTURES", "Fixture", "fixture_path", "load_fixture", "read_layouts", "write_fixture"]
