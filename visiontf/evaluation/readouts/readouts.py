"""Everything a detection evaluation can tell beyond its 12 numbers, computed and written in one place.

* per-class AP, AP50, AP75, AR@100 and instance counts (:mod:`~visiontf.evaluation.readouts.per_class`),
  a table and ``per_class.json``;
* PR curves at IoU 0.5 and 0.75 from the same COCOeval arrays (``pr_curves_iou50.png``,
  ``pr_curves_iou75.png``, the numbers in ``pr_curves.json``);
* the confusion matrix (:mod:`~visiontf.evaluation.readouts.confusion`): ``confusion_matrix.json``, ``.png``
  and ``_normalized.png``;
* TIDE's error breakdown (:mod:`~visiontf.evaluation.readouts.tide`): ``tide.json``, ``tide.png``;
* optionally the detections evaluated (``detections.json``, a COCO results file: the input of
  ``tools/eval.py --annotations A --predictions detections.json``).

Used by ``tools/eval.py`` (both paths: a checkpoint, and a results file) and by the
:class:`~visiontf.callbacks.DetectionReport` callback. No torch.
"""
from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from visiontf.evaluation.readouts.confusion import DetectionConfusion, detection_confusion_matrix
from visiontf.evaluation.readouts.per_class import CocoArrays, format_per_class_table, per_class_json, per_class_rows
from visiontf.evaluation.readouts.tide import TideReport, tide_errors

__all__ = ["PR_IOUS", "DetectionReport", "detection_readouts", "write_readouts"]

log = logging.getLogger(__name__)

#: the IoU thresholds of the PR-curve pictures
PR_IOUS = (0.5, 0.75)


@dataclass
class DetectionReport:
    """One evaluation's readouts. ``confusion`` and ``tide`` are None when not asked for (``full=False``)."""

    per_class: list[dict[str, Any]]
    arrays: CocoArrays
    names: dict[int, str]
    confusion: DetectionConfusion | None = None
    tide: TideReport | None = None

    @property
    def table(self) -> str:
        return format_per_class_table(self.per_class)

    def pr_curves(self) -> dict[str, Any]:
        """COCO's interpolated precision at each recall point, per category with ground truth, at :data:`PR_IOUS`."""
        a, m = self.arrays.area_labels.index("all"), self.arrays.max_dets.index(100)
        curves: dict[str, Any] = {}
        for iou in PR_IOUS:
            t = self.arrays.iou_index(iou)
            curves[f"{iou:.2f}"] = {self.names.get(c, str(c)): [round(float(v), 6) for v in self.arrays.precision[t, :, k, a, m]]
                                    for k, c in enumerate(self.arrays.cat_ids) if (self.arrays.precision[t, :, k, a, m] > -1).any()}
        return {"recall": [round(float(r), 6) for r in self.arrays.rec_thrs], "precision": curves,
                "note": "COCOeval's eval['precision'][t, :, k, 'all', maxDets 100]: interpolated precision "
                        "(the maximum at any higher recall), 0 past the highest recall reached"}


def detection_readouts(
    gt: Mapping[str, Any],
    results: Sequence[Mapping[str, Any]],
    arrays: CocoArrays,
    img_ids: Iterable[int] | None = None,
    full: bool = True,
    score_threshold: float = 0.5,
    iou_threshold: float = 0.5,
) -> DetectionReport:
    """Per-class numbers from ``arrays`` (the COCOeval that scored ``results``); with ``full``, the
    confusion matrix at ``score_threshold`` / ``iou_threshold`` and TIDE's breakdown too."""
    img_ids = None if img_ids is None else list(img_ids)
    names = {int(c["id"]): str(c.get("name", c["id"])) for c in gt["categories"]}
    readouts = DetectionReport(per_class_rows(arrays, gt, img_ids), arrays, names)
    if full:
        readouts.confusion = detection_confusion_matrix(gt, results, score_threshold, iou_threshold, img_ids)
        readouts.tide = tide_errors(gt, results, img_ids)
    return readouts


def _write_json(path: Path, payload: Any) -> Path:
    path.write_text(json.dumps(payload, indent=1, allow_nan=False) + "\n")
    return path


def write_readouts(readouts: DetectionReport, out_dir: str | Path, pictures: bool = True,
                   detections: Sequence[Mapping[str, Any]] | None = None) -> list[Path]:
    """Write the readouts' files into ``out_dir`` (see the module docstring); returns their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = [_write_json(out / "per_class.json", {"rows": per_class_json(readouts.per_class)}),
               _write_json(out / "pr_curves.json", readouts.pr_curves())]
    (out / "per_class.txt").write_text(readouts.table + "\n")
    written.append(out / "per_class.txt")
    if readouts.confusion is not None:
        written.append(_write_json(out / "confusion_matrix.json", readouts.confusion.to_json()))
    if readouts.tide is not None:
        written.append(_write_json(out / "tide.json", readouts.tide.to_json()))
    if detections is not None:
        written.append(_write_json(out / "detections.json", list(detections)))
    if pictures:
        from visiontf.evaluation.readouts.plots import plot_confusion, plot_pr_curves, plot_tide

        for iou in PR_IOUS:
            path = out / f"pr_curves_iou{round(iou * 100)}.png"
            plot_pr_curves(readouts.arrays, readouts.names, iou, path)
            written.append(path)
        if readouts.confusion is not None:
            for normalized, name in ((False, "confusion_matrix.png"), (True, "confusion_matrix_normalized.png")):
                plot_confusion(readouts.confusion, normalized, out / name)
                written.append(out / name)
        if readouts.tide is not None:
            plot_tide(readouts.tide, out / "tide.png")
            written.append(out / "tide.png")
    log.info("detection readouts written to %s (%d files)", out, len(written))
    return written


def readouts_of_files(annotations: str | Path, predictions: str | Path, stats: Any, out_dir: str | Path | None = None,
                      score_threshold: float = 0.5) -> DetectionReport:
    """The readouts of a results file scored by :func:`~visiontf.evaluation.coco.evaluate_coco` (``stats``,
    with its arrays); with ``out_dir``, the confusion matrix and TIDE too, and every file written there."""
    gt = json.loads(Path(annotations).read_text(encoding="utf-8"))
    results = json.loads(Path(predictions).read_text(encoding="utf-8"))
    readouts = detection_readouts(gt, results, stats.arrays, full=out_dir is not None, score_threshold=score_threshold)
    if out_dir is not None:
        write_readouts(readouts, out_dir)
    return readouts
