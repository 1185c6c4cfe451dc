"""The ImageFolder layout, ``<root>/<split>/<class_name>/<image>``: its class folders and their images.

Shared by the tasks whose data is class folders (classification, and the class-conditional tokenizer of
generation): the class list comes from the folders that hold an image, sorted.
"""
from __future__ import annotations

import logging
from pathlib import Path

from visiontf.data.loading import IMAGE_EXTENSIONS, DatasetLayoutError

log = logging.getLogger(__name__)


LAYOUT_HINT = "expected ImageFolder layout <root>/<split>/<class_name>/<image>.jpg|png"


def _is_image(path: Path) -> bool:
    return path.is_file() and path.suffix.lower() in IMAGE_EXTENSIONS


def _check_split_dir(split_dir: Path) -> None:
    if not split_dir.is_dir():
        raise DatasetLayoutError(
            f"{split_dir}: split folder not found ({LAYOUT_HINT}); check the root and the split name"
        )


def class_dirs(split_dir: Path) -> list[Path]:
    _check_split_dir(split_dir)
    dirs, hidden, loose = [], [], 0
    for p in sorted(split_dir.iterdir()):
        if p.is_dir():
            (hidden if p.name.startswith(".") else dirs).append(p)
        elif _is_image(p):
            loose += 1
    if hidden:
        log.info("%s: ignoring hidden folders %s", split_dir, [p.name for p in hidden])
    if loose:
        log.warning(
            "%s: ignoring %d image(s) placed directly in the split folder; move them into a class folder (%s)",
            split_dir, loose, LAYOUT_HINT,
        )
    return dirs


def images_in(class_dir: Path) -> tuple[list[Path], int, list[Path]]:
    """Image files under ``class_dir``, how many other files, and the broken symbolic links (which
    ``is_file()`` alone would drop without a word)."""
    images, others, broken = [], 0, []
    for p in sorted(class_dir.rglob("*")):
        if p.name.startswith("."):
            continue
        if p.is_file():
            if p.suffix.lower() in IMAGE_EXTENSIONS:
                images.append(p)
            else:
                others += 1
        elif p.is_symlink() and not p.exists():
            broken.append(p)
    return images, others, broken


def find_classes(split_dir: str | Path) -> list[str]:
    """Sorted names of the class folders of ``split_dir`` that hold at least one image.

    Empty class folders are skipped with a warning naming them, as long as another class has images;
    otherwise this raises :class:`DatasetLayoutError`.
    """
    split_dir = Path(split_dir)
    dirs = class_dirs(split_dir)
    if not dirs:
        raise DatasetLayoutError(f"{split_dir}: no class folders ({LAYOUT_HINT})")
    names, empty = [], []
    for d in dirs:
        (names if images_in(d)[0] else empty).append(d.name)
    if not names:
        raise DatasetLayoutError(
            f"{split_dir}: all {len(dirs)} class folders are empty (no files with extensions {IMAGE_EXTENSIONS})"
        )
    if empty:
        log.warning(
            "%s: skipping %d empty class folder(s) %s; they get no class index (add images or delete them)",
            split_dir, len(empty), empty,
        )
    return names


__all__ = ["LAYOUT_HINT", "class_dirs", "find_classes", "images_in"]
