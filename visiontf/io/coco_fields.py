"""The value of each field of a COCO ground-truth file that training and evaluation read.

pycocotools and faster-coco-eval take these fields on trust: a string ``iscrowd`` or ``area`` stops
COCOeval with a bare ``ValueError``/``TypeError`` deep in its loops, a NaN ``area`` counts an object
in every size range, a ``true`` category id is category 1 and a string ``iscrowd`` of ``"no"``
makes the object a crowd region. The dataset loader and the evaluator both ask here, so a file is
judged the same way wherever it is read. Each function returns what is wrong as a phrase that
follows the entry's name ("annotation id 7 has ...") and ends with the fix, or None.
"""
from __future__ import annotations

import math
from typing import Any

__all__ = ["annotation_name", "annotation_problem", "id_problem", "category_problem", "image_problem", "panoptic_category_problem", "segment_problem"]


#: what a crowd flag means, in the messages
CROWD = "1: a crowd region, which evaluation ignores; 0 or left out: an object"


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def annotation_name(ann: dict, position: int) -> str:
    """How messages name an annotation: by its id, or by its place in the list where the id itself is wrong."""
    return f"annotation id {ann['id']}" if _integer(ann.get("id")) else f"annotations[{position}]"


def id_problem(entry: dict, fix: str, key: str = "id") -> str | None:
    """``key`` of ``entry`` (when present) that is not an integer, as a phrase ending with ``fix``."""
    value = entry.get(key)
    if key not in entry or _integer(value):
        return None
    return f"{key} {_shown(value)}, a {type(value).__name__}; {fix}"


def _flag_problem(entry: dict, key: str, meaning: str) -> str | None:
    value = entry.get(key, 0)
    if isinstance(value, (int, float)) and value in (0, 1):
        return None
    return f"{key} {_shown(value)}; {key} is 0 or 1 ({meaning})"


def annotation_problem(ann: dict) -> str | None:
    """What makes a ground-truth annotation's ``id``, ``image_id``, ``category_id``, ``bbox``, ``iscrowd``
    or ``area`` unusable (the last two may be absent: ``iscrowd`` is then 0, and an evaluation asks for
    ``area`` itself). A non-finite or empty box is a number all the same: the loader drops it with a count."""
    for key, fix in (("id", "annotation ids are unique integers (number them 1..N)"),
                     ("image_id", "it names an image by its integer id"),
                     ("category_id", "it names a category by its integer id")):
        if (problem := id_problem(ann, fix, key)) is not None:
            return problem
    bbox = ann.get("bbox")
    if "bbox" in ann and not (isinstance(bbox, (list, tuple)) and len(bbox) == 4 and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in bbox)):
        return f"bbox {_shown(bbox)}; expected [x, y, width, height] (4 numbers, pixels)"
    if (problem := _flag_problem(ann, "iscrowd", CROWD)) is not None:
        return problem
    if "area" in ann and not (_number(ann["area"]) and ann["area"] >= 0):
        return (f"area {_shown(ann['area'])}; area is the object's size in pixels (a number >= 0: the mask's, or "
                "width * height for boxes only), which decides its small/medium/large range")
    return None


def image_problem(image: dict) -> str | None:
    """What makes an image entry's ``id``, ``width`` or ``height`` unusable (the size may be absent or null)."""
    problem = id_problem(image, "COCO image ids are integers (convert them, and the annotations' image_id, to "
                                "numbers)")
    for key in ("width", "height"):
        value = image.get(key)
        if problem is None and value is not None and not (_number(value) and value > 0):
            problem = f"{key} {_shown(value)}; {key} is the image's size in pixels (a number > 0), or left out"
    return problem


def category_problem(category: dict) -> str | None:
    """What makes a category's ``id``, ``name`` or ``supercategory`` unusable."""
    problem = id_problem(category, "each category needs an integer id and a name")
    for key in ("name", "supercategory"):
        value = category.get(key)
        if problem is None and value is not None and not isinstance(value, str):
            problem = f"{key} {_shown(value)}, a {type(value).__name__}; a category's {key} is text"
    return problem


def panoptic_category_problem(category: dict) -> str | None:
    """:func:`category_problem`, and ``isthing``: 1 for things, 0 for stuff (PQ's two averages)."""
    if (problem := category_problem(category)) is not None:
        return problem
    if "isthing" not in category:
        return "no 'isthing' (1 for things, 0 for stuff); a panoptic file needs it for every category"
    return _flag_problem(category, "isthing", "1: a thing, 0: stuff")


def segment_problem(segment: Any) -> str | None:
    """What makes a panoptic ``segments_info`` entry unusable: its ``id`` (the PNG's value, > 0: 0 is unlabelled),
    ``category_id``, ``iscrowd`` (absent: 0) and ``area`` (its pixel count; may be absent where it is not read)."""
    if not isinstance(segment, dict):
        return f"a segment {_shown(segment)}, not an object with 'id' and 'category_id'"
    for key in ("id", "category_id"):
        if key not in segment:
            return f"a segment without '{key}' ({_shown(segment)})"
        if (problem := id_problem(segment, "it is an integer", key)) is not None:
            return f"a segment with {problem}"
    if segment["id"] <= 0:
        return f"a segment with id {segment['id']}; segment ids are > 0 (0 is unlabelled)"
    if (problem := _flag_problem(segment, "iscrowd", CROWD)) is not None:
        return f"segment {segment['id']} with {problem}"
    if "area" in segment and not (_integer(segment["area"]) and segment["area"] >= 0):
        return (f"segment {segment['id']} with area {_shown(segment['area'])}; area is the segment's pixel count in "
                "its PNG")
    return None
