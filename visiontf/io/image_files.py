"""Opening image files with Pillow without running another program: every format Pillow reads but EPS.

Pillow identifies a file by its content, not its name, and reads EPS (Encapsulated PostScript) by running
Ghostscript on the file's PostScript program where Ghostscript is installed: a ``photo.jpg`` that starts with
``%!PS-Adobe`` would be run by ``gs``. An image file is data, so visiontf opens images with the formats Pillow
decodes itself, and an EPS file reads as an unidentified image. Every ``Image.open`` of visiontf goes through
:func:`open_image` (``tests/io/test_image_files.py`` checks the source for others).
"""
from __future__ import annotations

import functools
from pathlib import Path, PureWindowsPath
from typing import IO

from PIL import Image

#: the Pillow formats whose readers hand the file to another program
RUNS_A_PROGRAM = frozenset({"EPS"})


@functools.lru_cache(maxsize=1)
def pixel_formats() -> tuple[str, ...]:
    """Every format Pillow can open but those of :data:`RUNS_A_PROGRAM`."""
    Image.init()
    return tuple(name for name in Image.OPEN if name not in RUNS_A_PROGRAM)


def open_image(file: str | Path | IO[bytes]) -> Image.Image:
    """``Image.open(file)`` over :func:`pixel_formats`: raises ``UnidentifiedImageError`` for an EPS file."""
    return Image.open(file, formats=pixel_formats())


def outside_its_folder(name: object) -> str | None:
    """Why a file name read from a dataset's annotation file would name a file outside the folder it is joined to
    (``folder / name``), or None when it names one below it.

    An annotation file is data: a ``file_name`` that is absolute (``/home/u/photo.png``, ``C:\\x``) or climbs out
    (``../../x``) would have the dataset read, draw and log a file of the user's that the dataset does not hold."""
    if not isinstance(name, str) or not name:
        return "not a file name"
    posix = name.replace("\\", "/")
    if posix.startswith("/") or PureWindowsPath(name).drive:
        return "an absolute path"
    if ".." in posix.split("/"):
        return "a path through '..'"
    return None


__all__ = ["RUNS_A_PROGRAM", "open_image", "outside_its_folder", "pixel_formats"]
