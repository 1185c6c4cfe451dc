"""Paths pickled in a checkpoint load wherever it was written: Python 3.13 pickles them as ``pathlib._local.*``, and a
concrete path of the other system (``WindowsPath`` read on Linux) cannot be built, so each is read as the pure path
of its kind. A checkpoint of a run on Windows was refused with a raw ``NotImplementedError`` naming no file."""
from __future__ import annotations

import pathlib
import zipfile

import torch

from visiontf.io.weights import safe_torch_load


def _renamed(path: pathlib.Path, old: bytes, new: bytes) -> pathlib.Path:
    """``path``'s pickle with the global ``old`` (``b"module\\nname\\n"``) spelled ``new``, as another Python wrote it."""
    out = path.with_name("renamed_" + path.name)
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            data = src.read(info.filename)
            if info.filename.endswith("data.pkl"):
                assert old in data
                data = data.replace(old, new)
            dst.writestr(info, data)
    return out


def test_paths_of_other_systems_and_pythons_load_as_paths(tmp_path):
    torch.save({"root": pathlib.PureWindowsPath("C:/data/shapes"), "out": pathlib.PurePosixPath("/runs/a")}, tmp_path / "c.ckpt")
    windows = _renamed(tmp_path / "c.ckpt", b"pathlib\nPureWindowsPath\n", b"pathlib\nWindowsPath\n")
    assert safe_torch_load(windows)["root"] == pathlib.PureWindowsPath("C:/data/shapes")
    moved = _renamed(tmp_path / "c.ckpt", b"pathlib\nPurePosixPath\n", b"pathlib._local\nPosixPath\n")
    loaded = safe_torch_load(moved)["out"]
    assert isinstance(loaded, pathlib.PurePosixPath) and str(loaded) == "/runs/a"
    torch.save({"here": pathlib.Path("/a/b")}, tmp_path / "here.ckpt")
    assert safe_torch_load(tmp_path / "here.ckpt")["here"] == pathlib.Path("/a/b")  # this system's own: a real path
