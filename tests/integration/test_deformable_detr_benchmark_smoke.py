"""The Deformable DETR benchmark still runs: toy sizes, both designs from the same weights, rows complete.

Timings at these sizes mean nothing; what is checked is that ours and the original design still
build from one state dict, agree (loss, a gradient, outputs) and give rows ``run_all.py`` tabulates.
Cost: about 15 s (the memory row starts two subprocesses), hence ``slow``.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/ is not an installed package
from benchmarks import common, deformable_detr, run_all  # noqa: E402


@pytest.mark.slow
def test_deformable_detr_vs_original_tiny():
    rows = deformable_detr.run(tiny=True)
    assert [r["benchmark"].split(" b2")[0] for r in rows] == [
        "deformable_detr_r50_box_refine train step", "deformable_detr_r50_box_refine inference",
        "deformable_detr_r50_box_refine train step peak memory", "ms_deform_attn encoder fwd+bwd", "ms_deform_attn decoder fwd+bwd",
    ]
    for r in rows:
        assert set(common.ROW_KEYS) <= set(r) and r["ours_s"] > 0 and r["ref_s"] > 0
        assert r["same_result"] is True, r
    assert rows[2]["unit"] == "MiB"
    assert all(r["benchmark"] in common.format_table(rows) for r in rows)


def test_run_all_lists_it():
    assert "deformable_detr" in run_all._benchmarks("cpu")
