"""TIDE's error breakdown: how much AP fixing each kind of error would gain.

TIDE (Bolya et al., "TIDE: A General Toolbox for Identifying Object Detection Errors", ECCV 2020;
dbolya/tide, PyPI ``tidecv``) matches detections to objects at a foreground IoU ``t_f`` (0.5), then
puts every false positive and every missed object in one bin, in this order:

* **Loc** (localisation): right class, best IoU with an object of its class in ``[t_b, t_f]`` (``t_b`` = 0.1);
* **Cls** (classification): IoU >= ``t_f`` with an object of another class;
* **Dupe** (duplicate): IoU >= ``t_f`` with an object of its class already taken by a higher-scoring detection;
* **Bkg** (background): IoU <= ``t_b`` with every object (or an image without objects);
* **Both**: what is left (wrong class and IoU in ``(t_b, t_f)``);
* **Miss**: objects no detection matched, except those a Cls or Loc error points at.

dAP of a type is TIDE's AP at ``t_f`` after fixing only the errors of that type, minus the AP before
(negative differences reported as 0): a Cls or Loc error becomes a true positive (the highest-scoring
one per object; the others are suppressed), Dupe, Bkg and Both errors are suppressed, and a Miss
removes its object from the count. ``FalsePos`` and ``FalseNeg`` are the gains of perfect precision
(false positives scored 0) and of perfect recall (missed objects not counted).

TIDE's AP is its own 101-point AP at one IoU over the classes it saw, not COCOeval's: a class with
detections but no objects counts with AP 0, and a detection inside a crowd region of its class is
ignored for AP but still binned as an error. This module follows tidecv 1.0.1's arithmetic and order
(``tidecv/quantify.py``, ``ap.py``, ``errors/``) in its own code; ``scripts/experiments/tide_vs_tidecv.py``
checks it against tidecv itself. numpy and pycocotools' IoU only (no torch).
"""
from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pycocotools import mask as mask_utils

__all__ = ["ERROR_TYPES", "SPECIAL_TYPES", "TideReport", "tide_ap", "tide_errors"]

#: TIDE's main error types in its order, by their short names
ERROR_TYPES = ("Cls", "Loc", "Both", "Dupe", "Bkg", "Miss")
SPECIAL_TYPES = ("FalsePos", "FalseNeg")


def tide_ap(points: Sequence[tuple[float, bool]], num_gt: int) -> float:
    """TIDE's AP (x100) of one class: ``points`` (score, true positive) in their order (ties keep it),
    101 recall points at i/100, each taking the smoothed precision at the first detection that reaches it."""
    if num_gt == 0:
        return 0.0
    if not points:
        return 0.0
    scores = np.array([p[0] for p in points], dtype=np.float64)
    tp = np.array([bool(p[1]) for p in points])
    order = np.argsort(-scores, kind="stable")
    tp = tp[order]
    true = np.cumsum(tp)
    precision = true / np.arange(1, len(tp) + 1)
    recall = true / num_gt
    precision = np.maximum.accumulate(precision[::-1])[::-1]
    x = np.arange(101) / 100
    idx = np.searchsorted(recall, x, side="left")
    y = np.where(idx < len(precision), precision[np.minimum(idx, len(precision) - 1)], 0.0)
    return float(y.sum() / 101 * 100)


@dataclass
class _Error:
    kind: str
    pred_class: int | None = None
    score: float = 0.0
    pred_key: int | None = None  # the detection's key; None for Miss
    in_ap: bool = False  # the detection is a false positive in the AP data (not ignored by a crowd region)
    gt_key: tuple | None = None  # (image, object index) of the object a Cls/Loc error points at, or a Miss
    gt_class: int | None = None
    suppressed: bool = False  # Cls/Loc pointing at an object already matched


@dataclass
class _Run:
    points: dict[int, list[tuple[int, float, bool]]] = field(default_factory=lambda: defaultdict(list))  # class -> (key, score, tp)
    num_gt: Counter = field(default_factory=Counter)
    false_negatives: Counter = field(default_factory=Counter)
    errors: list[_Error] = field(default_factory=list)
    best: dict[tuple, tuple[float, int]] = field(default_factory=dict)  # object -> (best score, detection key)


@dataclass(frozen=True)
class TideReport:
    """``ap``: TIDE's AP at ``pos_threshold`` (x100); ``main``: dAP of each of :data:`ERROR_TYPES`;
    ``special``: dAP of ``FalsePos`` and ``FalseNeg``; ``counts``: errors of each main type."""

    ap: float
    main: dict[str, float]
    special: dict[str, float]
    counts: dict[str, int]
    pos_threshold: float
    background_threshold: float

    def to_json(self) -> dict[str, Any]:
        return {"ap": self.ap, "dAP": self.main, "special_dAP": self.special, "counts": self.counts,
                "pos_threshold": self.pos_threshold, "background_threshold": self.background_threshold,
                "definitions": "TIDE (Bolya et al. 2020, dbolya/tide): AP x100 at pos_threshold; dAP = AP after "
                               "fixing only that error type minus AP before"}

    def table(self) -> str:
        """TIDE's printed summary: its AP, then a row of dAP per main error and per special error."""
        main = "  ".join(f"{k:>6s}" for k in ERROR_TYPES)
        special = "  ".join(f"{k:>8s}" for k in SPECIAL_TYPES)
        return "\n".join([
            f"bbox AP @ {round(self.pos_threshold * 100)}: {self.ap:.2f}",
            f"  Type  {main}", "   dAP  " + "  ".join(f"{self.main[k]:6.2f}" for k in ERROR_TYPES),
            "  count " + "  ".join(f"{self.counts[k]:6d}" for k in ERROR_TYPES),
            f"  Type  {special}", "   dAP  " + "  ".join(f"{self.special[k]:8.2f}" for k in SPECIAL_TYPES),
        ])


def _image(run: _Run, image_id: Any, preds: list[Mapping[str, Any]], gts: list[Mapping[str, Any]],
           keys: list[int], t_f: float, t_b: float, max_dets: int) -> None:
    objects = [g for g in gts if not g.get("iscrowd", 0)]
    crowds = [g for g in gts if g.get("iscrowd", 0)]
    for g in objects:
        run.num_gt[g["category_id"]] += 1
    if not preds:
        for j, g in enumerate(objects):
            run.false_negatives[g["category_id"]] += 1
            run.errors.append(_Error("Miss", gt_key=(image_id, j), gt_class=g["category_id"]))
        return
    order = sorted(range(len(preds)), key=lambda i: -preds[i]["score"])[:max_dets]
    preds, keys = [preds[i] for i in order], [keys[i] for i in order]
    D, G = len(preds), len(objects)
    pcls = np.array([p["category_id"] for p in preds])
    boxes = [list(p["bbox"]) for p in preds]
    state: list[bool | None] = [False] * D  # True: matched; None: ignored inside a crowd region
    used = np.zeros(G, dtype=bool)
    if G:
        iou = np.asarray(mask_utils.iou(boxes, [list(g["bbox"]) for g in objects], [0] * G)).reshape(D, G)
        same = pcls[:, None] == np.array([g["category_id"] for g in objects])[None, :]
        cls_iou = iou * same
        free = cls_iou.copy()
        for i in range(D):  # highest score first, each takes its best free object of its class
            j = int(free[i].argmax())
            if free[i, j] >= t_f:
                state[i], used[j] = True, True
                free[:, j] = 0
    for c in crowds:  # COCO's crowd IoU (intersection over the detection's area), strictly above t_f
        ioa = np.asarray(mask_utils.iou(boxes, [list(c["bbox"])], [1])).reshape(D)
        for i in range(D):
            if not state[i] and ioa[i] > t_f and c["category_id"] == pcls[i]:
                state[i] = None
    for i, p in enumerate(preds):
        if state[i] is not None:
            run.points[p["category_id"]].append((keys[i], float(p["score"]), bool(state[i])))
        if state[i] is True:
            continue
        err = _Error("", pred_class=int(p["category_id"]), score=float(p["score"]), pred_key=keys[i],
                     in_ap=state[i] is not None)
        if not G:
            err.kind = "Bkg"
        else:
            j = int(cls_iou[i].argmax())
            other = iou[i] * ~same[i]
            dup = cls_iou[i] * used
            if t_b <= cls_iou[i, j] <= t_f:
                err.kind = "Loc"
            elif other.max() >= t_f:
                err.kind, j = "Cls", int(other.argmax())
            elif dup.max() >= t_f:
                err.kind = "Dupe"
            elif iou[i].max() <= t_b:
                err.kind = "Bkg"
            else:
                err.kind = "Both"
            if err.kind in ("Loc", "Cls"):
                err.gt_key, err.gt_class = (image_id, j), objects[j]["category_id"]
                err.suppressed = bool(used[j])
                if not err.suppressed:  # the highest-scoring error per object is the one a fix turns positive
                    best = run.best.get(err.gt_key)
                    if best is None or best[0] < err.score:
                        run.best[err.gt_key] = (err.score, keys[i])
        run.errors.append(err)
    for j, g in enumerate(objects):
        if not used[j]:
            run.false_negatives[g["category_id"]] += 1
            if (image_id, j) not in run.best:  # an object a Cls or Loc error points at is not a Miss
                run.errors.append(_Error("Miss", gt_key=(image_id, j), gt_class=g["category_id"]))


def _map(points: Mapping[int, list[tuple[int, float, bool]]], num_gt: Mapping[int, int]) -> float:
    """Mean of :func:`tide_ap` over the classes with detections or objects."""
    aps = [tide_ap([(s, t) for _, s, t in points.get(c, [])], num_gt.get(c, 0))
           for c in sorted(set(points) | set(num_gt), key=str) if points.get(c) or num_gt.get(c, 0)]
    return sum(aps) / len(aps) if aps else 0.0


def _fixed(run: _Run, kind: str | None, rescore: bool = False, drop_false_negatives: bool = False) -> float:
    """TIDE's mAP with the errors of ``kind`` fixed (``rescore``: true positives 1, false positives 0)."""
    num_gt = Counter(run.num_gt)
    points: dict[int, list[tuple[int, float, bool]]] = defaultdict(list)
    for e in run.errors:
        point = (e.pred_class, (e.pred_key, e.score, False)) if e.in_ap else None
        if e.kind == kind:
            point = None
            if e.kind == "Miss":
                num_gt[e.gt_class] -= 1
            elif e.kind in ("Cls", "Loc") and not e.suppressed and run.best[e.gt_key][1] == e.pred_key:
                point = (e.gt_class if e.kind == "Cls" else e.pred_class, (e.pred_key, e.score, True))
        if point is not None:
            points[point[0]].append(point[1])
    for c, pts in run.points.items():
        points[c].extend(p for p in pts if p[2])
    if drop_false_negatives:
        for c, n in run.false_negatives.items():
            num_gt[c] -= n
    if rescore:
        points = {c: [(k, 1.0 if t else 0.0, t) for k, _, t in pts] for c, pts in points.items()}
    return _map(points, num_gt)


def tide_errors(
    gt: Mapping[str, Any],
    results: Sequence[Mapping[str, Any]],
    img_ids: Iterable[int] | None = None,
    pos_threshold: float = 0.5,
    background_threshold: float = 0.1,
    max_dets: int = 100,
) -> TideReport:
    """TIDE's error breakdown of COCO ``results`` against the COCO annotation dict ``gt`` (boxes),
    over ``img_ids`` (default: every image of ``gt``); see the module docstring."""
    keep = None if img_ids is None else set(img_ids)
    by_image: dict[Any, list[int]] = defaultdict(list)
    for k, r in enumerate(results):
        by_image[r["image_id"]].append(k)
    truths: dict[Any, list[Mapping[str, Any]]] = defaultdict(list)
    for a in gt["annotations"]:
        truths[a["image_id"]].append(a)
    run = _Run()
    for im in gt["images"]:
        image_id = im["id"]
        if keep is not None and image_id not in keep:
            continue
        keys = by_image.get(image_id, [])
        _image(run, image_id, [results[k] for k in keys], truths.get(image_id, []), keys, pos_threshold,
               background_threshold, max_dets)
    base = _map(run.points, run.num_gt)
    main = {kind: max(_fixed(run, kind) - base, 0.0) for kind in ERROR_TYPES}
    special = {"FalsePos": _fixed(run, None, rescore=True) - base,
               "FalseNeg": _fixed(run, None, drop_false_negatives=True) - base}
    counts = Counter(e.kind for e in run.errors)
    return TideReport(base, main, special, {k: int(counts.get(k, 0)) for k in ERROR_TYPES}, float(pos_threshold),
                      float(background_threshold))
