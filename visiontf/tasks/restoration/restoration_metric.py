"""A torchmetrics wrapper of :mod:`visiontf.tasks.restoration.restoration_measures`: PSNR-Y / SSIM-Y per task, synchronised under DDP.

Per task it keeps the sums of the per-image scores and the image count (``dist_reduce_fx="sum"``),
so the scores are the mean over images of every rank, as the original's per-dataset mean.
"""
from __future__ import annotations

import torch
from torch import Tensor
from torchmetrics import Metric

from visiontf.tasks.restoration.restoration_measures import calc_psnr, calc_ssim


class RestorationScores(Metric):
    """``update(sr, hr, task, scale)``; ``compute()`` -> ``{"psnr": (T,), "ssim": (T,), "count": (T,)}``
    (NaN for tasks without images). ``bicubic`` updates a second PSNR for a baseline (``update_baseline``)."""

    full_state_update = False

    def __init__(self, num_tasks: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.num_tasks = num_tasks
        for name in ("psnr_sum", "ssim_sum", "count", "base_sum", "base_count"):
            self.add_state(name, default=torch.zeros(num_tasks, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, sr: Tensor, hr: Tensor, task: int, scale: int) -> None:
        self.psnr_sum[task] += calc_psnr(sr, hr, scale).double().sum()
        self.ssim_sum[task] += calc_ssim(sr, hr, scale).double().sum()
        self.count[task] += sr.shape[0]

    def update_baseline(self, sr: Tensor, hr: Tensor, task: int, scale: int) -> None:
        self.base_sum[task] += calc_psnr(sr, hr, scale).double().sum()
        self.base_count[task] += sr.shape[0]

    def compute(self) -> dict[str, Tensor]:
        n = self.count.clamp(min=1)
        nan = torch.full_like(self.count, float("nan"))
        seen = self.count > 0
        base_seen = self.base_count > 0
        return {"psnr": torch.where(seen, self.psnr_sum / n, nan), "ssim": torch.where(seen, self.ssim_sum / n, nan),
                "count": self.count, "bicubic_psnr": torch.where(base_seen, self.base_sum / self.base_count.clamp(min=1), nan)}
