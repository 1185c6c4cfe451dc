"""bf16 on the CPU only where it is native (visiontf.cli.cpu_precision): a config asking for bf16-mixed
trains in its precision_without_native_bf16 on a CPU that would emulate bf16."""
from __future__ import annotations

import logging

import pytest

from visiontf.cli import cpu_precision
from visiontf.cli.cpu_precision import cpu_has_native_bf16, resolve_cpu_precision

# /proc/cpuinfo lines of real machines (flags shortened)
AMD_ZEN2 = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse sse2 avx f16c fma avx2 sha_ni\n"
INTEL_SPR = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512bw avx512_bf16 amx_bf16 amx_tile amx_int8\n"
INTEL_SKX = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512bw avx512vl avx512_vnni\n"  # AVX512 without bf16
ARM_V8_6 = "processor\t: 0\nFeatures\t: fp asimd evtstrm aes sha2 crc32 atomics bf16 i8mm\n"
ARM_V8_2 = "processor\t: 0\nFeatures\t: fp asimd evtstrm aes crc32 atomics\n"


@pytest.mark.parametrize("cpuinfo, native", [(AMD_ZEN2, False), (INTEL_SPR, True), (INTEL_SKX, False),
                                             (ARM_V8_6, True), (ARM_V8_2, False), ("", False)])
def test_native_bf16_read_from_cpu_flags(cpuinfo, native):
    assert cpu_has_native_bf16(cpuinfo) is native


@pytest.mark.parametrize("value, native", [("1", True), ("0", False)])
def test_environment_forces_either_cpu_kind(monkeypatch, value, native):
    monkeypatch.setenv(cpu_precision.NATIVE_BF16_ENV, value)
    assert cpu_has_native_bf16() is native
    assert resolve_cpu_precision("bf16-mixed", "cpu", "32-true") == ("bf16-mixed" if native else "32-true")
    assert cpu_has_native_bf16(AMD_ZEN2) is False  # given text is read as given


def test_the_log_line_says_what_decided(monkeypatch, caplog):
    """The environment override is named as the reason, not the CPU flags it stands in for."""
    monkeypatch.delenv(cpu_precision.NATIVE_BF16_ENV, raising=False)
    with caplog.at_level(logging.INFO, logger="visiontf.cli.cpu_precision"):
        resolve_cpu_precision("bf16-mixed", "cpu", "32-true", native_bf16=False)
        monkeypatch.setenv(cpu_precision.NATIVE_BF16_ENV, "0")
        resolve_cpu_precision("bf16-mixed", "cpu", "32-true")
    flags, forced = [r.getMessage() for r in caplog.records]
    assert "flag in /proc/cpuinfo" in flags and "VISIONTF_NATIVE_BF16=0" in forced and "cpuinfo" not in forced


def test_environment_value_other_than_0_or_1_is_refused(monkeypatch):
    monkeypatch.setenv(cpu_precision.NATIVE_BF16_ENV, "yes")
    with pytest.raises(ValueError, match="VISIONTF_NATIVE_BF16='yes'"):
        cpu_has_native_bf16()


@pytest.mark.parametrize("precision, accelerator, fallback, native, expected", [
    ("bf16-mixed", "cpu", "32-true", False, "32-true"),     # emulated bf16: the fallback
    ("bf16-true", "cpu", "32-true", False, "32-true"),
    ("bf16-mixed", "cpu", "32-true", True, "bf16-mixed"),   # native: as asked
    ("bf16-mixed", "cpu", None, False, "bf16-mixed"),       # no fallback named: Lightning's semantics
    ("32-true", "cpu", "16-mixed", False, "32-true"),       # not a bf16 precision: untouched
    (None, "cpu", "32-true", False, None),
    ("bf16-mixed", "gpu", "32-true", False, "bf16-mixed"),  # the GPU's bf16 is not the CPU's
])
def test_resolve_cpu_precision(precision, accelerator, fallback, native, expected):
    assert resolve_cpu_precision(precision, accelerator, fallback, native_bf16=native) == expected


def test_fallback_is_logged_once(caplog):
    with caplog.at_level(logging.INFO, logger="visiontf.cli.cpu_precision"):
        resolve_cpu_precision("bf16-mixed", "cpu", "32-true", native_bf16=False)
        resolve_cpu_precision("bf16-mixed", "cpu", "32-true", native_bf16=True)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "bf16-mixed -> 32-true" in lines[0] and "precision_without_native_bf16" in lines[0]


@pytest.mark.parametrize("native, expected", [(False, "32-true"), (True, "bf16-mixed")])
def test_cpu_recipe_precision_follows_the_cpu(monkeypatch, tmp_path, native, expected):
    """The CPU recipe's config asks for bf16-mixed: its Trainer gets it only on a CPU with native bf16."""
    from visiontf.cli.train import make_cli
    from visiontf.tasks.detection.detection_synthetic import make_detection_dataset

    root = tmp_path / "data"
    make_detection_dataset(root, num_train=2, num_val=1, image_size=(48, 64), num_classes=2)
    monkeypatch.setattr(cpu_precision, "cpu_has_native_bf16", lambda: native)
    cli = make_cli(["--config", "configs/deformable_detr/deformable_detr_tiny_shapes.yaml", f"--data.init_args.root={root}",
                    f"--trainer.default_root_dir={tmp_path / 'run'}", "--trainer.logger=false"], run=False)
    assert cli.trainer.precision == expected
