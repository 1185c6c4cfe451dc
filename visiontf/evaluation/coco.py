"""COCO evaluation with pycocotools semantics, on pycocotools or faster-coco-eval.

This module must not import torch (directly or through visiontf): evaluating a results file from
the command line (:func:`main`, ``tools/eval.py --annotations A --predictions P``) should start in well under a
second. faster-coco-eval gives the same 12 numbers as pycocotools, several times faster. What visiontf
adds around it is kept cheap: files read with orjson (garbage collection paused while the containers are
made), and the result checks run as one pass over columns read once (numpy), not result by result.
"""
from __future__ import annotations

import contextlib
import gc
import io
import json
import logging
import math
from collections import Counter, deque
from collections.abc import Iterable, Iterator, Sequence
from itertools import chain
from operator import itemgetter
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from visiontf.core.errors import UserError
from visiontf.core.saved_arguments import short_repr
from visiontf.evaluation.readouts.per_class import CocoArrays, per_class_json
from visiontf.io.coco_fields import annotation_name, annotation_problem, id_problem

log = logging.getLogger(__name__)

#: COCOeval's 12 ``stats`` in order, each as (its name in stats files and tables, its logged metric
#: name, torchmetrics' ``MeanAveragePrecision`` naming). The one table of these names.
COCO_STATS = (
    ("AP", "map"), ("AP50", "map_50"), ("AP75", "map_75"),
    ("AP_small", "map_small"), ("AP_medium", "map_medium"), ("AP_large", "map_large"),
    ("AR_1", "mar_1"), ("AR_10", "mar_10"), ("AR_100", "mar_100"),
    ("AR_small", "mar_small"), ("AR_medium", "mar_medium"), ("AR_large", "mar_large"),
)
#: The stats' names as :func:`evaluate_coco` returns them.
STAT_NAMES = tuple(name for name, _ in COCO_STATS)
#: The stats' names as :class:`~visiontf.tasks.detection.coco_metric.CocoMetric` returns and the tasks log them.
METRIC_NAMES = tuple(metric for _, metric in COCO_STATS)
# (ap, iouThr, areaRng, maxDets) of each line of COCOeval.summarize(), to print the same table.
_LINES = (
    (1, None, "all", 100), (1, 0.5, "all", 100), (1, 0.75, "all", 100),
    (1, None, "small", 100), (1, None, "medium", 100), (1, None, "large", 100),
    (0, None, "all", 1), (0, None, "all", 10), (0, None, "all", 100),
    (0, None, "small", 100), (0, None, "medium", 100), (0, None, "large", 100),
)
BACKENDS = ("auto", "pycocotools", "faster_coco_eval")
_SHOW = 5

__all__ = ["BACKENDS", "COCO_STATS", "METRIC_NAMES", "STAT_NAMES", "CocoEvalError", "CocoStats", "evaluate_coco", "format_table",
           "invalid_results", "resolve_backend", "main"]


class CocoEvalError(UserError, ValueError):
    """Inputs to a COCO evaluation are unusable; the message names the file, the entries and the fix."""


class CocoStats(dict):
    """The 12 COCO stats by name (:data:`STAT_NAMES`), floats; ``table`` is the printed summary;
    ``arrays`` COCOeval's accumulated precision and recall arrays (per-class numbers, PR curves)."""

    def __init__(self, stats: Sequence[float], table: str, backend: str, arrays: CocoArrays | None = None):
        super().__init__(zip(STAT_NAMES, (float(s) for s in stats)))
        self.table = table
        self.backend = backend
        self.arrays = arrays


def format_table(stats: Sequence[float], iou_type: str = "bbox") -> str:
    """The 12 lines COCOeval.summarize() prints, in its exact format."""
    lines = []
    for (ap, iou, area, max_dets), value in zip(_LINES, stats):
        iou_str = "0.50:0.95" if iou is None else f"{iou:0.2f}"
        title, kind = ("Average Precision", "(AP)") if ap else ("Average Recall", "(AR)")
        lines.append(f" {title:<18} {kind} @[ IoU={iou_str:<9} | area={area:>6s} | maxDets={max_dets:>3d} ] = {value:0.3f}")
    return "\n".join(lines)


def resolve_backend(backend: str = "auto") -> str:
    """``auto`` -> ``faster_coco_eval`` when installed, else ``pycocotools``."""
    if backend not in BACKENDS:
        raise CocoEvalError(f"unknown COCO backend {backend!r}; choose one of {BACKENDS}")
    if backend != "auto":
        return backend
    try:
        import faster_coco_eval  # noqa: F401
    except ImportError:
        return "pycocotools"
    return "faster_coco_eval"


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """No cyclic garbage collection inside: reading 500,000 results makes a million containers, and each
    collection on the way walks all of them (it more than doubles the time to read the file). Nothing made
    here holds a reference cycle."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _load_json(path: Path, what: str) -> Any:
    if not path.is_file():
        raise CocoEvalError(f"{path}: {what} file not found")
    data = path.read_bytes()
    with _gc_paused():
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass
        # what orjson refuses and Python's json reads (NaN, Infinity, another Unicode encoding; the checks name
        # the NaN scores), or the line and column of the mistake
        try:
            return json.loads(data)
        except json.JSONDecodeError as e:
            raise CocoEvalError(f"{path}: malformed JSON at line {e.lineno} column {e.colno}: {e.msg}") from e
        except UnicodeDecodeError as e:
            raise CocoEvalError(f"{path}: not a JSON text file ({e.reason} at byte {e.start}); save it as UTF-8") from e


def _gt_dataset(annotations: Any) -> tuple[dict, str]:
    """The ground-truth dict and a name for messages, from a path, a dict or a COCO object."""
    if isinstance(annotations, (str, Path)):
        path = Path(annotations)
        data = _load_json(path, "annotation")
        name = str(path)
    elif isinstance(annotations, dict):
        data, name = annotations, "<annotation dict>"
    elif hasattr(annotations, "dataset") and isinstance(annotations.dataset, dict):
        data = annotations.dataset
        name = str(getattr(annotations, "annotation_file", None) or "<COCO object>")
    else:
        raise CocoEvalError(f"annotations must be a path, a dict or a COCO object, got {type(annotations).__name__}")
    if not isinstance(data, dict) or any(k not in data for k in ("images", "annotations", "categories")):
        raise CocoEvalError(f"{name}: not a COCO annotation file (needs 'images', 'annotations' and 'categories')")
    # COCOeval matches by annotation id: duplicates silently score a ground truth against itself at AP 0.02
    ids = [a.get("id") if isinstance(a, dict) else None for a in data["annotations"]]
    if None in ids:
        raise CocoEvalError(f"{name}: annotations[{ids.index(None)}] has no 'id'; COCO annotations need unique ids (number "
                            "them 1..N)")
    counts = Counter(ids)
    repeated = [(aid, n) for aid, n in counts.items() if n > 1]
    if repeated:
        shown = ", ".join(f"{aid} ({n} times)" for aid, n in repeated[:_SHOW])
        raise CocoEvalError(f"{name}: {len(repeated)} annotation id(s) appear more than once, e.g. {shown}; COCO evaluation "
                            "matches annotations by id, so renumber them 1..N (e.g. after merging files)")
    # the size ranges read each annotation's area: faster-coco-eval takes a missing one as 0 (a small object) without a
    # word, pycocotools stops with a KeyError
    lacking = next((a for a in data["annotations"] if "area" not in a), None)
    if lacking is not None:
        raise CocoEvalError(f"{name}: annotation id {lacking['id']} has no 'area'; COCO evaluation needs each annotation's "
                            "area in pixels (the mask's, or w * h for boxes only) for its small/medium/large ranges")
    _refuse_bad_fields(data, name)
    if any("iscrowd" not in a for a in data["annotations"]):
        # COCO's default, as the dataset loader and faster-coco-eval read it; pycocotools stops with a KeyError
        data = {**data, "annotations": [a if "iscrowd" in a else {**a, "iscrowd": 0} for a in data["annotations"]]}
    return data, name


def _refuse_bad_fields(data: dict, name: str) -> None:
    """The first image, category or annotation whose ids or fields COCOeval (and the per-class readouts) would
    fail on or read wrongly (:mod:`visiontf.io.coco_fields`, the dataset loader's rules), or an annotation of a
    category the file does not list (COCOeval scores only the listed ones: the object would be left out)."""
    for section in ("images", "categories"):
        for i, entry in enumerate(data[section]):
            if not isinstance(entry, dict) or "id" not in entry:
                raise CocoEvalError(f"{name}: {section}[{i}] is {short_repr(entry)}, not an object with an 'id'")
            if (problem := id_problem(entry, "COCO ids are integers (convert them, and the annotations' and results' "
                                                "ids, to numbers)")) is not None:
                raise CocoEvalError(f"{name}: {section}[{i}] has {problem}")
    category_ids = {c["id"] for c in data["categories"]}
    for i, ann in enumerate(data["annotations"]):
        named = annotation_name(ann, i)
        for key in ("image_id", "category_id"):
            if key not in ann:
                raise CocoEvalError(f"{name}: {named} has no '{key}'; each annotation names its image and category")
        if (problem := annotation_problem(ann)) is not None:
            raise CocoEvalError(f"{name}: {named} has {problem}")
        if ann["category_id"] not in category_ids:
            raise CocoEvalError(f"{name}: {named} has category_id {ann['category_id']}, which is not in 'categories'; "
                                "add the category or remove the annotation")


def _detections(detections: Any) -> tuple[list[dict], str, bool]:
    """The results list, a name for messages, and whether it is ours to modify."""
    if isinstance(detections, (str, Path)):
        path = Path(detections)
        dets = _load_json(path, "predictions")
        if not isinstance(dets, list):
            raise CocoEvalError(
                f"{path}: expected a JSON list of results "
                "[{\"image_id\", \"category_id\", \"bbox\": [x, y, w, h], \"score\"}, ...], got a JSON "
                f"{type(dets).__name__}"
            )
        return dets, str(path), True
    if isinstance(detections, dict) or not isinstance(detections, Iterable):
        raise CocoEvalError(f"detections must be a list of result dicts or a path, got {type(detections).__name__}")
    return list(detections), "<detections>", False


def _validate(dets: list[dict], gt: dict, det_name: str, gt_name: str, iou_type: str) -> None:
    """Refuse results COCOeval would score silently wrong or fail on, naming the entries.

    Each check is one pass in C over the results (``map``/``set``/numpy) when they are plain JSON
    numbers; only a file that fails one is looked at result by result, to name the entries. (Python
    loops over 500,000 results cost a quarter of the evaluation.)
    """
    need = ("image_id", "category_id", "score", "bbox" if iou_type == "bbox" else "segmentation")
    try:
        img_ids = set(map(itemgetter("image_id"), dets))
        cat_ids = set(map(itemgetter("category_id"), dets))
        scores = list(map(itemgetter("score"), dets))
        boxes = list(map(itemgetter("bbox"), dets)) if iou_type == "bbox" else None
        if iou_type != "bbox":
            deque(map(itemgetter("segmentation"), dets), maxlen=0)
    except (KeyError, TypeError) as e:
        first = next((i for i, d in enumerate(dets) if not isinstance(d, dict) or any(k not in d for k in need)), None)
        if first is None:  # an id that is a list or a dict
            first = next((i for i, d in enumerate(dets) if _unhashable(d["image_id"]) or _unhashable(d["category_id"])), 0)
            raise CocoEvalError(f"{det_name}: result #{first} ({str(dets[first])[:100]}) has an image_id or category_id "
                                "that is not a number; results carry the annotation file's ids") from e
        shown = str(dets[first])[:100]
        if iou_type != "bbox" and isinstance(dets[first], dict) and need[-1] not in dets[first]:
            raise CocoEvalError(
                f"{det_name}: result #{first} ({shown}) has no 'segmentation'; iou_type segm scores masks, so each "
                "result needs a 'segmentation' (COCO RLE: {'size': [h, w], 'counts': ...}); box results are scored "
                "with iou_type bbox (tools/eval.py --iou_type bbox)"
            ) from e
        raise CocoEvalError(f"{det_name}: result #{first} ({shown}) lacks {e}; each result needs {list(need)}") from e
    bad = [] if set(map(type, scores)) <= {int, float, bool} else [
        i for i, v in enumerate(scores) if not isinstance(v, (int, float))]
    if boxes is not None and not (set(map(type, boxes)) <= {list, tuple} and set(map(len, boxes)) <= {4}):
        bad += [i for i, b in enumerate(boxes) if not isinstance(b, (list, tuple)) or len(b) != 4]
    if bad:
        bad = sorted(set(bad))
        raise CocoEvalError(
            f"{det_name}: {len(bad)} result(s) with a non-numeric score or a bbox that is not [x, y, w, h], "
            f"e.g. #{bad[0]}: {str(dets[bad[0]])[:100]}"
        )
    score_array, box_array = _number_arrays(scores, boxes)
    _refuse_invalid_values(dets, det_name, iou_type, scores, boxes, score_array, box_array)
    unknown = sorted(img_ids - {img["id"] for img in gt["images"]}, key=str)
    if unknown:
        n = sum(1 for d in dets if d["image_id"] in set(unknown))
        raise CocoEvalError(
            f"{det_name}: {n} result(s) name {len(unknown)} image id(s) not in {gt_name}, e.g. {unknown[:_SHOW]}; "
            "evaluate against the annotation file the predictions were made for"
        )
    known = sorted(c["id"] for c in gt["categories"])
    unknown = sorted(cat_ids - set(known), key=str)
    if unknown:
        # pycocotools would score them as nothing (COCOeval only looks at the file's categories): a silent AP loss
        n = sum(1 for d in dets if d["category_id"] in set(unknown))
        hint = " (not contiguous training labels)"
        if all(isinstance(c, int) for c in cat_ids) and min(cat_ids) >= 0 and max(cat_ids) < len(known):
            hint = (f"; these look like contiguous training labels 0..{len(known) - 1}: label i is the category "
                    f"with the i-th smallest id ({known[:3]}...)")
        raise CocoEvalError(
            f"{det_name}: {n} result(s) use category id(s) {unknown[:_SHOW]}{' ...' if len(unknown) > _SHOW else ''} "
            f"({len(unknown)} in all) that are not in {gt_name} (its {len(known)} category ids: "
            f"{known[:_SHOW]}{' ...' if len(known) > _SHOW else ''}); results must carry the file's category ids{hint}"
        )


def _unhashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return True
    return False


def _plain_numbers(values: Sequence[Any]) -> np.ndarray | None:
    """``values`` as float64 when every one is a Python int or float (what JSON numbers load as), else None."""
    if not set(map(type, values)) <= {int, float}:
        return None
    return np.fromiter(values, dtype=np.float64, count=len(values))


def _number_arrays(scores: Sequence[Any], boxes: Sequence[Any] | None) -> tuple[np.ndarray | None, np.ndarray | None]:
    """``scores`` as float64 and ``boxes`` as [N, 4] float64 where every value is a plain JSON number (else None)."""
    array = None
    if boxes is not None and set(map(type, boxes)) <= {list, tuple} and set(map(len, boxes)) <= {4}:
        flat = _plain_numbers(list(chain.from_iterable(boxes)))
        array = None if flat is None else flat.reshape(-1, 4)
    return _plain_numbers(scores), array


def invalid_results(dets: Sequence[dict], iou_type: str = "bbox", scores: Sequence[Any] | None = None,
                    boxes: Sequence[Any] | None = None, score_array: np.ndarray | None = None,
                    box_array: np.ndarray | None = None) -> dict[str, list[int]]:
    """Indices of results whose values make COCOeval's numbers wrong without a word: a score that is
    NaN, infinite or negative (pycocotools sorts a NaN score last, so a false positive stops costing
    precision and AP rises), or a bbox with a non-finite value or a negative width or height (it
    matches nothing, so AP falls).

    ``scores``/``boxes``: the results' ``score`` and ``bbox`` values when the caller has them already, and
    ``score_array``/``box_array`` those as arrays (:func:`_number_arrays`).
    Plain JSON numbers are checked as numpy arrays; anything else (a bool, a numpy scalar, a missing
    bbox of a ``segm`` result) result by result, as before.
    """
    def finite(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

    out: dict[str, list[int]] = {"score": [], "bbox": []}
    scores = list(map(itemgetter("score"), dets)) if scores is None else scores
    if boxes is None and iou_type == "bbox":
        boxes = list(map(itemgetter("bbox"), dets))
    if score_array is None and box_array is None:
        score_array, box_array = _number_arrays(scores, boxes)
    values = score_array
    if values is not None:
        out["score"] = np.flatnonzero(~np.isfinite(values) | (values < 0)).tolist()
    else:
        out["score"] = [i for i, v in enumerate(scores) if not finite(v) or v < 0]
    array = box_array
    if array is not None:
        out["bbox"] = np.flatnonzero(~np.isfinite(array).all(axis=1) | (array[:, 2] < 0) | (array[:, 3] < 0)).tolist()
    else:
        for i, d in enumerate(dets):
            box = d.get("bbox")
            if iou_type == "bbox" or box is not None:
                if box is None or not all(finite(v) for v in box) or box[2] < 0 or box[3] < 0:
                    out["bbox"].append(i)
    return out


def _refuse_invalid_values(dets: list[dict], det_name: str, iou_type: str, scores: Sequence[Any] | None = None,
                           boxes: Sequence[Any] | None = None, score_array: np.ndarray | None = None,
                           box_array: np.ndarray | None = None) -> None:
    invalid = invalid_results(dets, iou_type, scores, boxes, score_array, box_array)
    problems = []
    for what, rule in (("score", "NaN, infinite or negative"), ("bbox", "non-finite, or a negative width or height")):
        idx = invalid[what]
        if idx:
            shown = "; ".join(f"#{i}: {str(dets[i])[:90]}" for i in idx[:_SHOW])
            problems.append(f"{len(idx)} result(s) with a {what} that is {rule} (e.g. {shown})")
    if problems:
        raise CocoEvalError(
            f"{det_name}: " + "; ".join(problems) + ". COCOeval would score them silently wrong (NaN scores sort "
            "last, negative boxes match nothing); fix or drop these results (scores are probabilities in [0, 1], "
            "bbox is [x, y, width, height] in pixels)"
        )


def _run_pycocotools(gt: dict, dets: list[dict], iou_type: str, img_ids: Sequence[int] | None
                     ) -> tuple[list[float], CocoArrays]:
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    # pycocotools prints progress to stdout; the CLI prints its own table instead.
    with contextlib.redirect_stdout(io.StringIO()):
        coco_gt = COCO()
        coco_gt.dataset = gt
        coco_gt.createIndex()
        if dets:
            coco_dt = coco_gt.loadRes(dets)
        else:  # loadRes indexes anns[0] and fails on an empty list
            coco_dt = COCO()
            coco_dt.dataset = {"images": list(gt["images"]), "categories": list(gt["categories"]), "annotations": []}
            coco_dt.createIndex()
        ev = COCOeval(coco_gt, coco_dt, iou_type)
        if img_ids is not None:
            ev.params.imgIds = sorted(img_ids)
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    return [float(s) for s in ev.stats[:12]], CocoArrays.from_eval(ev)


def _run_faster(gt: dict, dets: list[dict], iou_type: str, img_ids: Sequence[int] | None
                ) -> tuple[list[float], CocoArrays]:
    from faster_coco_eval import COCO, COCOeval_faster

    def quiet(*args: Any, **kwargs: Any) -> None:
        pass

    coco_gt = COCO(gt, print_function=quiet)
    coco_dt = coco_gt.loadRes(dets)
    ev = COCOeval_faster(coco_gt, coco_dt, iou_type, print_function=quiet)
    if img_ids is not None:
        ev.params.imgIds = sorted(img_ids)
    ev.evaluate()
    ev.accumulate()
    ev.summarize()
    return [float(s) for s in ev.stats[:12]], CocoArrays.from_eval(ev)


def evaluate_coco(
    annotations: Any,
    detections: Any,
    backend: str = "auto",
    iou_type: str = "bbox",
    img_ids: Sequence[int] | None = None,
) -> CocoStats:
    """COCOeval's 12 summary stats of ``detections`` against ``annotations``.

    Args:
        annotations: ground truth: a COCO annotation file path, its loaded dict, or a
            pycocotools / faster-coco-eval ``COCO`` object.
        detections: COCO results (``image_id``, ``category_id`` as in the file, ``bbox`` xywh in
            original pixels, ``score``): a list of dicts or a path to a results JSON file.
            An empty list evaluates to COCOeval's values for no detections.
        backend: ``auto`` (faster-coco-eval when installed, else pycocotools), ``pycocotools`` or
            ``faster_coco_eval``.
        iou_type: ``bbox`` or ``segm`` (masks: a result's ``bbox``, if any, is left out so that the mask's
            own area decides its size range).
        img_ids: evaluate only these images (default: every image in ``annotations``).

    Returns:
        :class:`CocoStats`: ``{"AP": ..., ..., "AR_large": ...}`` with ``.table``, the 12-line summary,
        and ``.arrays``, COCOeval's accumulated arrays (:mod:`visiontf.evaluation.readouts.per_class`).

    Raises:
        CocoEvalError: results naming image or category ids that are not in the annotations,
            results lacking fields, unreadable files.
    """
    if iou_type not in ("bbox", "segm"):
        raise CocoEvalError(f"iou_type {iou_type!r} is not supported; use 'bbox' or 'segm'")
    backend = resolve_backend(backend)
    with _gc_paused():
        return _evaluate(annotations, detections, backend, iou_type, img_ids)


def _evaluate(annotations: Any, detections: Any, backend: str, iou_type: str, img_ids: Sequence[int] | None
              ) -> CocoStats:
    gt, gt_name = _gt_dataset(annotations)
    dets, det_name, owned = _detections(detections)
    _validate(dets, gt, det_name, gt_name, iou_type)
    if img_ids is not None:
        missing = sorted(set(img_ids) - {img["id"] for img in gt["images"]}, key=str)
        if missing:
            raise CocoEvalError(f"img_ids {missing[:_SHOW]} ({len(missing)} in all) are not in {gt_name}")
    if iou_type == "segm" and any("bbox" in d for d in dets):
        # with a bbox, pycocotools' loadRes takes the box's area as the mask's (other small/medium/large
        # ranges than the masks'): dropped, as detectron2 does
        dets, owned = [{k: v for k, v in d.items() if k != "bbox"} for d in dets], True
    if not owned:
        # loadRes writes id/area/segmentation into each result; keep the caller's dicts intact.
        dets = [dict(d) for d in dets]
    run = _run_faster if backend == "faster_coco_eval" else _run_pycocotools
    stats, arrays = run(gt, dets, iou_type, img_ids)
    return CocoStats(stats, format_table(stats, iou_type), backend, arrays)


def main(argv: Sequence[str] | None = None) -> int:
    """``--annotations ann.json --predictions results.json [--backend B] [--output stats.json] [--per_class]
    [--readouts DIR [--score_threshold S]]``.

    Prints the 12-line COCO table; writes the named stats as JSON when ``--output`` is given;
    ``--per_class`` and ``--readouts``: :mod:`visiontf.evaluation.readouts.readouts`.
    Unusable input raises :class:`CocoEvalError`, which the tools print as one line with exit code 2
    (:func:`visiontf.cli.tool_errors.run_tool`).
    """
    from visiontf.core.arguments import ToolParser

    parser = ToolParser(
        description="Evaluate a COCO results file (bbox) against a COCO annotation file.",
    )
    parser.add_argument("--annotations", required=True, type=Path, help="COCO annotation file (instances_*.json)")
    parser.add_argument("--predictions", required=True, type=Path,
                        help="COCO results JSON: [{image_id, category_id, bbox: [x,y,w,h], score}, ...]")
    parser.add_argument("--backend", default="auto", choices=BACKENDS)
    parser.add_argument("--iou_type", default="bbox", choices=("bbox", "segm"))
    parser.add_argument("--output", type=Path, help="write the named stats here as JSON")
    parser.add_argument("--per_class", action="store_true",
                        help="also print AP, AP50, AP75, AR@100 and the instance count of each category (and add them "
                             "to --output as 'per_class')")
    parser.add_argument("--readouts", type=Path, help="write the per-class table, PR curves, the confusion matrix and "
                                                      "TIDE's error breakdown (JSON and PNG) into this folder")
    parser.add_argument("--score_threshold", type=float, default=0.5,
                        help="the confusion matrix's score threshold (detections scoring more take part)")
    args = parser.parse_args(argv)
    if args.readouts is not None and args.iou_type != "bbox":
        raise CocoEvalError(f"--readouts {args.readouts}: the confusion matrix and TIDE's breakdown are of boxes; use "
                            "--iou_type bbox, or --per_class alone for the per-class numbers of masks")
    stats = evaluate_coco(args.annotations, args.predictions, backend=args.backend, iou_type=args.iou_type)
    print(stats.table)
    payload = {"backend": stats.backend, "annotations": str(args.annotations), "predictions": str(args.predictions), **stats}
    if args.per_class or args.readouts is not None:
        from visiontf.evaluation.readouts.readouts import readouts_of_files

        readouts = readouts_of_files(args.annotations, args.predictions, stats, args.readouts, args.score_threshold)
        if args.per_class:
            print(readouts.table)
            payload["per_class"] = per_class_json(readouts.per_class)
    if args.output is not None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(payload, indent=2) + "\n")
    return 0
