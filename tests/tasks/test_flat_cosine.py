"""DEIM's flat-cosine learning rate (``schedule: flat_cosine`` with a ``flat_cosine`` section): the curve's values against
the facts of DEIM's ``flat_cosine_schedule`` (quadratic warm-up, flat until ``flat_epoch``, a cosine to ``lr_gamma`` x
the rate until ``no_aug_epoch`` epochs before the end, flat after), per parameter group, and the configs that use it."""
from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from visiontf.core.config_checks import ConfigError
from visiontf.core.config_files import read_config
from visiontf.tasks.detection.detection_task import DetectionTask
from visiontf.tasks.optim import FlatCosine, build_flat_cosine

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
#: 10 steps an epoch, 20 epochs (200 steps), flat until epoch 8 (step 80), the last 4 epochs (from step 160) at the floor
SPE, EPOCHS, WARMUP = 10, 20, 5
SCHEDULE = FlatCosine(flat_epochs=8, no_aug_epochs=4, min_ratio=0.5)


@pytest.mark.parametrize(("step", "factor"), [
    (0, 0.0), (1, 0.04), (3, 0.36), (5, 1.0),  # quadratic warm-up, (step / warmup) ** 2 up to and with step == warmup
    (6, 1.0), (80, 1.0),  # flat up to and with the flat step
    (120, 0.75),  # half-way down the cosine from 80 to 160: 0.5 + 0.5 * 0.5 * (1 + cos(pi / 2))
    (100, 0.5 + 0.25 * (1 + math.cos(math.pi / 4))),
    (160, 0.5), (199, 0.5), (250, 0.5),  # the last no_aug epochs (and beyond) at lr_gamma x the rate
])
def test_the_curve_has_deims_values(step, factor):
    assert SCHEDULE.factor(step, SPE, EPOCHS, WARMUP) == pytest.approx(factor, abs=1e-12)


def test_the_cosine_falls_monotonically_between_flat_and_floor():
    values = [SCHEDULE.factor(s, SPE, EPOCHS, WARMUP) for s in range(80, 161)]
    assert all(a > b for a, b in zip(values, values[1:])) and values[0] == 1.0 and values[-1] == 0.5


def test_linear_warmup_and_a_flat_past_the_end():
    assert FlatCosine(8, 4, 0.5, warmup="linear").factor(3, SPE, EPOCHS, WARMUP) == pytest.approx(0.6)
    never = FlatCosine(7800, 12, 1.0)  # DEIM-D-FINE-N: flat_epoch 7800 of 160, lr_gamma 1
    assert [never.factor(s, 1000, 160, 2000) for s in (2000, 5000, 148_000, 159_999)] == [1.0] * 4


def test_each_group_follows_the_curve_at_its_own_rate():
    a, b = torch.nn.Parameter(torch.zeros(1)), torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([{"params": [a], "lr": 1e-3}, {"params": [b], "lr": 1e-4}], lr=1e-3)
    sched = build_flat_cosine(opt, SCHEDULE, SPE, EPOCHS, WARMUP)["scheduler"]
    seen = []
    for _ in range(130):
        seen.append([g["lr"] for g in opt.param_groups])
        opt.step()
        sched.step()
    assert seen[3] == pytest.approx([0.36e-3, 0.36e-4]) and seen[120] == pytest.approx([0.75e-3, 0.75e-4])


def test_the_task_builds_it_from_its_section(monkeypatch):
    task = DetectionTask("rtdetr_tiny", num_classes=3, lr=1e-3, lr_backbone=1e-4, schedule="flat_cosine", warmup_steps=WARMUP,
                         flat_cosine={"flat_epochs": 8, "no_aug_epochs": 4, "min_ratio": 0.5})
    monkeypatch.setattr(DetectionTask, "trainer", SimpleNamespace(max_epochs=EPOCHS), raising=False)
    monkeypatch.setattr(task, "_trainer", object())
    monkeypatch.setattr(task, "steps_per_epoch", lambda: SPE)
    out = task.configure_optimizers()
    sched, opt = out["lr_scheduler"]["scheduler"], out["optimizer"]
    assert out["lr_scheduler"]["interval"] == "step"
    for _ in range(120):
        opt.step()
        sched.step()
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.75e-3, 0.75e-4])


def test_the_section_and_the_schedule_go_together():
    with pytest.raises(ConfigError, match="flat_cosine"):
        DetectionTask("rtdetr_tiny", num_classes=3, schedule="flat_cosine")
    with pytest.raises(ConfigError, match="flat_cosine"):
        DetectionTask("rtdetr_tiny", num_classes=3, schedule="constant", flat_cosine={"flat_epochs": 3})
    with pytest.raises(ConfigError, match="min_ratio"):
        DetectionTask("rtdetr_tiny", num_classes=3, schedule="flat_cosine", flat_cosine={"flat_epochs": 3, "min_ratio": 2})


#: DEIM's (epoches, flat_epoch, no_aug_epoch, lr_gamma) of configs/deim_dfine/deim_hgnetv2_*_coco.yml (and base/deim.yml)
DEIM = {"n": (160, 7800, 12, 1.0), "s": (132, 64, 12, 0.5), "m": (102, 49, 12, 0.5), "l": (58, 29, 8, 0.5), "x": (58, 29, 8, 0.5)}


@pytest.mark.parametrize("size", sorted(DEIM))
def test_deim_configs_use_it(size):
    epochs, flat, tail, gamma = DEIM[size]
    cfg = read_config(CONFIGS / "deim" / f"deim_dfine_hgnetv2_{size}_coco.yaml")
    args = cfg["model"]["init_args"]
    assert cfg["trainer"]["max_epochs"] == epochs and args["schedule"] == "flat_cosine" and args["warmup_steps"] == 2000
    assert FlatCosine.of(args["flat_cosine"]) == FlatCosine(flat, tail, gamma, "quadratic")
