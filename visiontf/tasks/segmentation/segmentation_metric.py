"""Semantic segmentation metrics as mmsegmentation computes them, from a dataset-level confusion matrix."""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def segmentation_scores(confmat: Tensor) -> dict[str, Tensor]:
    """mmseg's metrics from a dataset-level confusion matrix (rows: ground truth, columns: prediction).

    Per class: IoU = TP / (GT + pred - TP) and Acc = TP / GT; a class whose union (for IoU) or
    ground truth (for Acc) is empty over the whole set is NaN and left out of the means.
    ``aAcc`` = correct / labelled pixels.
    """
    cm = confmat.double()
    tp = cm.diagonal()
    gt, pred = cm.sum(1), cm.sum(0)
    union = gt + pred - tp
    nan = torch.full_like(tp, float("nan"))
    iou = torch.where(union > 0, tp / union.clamp_min(1), nan)
    acc = torch.where(gt > 0, tp / gt.clamp_min(1), nan)
    total = gt.sum()
    return {
        "IoU": iou,
        "Acc": acc,
        "mIoU": iou.nanmean() if (union > 0).any() else torch.tensor(float("nan"), dtype=cm.dtype),
        "mAcc": acc.nanmean() if (gt > 0).any() else torch.tensor(float("nan"), dtype=cm.dtype),
        "aAcc": tp.sum() / total if total > 0 else torch.tensor(float("nan"), dtype=cm.dtype),
    }


def format_table(names: Sequence[str], iou: Tensor, acc: Tensor) -> str:
    """A per-class IoU / Acc table in percent, like mmseg's evaluation printout."""
    width = max([len("Class")] + [len(n) for n in names])
    lines = [f"{'Class':<{width}} | {'IoU':>6} | {'Acc':>6}", f"{'-' * width}-+-{'-' * 6}-+-{'-' * 6}"]
    for n, i, a in zip(names, iou.tolist(), acc.tolist()):
        lines.append(f"{n:<{width}} | {i * 100:6.2f} | {a * 100:6.2f}")
    return "\n".join(lines)
