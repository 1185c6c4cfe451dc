"""Which COCO image entry an input file is: matched by the annotation's relative ``file_name``.

``tools/predict.py --annotations`` writes COCO results, whose ``image_id`` must be the entry of
*that* picture. Matching by base name alone gives ``camA/0001.jpg`` the id of ``camB/0001.jpg``
without a word. The rule here:

1. an entry matches a file when its ``file_name``'s path components are the last components of the
   file's path (``camA/0001.jpg`` matches ``/data/val/camA/0001.jpg``); the longest match wins;
2. a file that no ``file_name`` matches that way falls back to its base name, but only when exactly
   one entry has that base name;
3. two entries matching a file equally well, or two files matching one entry, is an
   :class:`~visiontf.tasks.detection.coco_annotations.AnnotationError` listing the clashes; nothing is written.

Files that match no entry get ``None`` (the caller leaves them out and says how many).
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path, PurePosixPath

from visiontf.tasks.detection.coco_annotations import AnnotationError

#: how many clashes an error lists
_SHOW = 5


def _parts(name: str) -> tuple[str, ...]:
    # annotation file names use "/" (COCO) or "\\" (some Windows tools); compare components
    return tuple(p for p in PurePosixPath(str(name).replace("\\", "/")).parts if p not in ("", ".", "/"))


def match_image_ids(files: Sequence[str | None], images: Sequence[dict], ann_file: str | Path) -> list[int | None]:
    """The ``id`` of the entry of ``images`` (COCO ``images`` list) that each of ``files`` is, or None.

    Raises :class:`~visiontf.tasks.detection.coco_annotations.AnnotationError` on ambiguity (see the module docstring).
    """
    by_suffix: dict[tuple[str, ...], list[dict]] = defaultdict(list)
    by_base: dict[str, list[dict]] = defaultdict(list)
    for entry in images:
        parts = _parts(entry["file_name"])
        if parts:
            by_suffix[parts].append(entry)
            by_base[parts[-1]].append(entry)
    depth = max((len(k) for k in by_suffix), default=0)

    ids: list[int | None] = []
    ambiguous: list[str] = []
    for f in files:
        if not f:
            ids.append(None)
            continue
        parts = Path(f).resolve().parts if Path(f).exists() else _parts(str(f))
        found: list[dict] = []
        for n in range(min(depth, len(parts)), 0, -1):  # longest suffix first
            found = by_suffix.get(tuple(parts[-n:]), [])
            if found:
                break
        if not found:
            found = by_base.get(parts[-1], []) if parts else []
            if len(found) > 1:
                ambiguous.append(f"{f} -> base name {parts[-1]!r} is {', '.join(repr(e['file_name']) for e in found[:3])}")
                ids.append(None)
                continue
        if len(found) > 1:
            ambiguous.append(f"{f} -> {', '.join(repr(e['file_name']) for e in found[:3])} (duplicate file_name)")
            ids.append(None)
            continue
        ids.append(int(found[0]["id"]) if found else None)

    users: dict[int, list[str]] = defaultdict(list)
    for f, i in zip(files, ids):
        if i is not None:
            users[i].append(str(f))
    shared = [f"image id {i} ({', '.join(fs[:3])})" for i, fs in users.items() if len(fs) > 1]
    if ambiguous or shared:
        lines = [*ambiguous[:_SHOW], *shared[:_SHOW]]
        raise AnnotationError(
            f"{ann_file}: {len(ambiguous) + len(shared)} input file(s) cannot be matched to one image entry: "
            + "; ".join(lines)
            + ". Image ids are matched by the annotation's file_name (relative path); give the inputs with the "
            "folders that file_name names (e.g. camA/0001.jpg), or make the file names unique"
        )
    return ids


__all__ = ["match_image_ids"]
