"""Benchmark: IPT's tiled inference and a training step, visiontf vs the original design.

Rows (ratio = reference time / ours, > 1: ours faster; identical random weights in both):

* ``<model> tiled x<s> HxW``: ``model(x)`` of a registered model (any size: it tiles itself, each
  distinct 48x48 tile once, ``crop_batch_size`` tiles per call, attention through SDPA) vs the
  official ``forward_chop`` around :class:`reference.ipt.OriginalIPT` (which runs the top
  and left strips' tiles twice, one image at a time, attention by ``nn.MultiheadAttention``).
  ``same_result``: outputs within 0.1 on the 0-255 range (``max_abs_diff`` in that range): 24
  float32 layers of 576 with non-trivial LayerNorms put either side ~0.03 from float64 (the small
  models agree to < 1e-5 on [0, 1] in ``tests/models/ipt/test_ipt_model.py``).
* ``ipt_tiny train step``: forward, L1 loss, backward and an Adam step on a batch of LR crops, ours
  vs the reference module built with the same settings (the original has no training code).

    .venv/bin/python benchmarks/ipt.py [--quick] [--device cuda] [--size 256]

The full size (``ipt_sr_x2``: 12 + 12 layers of 576 wide on 256 tokens, a 256x256 input is 361
tiles) takes minutes per call on a 2-core CPU; ``--quick`` runs a 96x96 input.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from reference import ipt as ref  # noqa: E402

from benchmarks.common import cli, max_abs_diff, pick_device, row, time_interleaved  # noqa: E402
from visiontf.models import create_model  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from ipt_helpers import randomized_reference  # noqa: E402  (non-trivial LayerNorms and biases, as the tests)

from visiontf.models.ipt.convert import convert_state_dict  # noqa: E402

#: ipt_tiny's settings in the reference's arguments
TINY = dict(n_feats=8, patch_dim=4, num_heads=4, num_layers=2)


def _pair(name: str, reference_kwargs: dict, device: torch.device):
    theirs = randomized_reference(**reference_kwargs)
    ours = create_model(name).eval()
    ours.load_state_dict(convert_state_dict(theirs.state_dict(), ours))
    return ours.to(device), theirs.to(device)


def _tiled_rows(quick: bool, device: torch.device, size: int | None) -> list[dict]:
    size = size or (96 if quick else 256)
    ours, theirs = _pair("ipt_sr_x2", dict(scales=(2,), n_feats=64, num_heads=12, num_layers=12, patch_dim=3), device)
    torch.manual_seed(1)
    x = torch.rand(1, 3, size, size, device=device)
    with torch.no_grad():
        def run_ours():
            return ours(x) * 255.0

        def run_ref():
            return ref.forward_chop(theirs, x * 255.0, crop_batch_size=64)

        diff = max_abs_diff(run_ours(), run_ref())
        t = time_interleaved({"ours": run_ours, "ref": run_ref}, device, warmup=0 if not quick else 1,
                             repeats=1 if not quick else 2)
    return [row(f"ipt_sr_x2 tiled x2 {size}x{size}", t["ours"], t["ref"], diff < 0.1,
                "official forward_chop + model", max_abs_diff=diff,
                params_m=round(sum(p.numel() for p in ours.parameters()) / 1e6, 2))]


def _train_step_rows(quick: bool, device: torch.device) -> list[dict]:
    ours, theirs = _pair("ipt_tiny", dict(scales=(2,), **TINY), device)
    ours.train()
    theirs.train()
    batch = 4 if quick else 16
    torch.manual_seed(2)
    lr_img = torch.rand(batch, 3, 48, 48, device=device)
    hr_img = F.interpolate(lr_img, scale_factor=2, mode="bicubic", align_corners=False).clamp(0, 1)
    opts = {"ours": torch.optim.Adam(ours.parameters(), lr=1e-4), "ref": torch.optim.Adam(theirs.parameters(), lr=1e-4)}

    def step_ours():
        loss = F.l1_loss(ours(lr_img), hr_img)
        opts["ours"].zero_grad(set_to_none=True)
        loss.backward()
        opts["ours"].step()

    def step_ref():  # the original works in 0-255
        loss = F.l1_loss(theirs(lr_img * 255.0), hr_img * 255.0) / 255.0
        opts["ref"].zero_grad(set_to_none=True)
        loss.backward()
        opts["ref"].step()

    with torch.no_grad():
        ours.eval(), theirs.eval()
        same = max_abs_diff(ours(lr_img[:1]) * 255.0, theirs(lr_img[:1] * 255.0)) < 1e-3
        ours.train(), theirs.train()
    t = time_interleaved({"ours": step_ours, "ref": step_ref}, device, warmup=1 if quick else 3, repeats=3 if quick else 20)
    return [row(f"ipt_tiny train step, batch {batch} of 48x48", t["ours"], t["ref"], same,
                "the original module, same settings")]


def run(quick: bool = False, device: str = "cpu", size: int | None = None, tiled: bool = True) -> list[dict]:
    dev = pick_device(device)
    return (_tiled_rows(quick, dev, size) if tiled else []) + _train_step_rows(quick, dev)


def _extra(p: argparse.ArgumentParser) -> None:
    p.add_argument("--size", type=int, default=None, help="input side of the tiled row (default 256, 96 with --quick)")


def _run_and_print_details(quick: bool = False, device: str = "cpu", size: int | None = None) -> list[dict]:
    rows = run(quick, device, size)
    for r in rows:
        extra = {k: v for k, v in r.items() if k in ("max_abs_diff", "params_m")}
        if extra:
            print(r["benchmark"], extra)
    return rows


if __name__ == "__main__":
    raise SystemExit(cli(_run_and_print_details, __doc__, extra=_extra))
