"""The benchmark scripts still run: each core function at toy sizes, rows complete and results equal.

Timings at these sizes mean nothing; what is checked is that ours and the reference still build
from the same weights, agree, and produce rows ``run_all.py`` can tabulate.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/ is not an installed package
from benchmarks import common, detr, matcher, memory, run_all, vit_vs_timm  # noqa: E402


def _check(rows: list[dict], n: int) -> None:
    assert len(rows) == n
    for r in rows:
        assert set(common.ROW_KEYS) <= set(r), r
        assert r["ours_s"] > 0 and r["ref_s"] > 0
        assert r["ratio"] == pytest.approx(r["ref_s"] / r["ours_s"], rel=0.01)
        assert r["same_result"] is True, r
    table = common.format_table(rows)
    assert all(r["benchmark"] in table for r in rows)


def test_time_interleaved_alternates_and_takes_medians():
    calls = []
    t = common.time_interleaved({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, "cpu", warmup=1, repeats=3)
    assert calls == ["a", "b"] * 4
    assert set(t) == {"a", "b"} and all(v >= 0 for v in t.values())


def test_median_of_rounds_alternates_and_takes_the_median_of_what_each_returns(capsys):
    calls, values = [], {"a": iter([3.0, 1.0, 2.0]), "b": iter([0.5, 0.7, 0.1])}

    def measure(name):
        calls.append(name)
        return next(values[name])

    medians = common.median_of_rounds({"a": lambda: measure("a"), "b": lambda: measure("b")}, rounds=3)
    assert calls == ["a", "b"] * 3 and medians == {"a": 2.0, "b": 0.5}
    common.print_against_first(medians)
    assert "0.25x" in capsys.readouterr().out


@pytest.mark.slow
def test_detr_vs_original_and_hf_tiny():
    _check(detr.run(tiny=True), 4)


def test_vit_vs_timm_tiny():
    _check(vit_vs_timm.run(tiny=True), 2)


@pytest.mark.slow
def test_matcher_rows():
    rows = matcher.run(quick=True, device="cpu")
    _check(rows, 1)


@pytest.mark.slow
def test_memory_tiny_in_subprocesses():
    _check(memory.run(tiny=True, hf=False), 1)


def test_run_all_table_and_json(tmp_path, monkeypatch):
    fake = {"a": lambda quick: [common.row("x", 1.0, 2.0, True, "ref")],
            "b": lambda quick: (_ for _ in ()).throw(RuntimeError("boom"))}
    monkeypatch.setattr(run_all, "_benchmarks", lambda device: fake)
    out = tmp_path / "r.json"
    assert run_all.main(["--output", str(out)]) == 1  # a failed benchmark fails the run
    data = json.loads(out.read_text())
    assert data["failed"] == ["b"] and data["rows"][0]["ratio"] == 2.0
    assert data["machine"]["torch"] == torch.__version__


def test_cpu_attention_rows_ours_at_least_as_close_to_float64():
    from benchmarks import cpu_attention

    rows = cpu_attention.run(quick=True, device="cpu")
    _check(rows, len(cpu_attention.QUICK_SIZES))
    # below the threshold ours is float32 rounded once: closer to float64 than bf16 SDPA, not merely as close
    assert rows[0]["max_err_ours"] < rows[0]["max_err_sdpa"]
    # above it, both are SDPA itself
    assert rows[-1]["max_err_ours"] == rows[-1]["max_err_sdpa"]


def test_ipt_train_step_rows_against_the_original_module():
    """The tiled row needs the full-size model (115 M parameters): only the ipt_tiny train step runs here."""
    from benchmarks import ipt

    _check(ipt.run(quick=True, tiled=False), 1)


@pytest.mark.slow
def test_realtime_detr_against_transformers_rows():
    """D-FINE-N at its published size in transformers, loaded into visiontf: eager, fused and onnxruntime rows at one and
    two threads (the second thread count once compared against a table of times instead of transformers' outputs)."""
    pytest.importorskip("transformers")
    from benchmarks import realtime_detr

    rows = realtime_detr.run(models=("dfine_n",), threads=(1, 2), repeats=1, size=320)
    _check(rows, 6)
    assert all(r["queries_agreeing"] >= realtime_detr.AGREE for r in rows)


def test_realtime_detr_builds_transformers_models_of_every_registered_layout():
    """``--models`` takes every registered RT-DETR, RT-DETRv2 and D-FINE name: transformers' model of ``hf_config``
    has, once converted, every tensor of visiontf's model in its shape (both built on the meta device). The encoder's
    width, not the decoder's, feeds the decoder's input projections (R101, D-FINE-X: 384 against 256)."""
    transformers = pytest.importorskip("transformers")
    from benchmarks import realtime_detr
    from visiontf.models import list_models
    from visiontf.models._registry import check_model_arguments
    from visiontf.models.dfine.convert import convert_state_dict as dfine_convert
    from visiontf.models.rtdetr.convert import convert_state_dict as rtdetr_convert

    # the published variants (the CPU recipes' *_tiny take settings transformers' configs do not all have)
    names = [n for n in list_models() if n.startswith(("rtdetr_r", "rtdetrv2_r", "dfine_")) and not n.endswith("_tiny")]
    assert {"rtdetr_r101vd", "rtdetrv2_r101vd", "rtdetrv2_r18vd_dsp", "dfine_x"} <= set(names)
    for name in names:
        ours = check_model_arguments(name, num_classes=realtime_detr.NUM_CLASSES, input_norm="none")
        config = realtime_detr.hf_config(ours, name)
        cls = {"RTDetrConfig": transformers.RTDetrForObjectDetection, "RTDetrV2Config": transformers.RTDetrV2ForObjectDetection,
               "DFineConfig": transformers.DFineForObjectDetection}[type(config).__name__]
        with torch.device("meta"):
            hf = cls(config)
        convert = rtdetr_convert if name.startswith("rtdetr") else dfine_convert
        theirs, own = convert(hf.state_dict(), ours), ours.state_dict()
        assert sorted(theirs) == sorted(own), name
        assert {k: tuple(v.shape) for k, v in theirs.items()} == {k: tuple(v.shape) for k, v in own.items()}, name
        if name.endswith("_dsp"):  # RT-DETRv2's discrete sampling: transformers' own switch, or its outputs differ
            assert config.decoder_method == "discrete", name


def test_realtime_detr_refuses_a_model_it_cannot_compare_in_one_line(capsys):
    from benchmarks import realtime_detr

    for name, refusal in (("nosuch", "unknown model 'nosuch'"), ("rtdetr_tiny", "transformers cannot build this model's settings")):
        with pytest.raises(SystemExit) as e:
            realtime_detr.main(["--models", name])
        assert e.value.code == 2 and f"--models {name}: {refusal}" in capsys.readouterr().err


def test_realtime_step_merges_variants_over_the_config_and_times_a_fit(tmp_path):
    """``realtime_step.py``'s variants are the config's ``model_kwargs`` with theirs merged in (other keys kept), a
    malformed one is refused with the form to use, and one variant's step is timed by a real fit."""
    from benchmarks import realtime_step
    from visiontf.core.config_files import merge_config_data
    from visiontf.tasks.task_table import import_class, synthetic_writers

    base = realtime_step.config_model_kwargs()
    assert base["decoder"]["num_queries"] == 50
    name, over = realtime_step.parse_variant("two levels={encoder: {aifi_levels: [1]}, decoder: {num_levels: 2}}")
    kwargs = merge_config_data(base, over)
    assert name == "two levels" and kwargs["decoder"]["num_levels"] == 2 and kwargs["encoder"] == {"aifi_levels": [1]}
    assert kwargs["decoder"]["num_queries"] == base["decoder"]["num_queries"] and kwargs["num_select"] == base["num_select"]
    for bad in ("no mapping", "x=[1, 2]", "={decoder: {}}"):
        with pytest.raises(SystemExit, match="NAME="):
            realtime_step.parse_variant(bad)
    data = tmp_path / "data"
    import_class(synthetic_writers()["detection"])(data, num_train=8, num_val=2, seed=0)
    seconds = realtime_step.in_process_step(str(data), merge_config_data(base, {"denoising": {"num_denoising": 10}}),
                                            steps=7, run_dir=str(tmp_path / "run"))
    assert 0 < seconds < 60
