"""Finding a segmentation dataset's files: (image, mask) pairs per layout and the class list."""
from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from visiontf.data.loading import IMAGE_EXTENSIONS, DatasetLayoutError
from visiontf.data.segmentation_labels import LAYOUTS
from visiontf.io.text_files import read_utf8_text

log = logging.getLogger(__name__)


def read_class_names(path: str | Path) -> list[str]:
    """One class name a line (trailing blank lines ignored); index = line number."""
    path = Path(path)
    if not path.is_file():
        raise DatasetLayoutError(f"{path}: class list not found; write one class name a line (background first)")
    lines = read_utf8_text(path, DatasetLayoutError).splitlines()  # a byte-order mark is no part of the first name
    while lines and not lines[-1].strip():
        lines.pop()
    names = [line.strip() for line in lines]
    if not names:
        raise DatasetLayoutError(f"{path}: class list is empty")
    blank = [i + 1 for i, n in enumerate(names) if not n]
    if blank:
        raise DatasetLayoutError(f"{path}: blank class name on line(s) {blank}; every line up to the last is a class")
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise DatasetLayoutError(f"{path}: duplicate class names {dupes}")
    return names


def _pairs(image_dir: Path, mask_for: Callable[[Path], Path], pattern: str, layout_hint: str) -> list[tuple[Path, Path]]:
    if not image_dir.is_dir():
        raise DatasetLayoutError(f"{image_dir}: split folder not found ({layout_hint})")
    files = [p for p in image_dir.glob(pattern) if p.is_file()]
    images = sorted(p for p in files if p.suffix.lower() in IMAGE_EXTENSIONS)
    if not images:
        raise DatasetLayoutError(f"{image_dir}: no images matching {pattern!r} ({layout_hint})")
    unread = sorted(p for p in files if p.suffix.lower() not in IMAGE_EXTENSIONS and not p.name.startswith("."))
    if unread:
        # an image of another extension (.jfif, .heic) is left out with its mask: say so
        log.warning("%s: %d file(s) not read as images, e.g. %s; images are read with the extensions %s", image_dir,
                    len(unread), ", ".join(p.name for p in unread[:3]), " ".join(IMAGE_EXTENSIONS))
    pairs = []
    for img in images:
        mask = mask_for(img)
        if not mask.is_file():
            raise DatasetLayoutError(f"{img}: mask not found, expected {mask} ({layout_hint})")
        pairs.append((img, mask))
    return pairs


def generic_pairs(root: str | Path, split: str) -> list[tuple[Path, Path]]:
    """``images/<split>/<name>.<ext>`` with ``masks/<split>/<name>.png``."""
    root = Path(root)
    hint = "expected <root>/images/<split>/<name>.jpg and <root>/masks/<split>/<name>.png"
    return _pairs(root / "images" / split, lambda p: root / "masks" / split / p.relative_to(root / "images" / split)
                  .with_suffix(".png"), "**/*", hint)


def ade20k_pairs(root: str | Path, split: str) -> list[tuple[Path, Path]]:
    """``images/<split>/*.jpg`` with ``annotations/<split>/*.png`` (ADEChallengeData2016)."""
    root = Path(root)
    hint = "expected ADEChallengeData2016 layout <root>/images/{training,validation}/*.jpg and <root>/annotations/..."
    # any image extension, in any case (a copy made on Windows may write .JPG)
    return _pairs(root / "images" / split, lambda p: root / "annotations" / split / f"{p.stem}.png", "*", hint)


def cityscapes_pairs(root: str | Path, split: str) -> list[tuple[Path, Path]]:
    """``leftImg8bit/<split>/<city>/*_leftImg8bit.png`` with ``gtFine/<split>/<city>/*_gtFine_labelTrainIds.png``."""
    root = Path(root)
    hint = ("expected <root>/leftImg8bit/<split>/<city>/*_leftImg8bit.png and "
            "<root>/gtFine/<split>/<city>/*_gtFine_labelTrainIds.png (make the trainIds with cityscapesscripts' "
            "createTrainIdLabelImgs)")

    def mask_for(p: Path) -> Path:
        stem = p.name[: -len("_leftImg8bit.png")]
        return root / "gtFine" / split / p.parent.name / f"{stem}_gtFine_labelTrainIds.png"

    return _pairs(root / "leftImg8bit" / split, mask_for, "*/*_leftImg8bit.png", hint)


PAIR_FINDERS: dict[str, Callable[[str | Path, str], list[tuple[Path, Path]]]] = {
    "generic": generic_pairs, "ade20k": ade20k_pairs, "cityscapes": cityscapes_pairs,
}


def resolve_classes(root: str | Path, layout: str, num_classes: int | None = None) -> list[str]:
    """Class names of a dataset: ``classes.txt`` if present, else the layout's table (ADE20K 150,
    Cityscapes 19), else ``num_classes`` placeholders. A given ``num_classes`` must agree with the list."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r}; expected one of {sorted(LAYOUTS)}")
    path = Path(root) / "classes.txt"
    builtin = LAYOUTS[layout]["classes"]
    if path.is_file():
        names = read_class_names(path)
        if num_classes is not None and num_classes != len(names):
            raise DatasetLayoutError(f"{path}: lists {len(names)} classes but num_classes={num_classes}; make them agree")
        return names
    if num_classes is None:
        if builtin is None:
            raise DatasetLayoutError(
                f"{path}: class list not found; the generic layout needs classes.txt (one name a line, background "
                "first) or an explicit num_classes"
            )
        return list(builtin)
    if builtin is not None and num_classes == len(builtin):
        return list(builtin)
    return [f"class_{k}" for k in range(num_classes)]
