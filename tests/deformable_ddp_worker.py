"""Run by tests/integration/test_deformable_detr_ddp.py: every Deformable DETR variant trained 2 steps under
``DistributedDataParallel(find_unused_parameters=False)`` on 2 CPU processes (gloo).

    python tests/deformable_ddp_worker.py OUT.json

DDP raises at the next forward when a parameter got no gradient in the previous step ("Expected to
have finished reduction in the prior iteration..."), so two steps show whether any parameter of a
variant is left unused. The ``control`` variant adds a parameter the forward never reads: it must
fail, which proves the others could. Rank 0 writes ``{variant: "ok" | error text}`` and whether the
ranks' weights agree afterwards.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

ARCH = {"hidden_dim": 64, "nheads": 2, "enc_layers": 1, "dec_layers": 2, "dim_feedforward": 64, "num_queries": 12}
BACKBONE = {"frozen_bn": False, "freeze_stem": False}
#: each variant's arch switches (over ARCH)
VARIANTS = {
    "plain": {"with_box_refine": False},
    "box_refine": {"with_box_refine": True},
    "two_stage": {"with_box_refine": True, "two_stage": True},
    "control": {"with_box_refine": True},
}


def _batch(rank: int, step: int):
    g = torch.Generator().manual_seed(100 * rank + step)
    images = torch.randn(2, 3, 64, 80, generator=g)
    mask = torch.zeros(2, 64, 80, dtype=torch.bool)
    mask[1, :, 64:] = True
    n = 1 + (rank + step) % 3
    boxes = torch.cat([torch.rand(n, 2, generator=g) * 0.5 + 0.25, torch.rand(n, 2, generator=g) * 0.3 + 0.1], 1)
    targets = [{"labels": torch.randint(0, 3, (n,), generator=g), "boxes": boxes},
               {"labels": torch.zeros(0, dtype=torch.int64), "boxes": torch.zeros(0, 4)}]  # an empty image too
    return images, mask, targets


def _train(name: str, kwargs: dict, rank: int) -> tuple[str, float]:
    from visiontf.models import create_model
    from visiontf.set_prediction import build_criterion

    torch.manual_seed(0)
    model = create_model("deformable_detr_tiny", num_classes=3, backbone=BACKBONE, arch={**ARCH, **kwargs})
    if name == "control":
        model.unused = nn.Linear(2, 2)
    ddp = DDP(model, find_unused_parameters=False)
    criterion = build_criterion(model, 3)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    try:
        for step in range(2):
            images, mask, targets = _batch(rank, step)
            loss = criterion(ddp(images, mask), targets)["loss"]
            opt.zero_grad()
            loss.backward()
            opt.step()
    except RuntimeError as e:
        return str(e).splitlines()[0][:300], float("nan")
    checksum = torch.stack([p.detach().double().sum() for p in model.parameters()]).sum()
    return "ok", float(checksum)


def _worker(rank: int, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    report = {}
    for name, kwargs in VARIANTS.items():
        status, checksum = _train(name, kwargs, rank)
        sums = [None, None]
        dist.all_gather_object(sums, checksum)
        report[name] = {"status": status, "ranks_agree": status == "ok" and sums[0] == sums[1]}
    if rank == 0:
        Path(out).write_text(json.dumps(report, indent=2))
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    # imported once here and forked (nothing has run a kernel yet, so no OpenMP pool to inherit):
    # two fresh interpreters would import torch and visiontf again, most of this script's time
    import visiontf.models  # noqa: F401
    import visiontf.set_prediction  # noqa: F401

    mp.start_processes(_worker, args=(sys.argv[1],), nprocs=2, join=True, start_method="fork")
