"""What a detection evaluation shows beyond its 12 numbers, written to files and to every logger.

At the end of each validation and test of a :class:`~visiontf.tasks.detection.detection_task.DetectionTask` (rank 0;
the COCO metric has every rank's detections by then):

* the per-class table (AP, AP50, AP75, AR@100, instances), logged at INFO as mmdetection prints it,
  written to ``<out_dir>/<stage>/per_class.json`` and ``.txt``, and given to every logger as a
  table (:mod:`visiontf.callbacks.logger_sinks`); the per-class scalars are the task's own ``log``.
  Files are written where ``out_dir`` says or, without it, under the run's root when it has a logger
  (a run with neither, e.g. ``tools/eval.py --trainer.logger false``, writes none);
* at a test, a stand-alone ``validate`` (``tools/eval.py``) and every ``pictures_every_n_epochs``-th
  validation of a fit: PR curves at IoU 0.5 and 0.75, the confusion matrix at ``score_threshold``,
  TIDE's breakdown and the detections (:mod:`visiontf.evaluation.readouts.readouts`), as files, as pictures to
  every logger, and as TensorBoard PR curves.

TensorBoard's PR curves (``add_pr_curve_raw``) show COCO's interpolated precision at its 101 recall
points, the curve the PNGs draw and whose mean is the AP; the counts in TensorBoard's tooltips are
derived from it (true positives = recall x objects, false positives = true positives / precision -
true positives, no true negatives), not counted detection by detection. TensorBoard's ``add_pr_curve``
needs raw scores and labels of a binary problem, which COCO's matching does not give.

In a config (``tools/train.py`` adds it to every run; these are its options)::

    readouts:
      out_dir: null                 # default <trainer.default_root_dir>/readouts
      pictures_every_n_epochs: 0    # 0: pictures at test and stand-alone validation only
      score_threshold: 0.5          # the confusion matrix's
"""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.trainer.states import TrainerFn

from visiontf.callbacks.logger_sinks import log_files, log_image, log_table
from visiontf.evaluation.readouts.per_class import PER_CLASS_COLUMNS
from visiontf.evaluation.readouts.readouts import PR_IOUS, DetectionReport, write_readouts
from visiontf.tasks.detection.detection_task import DetectionTask

log = logging.getLogger(__name__)

__all__ = ["DetectionReadouts", "pr_curve_counts"]

_TABLE_COLUMNS = ["category_id", "name", *(key for key, _ in PER_CLASS_COLUMNS)]


def pr_curve_counts(precision: np.ndarray, recall: np.ndarray, num_objects: int) -> dict[str, np.ndarray]:
    """``add_pr_curve_raw``'s arrays from COCO's interpolated ``precision`` at the ``recall`` points, in
    TensorBoard's order (thresholds rising, so recall falling); counts derived, see the module docstring."""
    p, r = precision[::-1].clip(0, 1), recall[::-1]
    tp = r * num_objects
    fp = np.divide(tp * (1 - p), p, out=np.zeros_like(tp), where=p > 0)
    return {"true_positive_counts": tp, "false_positive_counts": fp, "true_negative_counts": np.zeros_like(tp),
            "false_negative_counts": num_objects - tp, "precision": p, "recall": r}


class DetectionReadouts(Callback):
    """See the module docstring. ``out_dir``: where the files go (default ``<default_root_dir>/readouts``);
    ``pictures_every_n_epochs``: also the full readouts at every n-th validation of a fit (0: never);
    ``score_threshold``: the confusion matrix's."""

    def __init__(self, out_dir: str | None = None, pictures_every_n_epochs: int = 0, score_threshold: float = 0.5) -> None:
        super().__init__()
        if pictures_every_n_epochs < 0:
            raise ValueError(f"pictures_every_n_epochs={pictures_every_n_epochs}: give 0 (never during fit) or a count >= 1")
        self.out_dir = out_dir
        self.pictures_every_n_epochs = pictures_every_n_epochs
        self.score_threshold = score_threshold
        #: the files of the last readouts written (for tests and tools)
        self.last_written: list[Path] = []

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.sanity_checking:
            return
        every = self.pictures_every_n_epochs
        full = trainer.state.fn == TrainerFn.VALIDATING or (every > 0 and (trainer.current_epoch + 1) % every == 0)
        self._emit(trainer, pl_module, "val", full)

    def on_test_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._emit(trainer, pl_module, "test", True)

    def folder(self, trainer: Trainer, stage: str) -> Path | None:
        """Where the files go: ``out_dir``, else ``<default_root_dir>/readouts`` when the run has a logger; None
        (no files) for a run without either (``tools/eval.py --trainer.logger false``)."""
        if self.out_dir:
            return Path(self.out_dir) / stage
        return Path(trainer.default_root_dir) / "readouts" / stage if trainer.loggers else None

    def _emit(self, trainer: Trainer, pl_module: LightningModule, stage: str, full: bool) -> None:
        if not isinstance(pl_module, DetectionTask) or not trainer.is_global_zero:
            return
        folder = self.folder(trainer, stage)
        full = full and folder is not None  # the confusion matrix and TIDE only where they are kept
        readouts = pl_module.eval_readouts(stage, full=full, score_threshold=self.score_threshold)
        if readouts is None:
            return
        log.info("%s per-class COCO numbers (epoch %d):\n%s", stage, trainer.current_epoch, readouts.table)
        rows = [[r[c] for c in _TABLE_COLUMNS] for r in readouts.per_class]
        log_table(trainer, f"{stage}/per_class", _TABLE_COLUMNS, rows)
        if folder is None:
            return
        detections = pl_module.metrics[stage].last_results() if full else None
        self.last_written = write_readouts(readouts, folder, pictures=full, detections=detections)
        if full:
            self._log_pictures(trainer, stage, readouts)
            log_files(trainer, self.last_written, f"readouts/{stage}")

    def _log_pictures(self, trainer: Trainer, stage: str, readouts: DetectionReport) -> None:
        from visiontf.io.image_files import open_image

        for path in self.last_written:
            if path.suffix == ".png":
                with open_image(path) as image:
                    log_image(trainer, f"{stage}/readouts/{path.stem}", image.convert("RGB"))
        tensorboards = [lg for lg in trainer.loggers if isinstance(lg, TensorBoardLogger)]
        if not tensorboards:
            return
        arrays = readouts.arrays
        a, m = arrays.area_labels.index("all"), arrays.max_dets.index(100)
        counts = {r["category_id"]: r["num_gt"] for r in readouts.per_class}
        for iou in PR_IOUS:
            t = arrays.iou_index(iou)
            for k, cat_id in enumerate(arrays.cat_ids):
                precision = arrays.precision[t, :, k, a, m]
                if not (precision > -1).any():
                    continue
                curve = pr_curve_counts(precision, arrays.rec_thrs, counts.get(cat_id, 0))
                for tb in tensorboards:
                    tb.experiment.add_pr_curve_raw(f"{stage}_pr_iou{round(iou * 100)}/{readouts.names[cat_id]}",
                                                   num_thresholds=len(arrays.rec_thrs), global_step=trainer.global_step,
                                                   **curve)
