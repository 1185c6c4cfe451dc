"""benchmarks/gpu.py's parts that run without a GPU: the reference op's loader, the budget, the TF32 emulation, the table.

The whole ``--device cpu --tiny`` run takes about ten minutes on a 2-core machine (its output is in
docs/record/speed.md); here the cheap parts and section (c) end to end.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/ is not an installed package
from benchmarks import gpu, gpu_common, gpu_detr_parity, gpu_kernels, reference_cuda_op  # noqa: E402


def test_reference_op_absent_is_said_not_guessed(tmp_path):
    assert reference_cuda_op.load_reference_core(None) is None
    assert reference_cuda_op.describe(None) == "no --ref-op folder given"
    assert "no such folder" in reference_cuda_op.describe(tmp_path / "missing")
    (tmp_path / "torch-0.0.0").mkdir()  # built for another torch only
    assert reference_cuda_op.load_reference_core(tmp_path) is None
    note = reference_cuda_op.describe(tmp_path)
    assert f"nothing built for torch {torch.__version__}" in note and "torch-0.0.0" in note


def test_routing_replaces_and_restores_the_reference_core():
    from reference import deformable_detr as reference_deformable_detr

    before = reference_deformable_detr.original_core
    core = lambda *args: None  # noqa: E731
    with reference_cuda_op.routed_to(core):
        assert reference_deformable_detr.original_core is core
    assert reference_deformable_detr.original_core is before


def test_budget_skips_with_a_note():
    budget = gpu_common.Budget(10.0)
    assert budget.allows("row 1", 5.0)
    assert not budget.allows("row 2", 60.0)
    assert len(budget.notes) == 1 and "row 2" in budget.notes[0]


def test_tf32_rounding_keeps_ten_mantissa_bits_and_the_gradient():
    x = torch.tensor([1.0 + 2**-10, 1.0 + 2**-12, 3.0 + 3 * 2**-11], requires_grad=True)
    rounded = gpu_detr_parity._round_tf32(x)
    assert rounded.tolist() == [1.0 + 2**-10, 1.0, 3.0 + 2**-9]
    rounded.sum().backward()
    assert x.grad.tolist() == [1.0, 1.0, 1.0]


def test_encoder_inputs_sample_near_their_query():
    value, shapes, loc, weights = gpu_kernels.make_inputs("encoder", "tiny", torch.float32, torch.device("cpu"))
    S = sum(h * w for h, w in shapes)
    assert value.shape[1] == S and loc.shape[1] == S  # every position queries
    torch.testing.assert_close(weights.sum((-1, -2)), torch.ones(weights.shape[:3]))
    # the first level's queries sample it within a few pixels (offsets of 2 px std) of their own pixel
    h, w = shapes[0]
    centre_x = (torch.arange(h * w) % w + 0.5).view(1, -1, 1, 1)
    offset_px = loc[:, : h * w, :, 0, :, 0] * w - centre_x
    assert offset_px.abs().max() < 10.0 and offset_px.std() > 0.5


def test_e2e_plan_parses_and_refuses():
    assert gpu._e2e_plan("8:200,4:100") == [(8, 200), (4, 100)]
    with pytest.raises(Exception, match="WORKERS:STEPS"):
        gpu._e2e_plan("8")


@pytest.mark.slow
def test_parity_section_runs_and_writes_the_table(tmp_path):
    """Section (c) at toy size on the CPU: both settings, the float32 one agreeing; the files written."""
    assert gpu.main(["--device", "cpu", "--tiny", "--sections", "c,e", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "gpu_rows.json").read_text())["rows"]
    assert [r["section"] for r in rows] == ["c", "c"]
    assert rows[1]["same_result"] is True and "TF32 off" in rows[1]["benchmark"]
    table = (tmp_path / "gpu_table.md").read_text()
    assert "| c |" in table and "no GPU in this run" in table
