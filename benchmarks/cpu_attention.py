"""Benchmark: attention under CPU bf16 autocast, visiontf's float32 path against torch's SDPA in bf16.

Under ``torch.autocast("cpu", dtype=torch.bfloat16)`` torch runs ``F.scaled_dot_product_attention`` in bf16.
``visiontf.nn.scaled_dot_product_attention`` computes attention of up to ``CPU_FLOAT32_ATTENTION_PAIRS``
query-key pairs a head in float32 instead (rounded once to bf16). Rows:

* ``attention L x S, d``: forward and backward of one attention call (batch 4, 8 heads) at DETR-decoder and
  small-ViT sizes, and above the threshold (where both are SDPA in bf16, so the ratio is about 1). "same result":
  ours is at least as close to float64 attention as SDPA's bf16 output.
* ``--step``: the median training step of ``configs/rtdetr/rtdetr_tiny_shapes.yaml`` in one process (Lightning,
  the recipe's batch of 4), with the float32 path and with it switched off (the threshold set to 0, so every
  attention is SDPA in bf16), alternating over ``--rounds``. Needs a detection set
  (``tools/make_synthetic.py --task detection --preset demo``).

    .venv/bin/python benchmarks/cpu_attention.py [--quick] [--step --data data/demo_det --steps 40 --rounds 2]
"""
from __future__ import annotations

import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import cli, row, time_interleaved  # noqa: E402
from visiontf.nn import attention  # noqa: E402

SIZES = [(100, 100, 16), (150, 150, 32), (300, 300, 32), (197, 197, 64), (1024, 1024, 32)]
QUICK_SIZES = [(100, 100, 16), (197, 197, 64), (1024, 1024, 32)]
STEP_CONFIG = "configs/rtdetr/rtdetr_tiny_shapes.yaml"


def attention_rows(quick: bool) -> list[dict]:
    rows = []
    g = torch.Generator().manual_seed(0)
    for L, S, d in QUICK_SIZES if quick else SIZES:
        q, k, v = (torch.randn(4, 8, n, d, generator=g).requires_grad_() for n in (L, S, S))

        def fwd_bwd(fn, q=q, k=k, v=v):
            def call():
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    out = fn(q, k, v)
                out.float().sum().backward()
                return out
            return call

        ours, sdpa = fwd_bwd(attention.scaled_dot_product_attention), fwd_bwd(F.scaled_dot_product_attention)
        exact = F.scaled_dot_product_attention(q.double(), k.double(), v.double())
        err_ours = (ours().double() - exact).abs().max().item()
        err_sdpa = (sdpa().double() - exact).abs().max().item()
        t = time_interleaved({"ours": ours, "sdpa": sdpa}, repeats=3 if quick else 7)
        rows.append(row(f"attention {L} x {S}, d {d} (fwd+bwd)", t["ours"], t["sdpa"], err_ours <= err_sdpa,
                        "SDPA under bf16 autocast", max_err_ours=err_ours, max_err_sdpa=err_sdpa))
    return rows


def step_time(data: str, steps: int, float32_pairs: int) -> float:
    from benchmarks.precision_step import median_step

    saved = attention.CPU_FLOAT32_ATTENTION_PAIRS
    attention.CPU_FLOAT32_ATTENTION_PAIRS = float32_pairs
    try:
        return median_step(["--config", STEP_CONFIG, f"--data.init_args.root={data}", "--trainer.devices=1",
                            "--trainer.strategy=auto", f"--trainer.max_steps={steps}", "--trainer.limit_val_batches=0",
                            "--trainer.logger=false", "--trainer.enable_progress_bar=false",
                            "--trainer.default_root_dir=outputs/bench_cpu_attention"])
    finally:
        attention.CPU_FLOAT32_ATTENTION_PAIRS = saved


def run(quick: bool, device: str, step: bool = False, data: str | None = None, steps: int = 40, rounds: int = 2) -> list[dict]:
    if device != "cpu":
        raise ValueError("cpu_attention times the CPU's bf16 attention; run it with --device cpu")
    rows = attention_rows(quick)
    if step:
        if data is None:
            raise ValueError("--step needs --data (a detection set: tools/make_synthetic.py --task detection --preset demo)")
        ours, ref = [], []
        for _ in range(rounds):
            ours.append(step_time(data, steps, attention.CPU_FLOAT32_ATTENTION_PAIRS))
            ref.append(step_time(data, steps, 0))
        rows.append(row(f"rtdetr_tiny_shapes train step ({steps} steps x {rounds} rounds)", statistics.median(ours),
                        statistics.median(ref), True, "every attention SDPA in bf16"))
    return rows


def _extra(p) -> None:
    p.add_argument("--step", action="store_true", help="also time the CPU recipe's training step")
    p.add_argument("--data", default=None, help="a detection set for --step")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--rounds", type=int, default=2)


if __name__ == "__main__":
    sys.exit(cli(run, __doc__, extra=_extra))
