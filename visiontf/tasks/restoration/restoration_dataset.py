"""Restoration datasets: (low-quality, clean, task) triples, random aligned crops, degradations on the fly.

Degradations, by task name (the model's, :data:`visiontf.models.ipt.task_names.PRETRAIN_TASKS`):

* ``sr_x{s}``: the low-resolution image is the dataset's file when it has one, else the benchmark
  bicubic downscale of the whole clean image (:func:`visiontf.data.transforms.imresize.bicubic_downscale`,
  MATLAB's antialiased ``imresize``), computed once per image;
* ``denoise_sigma{n}``: ``clean + N(0, n^2)`` on the 0-255 scale, clamped to [0, 255] and not
  quantized (the original's test protocol); validation noise is seeded per image, so every
  validation sees the same noisy images;
* ``derain`` (and any other task): only from a paired set (``layout: paired``).

Training samples are ``patch_size`` low-quality crops (48, the original ``--patch_size``) with the
clean crop ``scale`` times larger at the same place, flipped horizontally, vertically and
transposed (each with probability 1/2, EDSR's ``augment``). Every random draw of a sample comes from
(seed, epoch, index) and the task of a batch from (seed, epoch, batch), so a resumed run draws the
same crops and tasks (:class:`visiontf.data.loading.AugmentedDataset`).
"""
from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from visiontf.data.loading import AugmentedDataset, DatasetLayoutError, EpochIndex, sample_seed
from visiontf.data.transforms.imresize import bicubic_downscale
from visiontf.tasks.restoration.restoration_files import ImageReadError, ImageRecord, probe, read_rgb8

log = logging.getLogger(__name__)


def degradation(task: str) -> tuple[str, float]:
    """``("sr", scale)``, ``("noise", sigma)`` or ``("paired", 1)`` for a task name."""
    if m := re.fullmatch(r"sr_x(\d+)", task):
        return "sr", int(m.group(1))
    if m := re.fullmatch(r"denoise_sigma(\d+(?:\.\d+)?)", task):
        return "noise", float(m.group(1))
    return "paired", 1


def task_scale(task: str) -> int:
    kind, value = degradation(task)
    return int(value) if kind == "sr" else 1


def add_noise(clean: np.ndarray, sigma: float, rng: np.random.Generator) -> np.ndarray:
    """float32 (H, W, 3) on 0-255: ``clean + sigma * N(0, 1)`` clamped to [0, 255] (IPT's test protocol)."""
    noisy = clean.astype(np.float32) + rng.standard_normal(clean.shape, dtype=np.float32) * np.float32(sigma)
    return np.clip(noisy, 0, 255)


def check_records(records: list[ImageRecord], min_size: int, strict: bool, what: str) -> list[ImageRecord]:
    """Probe every file: unreadable and too small images are skipped (counted, logged) or, ``strict``, an error;
    conversions (grayscale, alpha, 16-bit) are counted and logged."""
    kept, skipped, converted = [], Counter(), Counter()
    examples: dict[str, str] = {}
    for r in records:
        try:
            r.size, r.mode, conversion = probe(r.hr)
            for p in r.lq.values():
                probe(p)
        except ImageReadError as e:
            if strict:
                raise
            skipped["unreadable"] += 1
            examples.setdefault("unreadable", str(e))
            continue
        if min(r.size) < min_size:
            message = f"{r.hr}: {r.size[1]}x{r.size[0]} px, smaller than the {min_size}-px training crop"
            if strict:
                raise DatasetLayoutError(message + "; remove it or lower patch_size")
            skipped["too small"] += 1
            examples.setdefault("too small", message)
            continue
        if conversion:
            converted[conversion] += 1
            examples.setdefault(conversion, str(r.hr))
        kept.append(r)
    for kind, n in skipped.items():
        log.warning("%s: skipped %d %s image(s), e.g. %s", what, n, kind, examples[kind])
    for kind, n in converted.items():
        log.info("%s: %d image(s) %s, e.g. %s", what, n, kind, examples[kind])
    if not kept:
        raise DatasetLayoutError(f"{what}: no usable image ({dict(skipped)} skipped)")
    return kept


def _augment(arrays: list[np.ndarray], rng: np.random.Generator) -> list[np.ndarray]:
    hflip, vflip, rot = rng.random(3) < 0.5
    out = []
    for a in arrays:
        if hflip:
            a = a[:, ::-1]
        if vflip:
            a = a[::-1]
        if rot:
            a = a.transpose(1, 0, 2)
        out.append(a)
    return out


def to_tensor(a: np.ndarray) -> Tensor:
    """(H, W, 3) on 0-255 -> float32 (3, H, W) in [0, 1]."""
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)).permute(2, 0, 1).div_(255.0)


class RestorationDataset(AugmentedDataset):
    """``(lq (3, h, w), clean (3, h*s, w*s), task index)`` float32 in [0, 1].

    Args:
        records: images (:func:`visiontf.tasks.restoration.restoration_files.find_records`).
        tasks: task names; a training batch has one task (drawn per batch, uniformly), validation
            enumerates every (image, task).
        train: random crops and flips; else whole images (the clean one cut to a multiple of the scale,
            or its centre ``val_crop`` pixels when given).
        cache: keep decoded images (and computed LR images) in memory.
    """

    def __init__(self, records: list[ImageRecord], tasks: Sequence[str], train: bool, patch_size: int = 48,
                 augment: bool = True, repeat: int = 1, seed: int = 0, cache: bool = True, val_crop: int | None = None):
        self.records, self.tasks, self.train = list(records), list(tasks), train
        self.patch_size, self.augment, self.repeat, self.seed = patch_size, augment, max(1, repeat), seed
        self.cache, self.val_crop = cache, val_crop
        self._images: dict[tuple[int, str], np.ndarray] = {}
        for t in self.tasks:
            if degradation(t)[0] == "paired" and any(t not in r.lq for r in self.records):
                raise DatasetLayoutError(f"task {t!r} needs paired images (layout: paired with lq_dir / gt_dir); "
                                         f"only super-resolution (sr_xN) and denoising (denoise_sigmaN) are made on the fly")

    def __len__(self) -> int:
        return len(self.records) * self.repeat if self.train else len(self.records) * len(self.tasks)

    # ------------------------------------------------------------------ images
    def _image(self, i: int, task: str | None) -> np.ndarray:
        """The clean image (task None) or the task's low-quality file / bicubic image, uint8 (H, W, 3)."""
        key = (i, task or "")
        if key in self._images:
            return self._images[key]
        r = self.records[i]
        if task is None:
            img = read_rgb8(r.hr)
        elif task in r.lq:
            img = read_rgb8(r.lq[task])
        else:  # bicubic on the fly
            img = bicubic_downscale(self._image(i, None), task_scale(task))
        if self.cache:
            self._images[key] = img
        return img

    def _pair(self, i: int, task: str) -> tuple[np.ndarray, np.ndarray]:
        """(lq or None for noise, clean cut to lq * scale) as stored."""
        kind, _ = degradation(task)
        hr = self._image(i, None)
        if kind == "noise":
            return hr, hr
        s = task_scale(task)
        lq = self._image(i, task)
        h, w = lq.shape[:2]
        if hr.shape[0] < h * s or hr.shape[1] < w * s:
            raise DatasetLayoutError(f"{self.records[i].hr}: {hr.shape[1]}x{hr.shape[0]} px, but its low-quality image "
                                     f"is {w}x{h} at scale {s}; the files do not belong together")
        return lq, hr[: h * s, : w * s]

    # ------------------------------------------------------------------ samples
    def task_of(self, key: int | EpochIndex) -> int:
        """Training: the batch's task (shared by the batch); a plain key: drawn from the sample's seed."""
        if len(self.tasks) == 1:
            return 0
        u = self.batch_draw(key)
        if u is None:
            u = sample_seed(self.seed, int(key if not isinstance(key, EpochIndex) else key.index), 7) / 2**32
        return min(int(u * len(self.tasks)), len(self.tasks) - 1)

    def __getitem__(self, key: int | EpochIndex) -> tuple[Tensor, Tensor, int]:
        if not self.train:
            index = int(key)
            i, t = divmod(index, len(self.tasks))
            return self._eval_item(i, t)
        index = int(key.index if isinstance(key, EpochIndex) else key)
        epoch = int(key.epoch) if isinstance(key, EpochIndex) else 0
        t = self.task_of(key)
        rng = np.random.default_rng(sample_seed(self.seed, epoch, index))
        return self._train_item(index % len(self.records), t, rng)

    def _train_item(self, i: int, t: int, rng: np.random.Generator) -> tuple[Tensor, Tensor, int]:
        task = self.tasks[t]
        kind, value = degradation(task)
        lq, hr = self._pair(i, task)
        s, p = task_scale(task), self.patch_size
        h, w = lq.shape[:2]
        if min(h, w) < p:
            raise DatasetLayoutError(f"{self.records[i].hr}: its {task} input is {w}x{h} px, smaller than patch_size {p}")
        y, x = int(rng.integers(0, h - p + 1)), int(rng.integers(0, w - p + 1))
        lq_c, hr_c = lq[y : y + p, x : x + p], hr[y * s : (y + p) * s, x * s : (x + p) * s]
        if kind == "noise":
            lq_c = add_noise(hr_c, value, rng)
        if self.augment:
            lq_c, hr_c = _augment([lq_c, hr_c], rng)
        return to_tensor(lq_c), to_tensor(hr_c), t

    def _eval_item(self, i: int, t: int) -> tuple[Tensor, Tensor, int]:
        task = self.tasks[t]
        kind, value = degradation(task)
        lq, hr = self._pair(i, task)
        s = task_scale(task)
        if self.val_crop:
            c = self.val_crop // s
            h, w = lq.shape[:2]
            y, x = max(0, (h - c) // 2), max(0, (w - c) // 2)
            lq, hr = lq[y : y + c, x : x + c], hr[y * s : (y + c) * s, x * s : (x + c) * s]
        if kind == "noise":
            lq = add_noise(hr, value, np.random.default_rng(sample_seed(self.seed, i, t, 0x5EED)))
        return to_tensor(lq), to_tensor(hr), t


def restoration_collate(batch: list[tuple[Tensor, Tensor, int]]) -> tuple[Tensor, Tensor, Tensor]:
    """Stack a batch of one task (same sizes): ``(lq (B, 3, h, w), clean (B, 3, H, W), task (B,))``."""
    lq, hr, task = zip(*batch)
    if len({x.shape for x in lq}) > 1 or len(set(task)) > 1:
        raise ValueError("a restoration batch mixes tasks or image sizes; validate with val_batch_size 1 "
                         "or a val_crop")
    return torch.stack(lq), torch.stack(hr), torch.tensor(task, dtype=torch.int64)


__all__ = ["RestorationDataset", "add_noise", "check_records", "degradation", "restoration_collate", "task_scale"]
