"""bf16 on the CPU only where the CPU computes it natively.

bf16 autocast is a speed-up on a CPU with bf16 instructions (AVX512-BF16 or AMX on x86, the ``bf16``
feature on Arm) and a large slow-down elsewhere, where oneDNN emulates it: the CPU recipe
(``configs/deformable_detr/deformable_detr_tiny_shapes.yaml``) makes an order of magnitude fewer steps
under emulated bf16 (docs/record/speed.md#measurements-behind-comments-in-the-code). A config that asks for bf16 can
name, in the top-level key ``precision_without_native_bf16``, the precision to train and evaluate
with on CPUs without it; :func:`resolve_cpu_precision` applies it (one log line when it does).
``VISIONTF_NATIVE_BF16=1`` (or ``0``) overrides what ``/proc/cpuinfo`` says, so that either path can be
run, and tested, on any machine.
"""
from __future__ import annotations

import logging
import os
import platform
from pathlib import Path

import torch

log = logging.getLogger(__name__)

#: /proc/cpuinfo flags of native bf16 arithmetic (x86: AVX512-BF16, AMX-BF16; Arm: FEAT_BF16)
NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})
#: set to 1 or 0, it stands in for the flags of /proc/cpuinfo
NATIVE_BF16_ENV = "VISIONTF_NATIVE_BF16"


def cpu_has_native_bf16(cpuinfo: str | None = None) -> bool:
    """Whether this CPU has bf16 instructions, read from the flags of ``/proc/cpuinfo`` (or the
    given text, or :data:`NATIVE_BF16_ENV`). Where they cannot be read (not Linux), False: float32 is
    never the slow choice."""
    forced = os.environ.get(NATIVE_BF16_ENV, "").strip()
    if cpuinfo is None and forced:
        if forced not in ("0", "1"):
            raise ValueError(f"{NATIVE_BF16_ENV}={forced!r}: set it to 1 (native bf16) or 0 (none), or unset it")
        return forced == "1"
    if cpuinfo is None:
        path = Path("/proc/cpuinfo")
        if platform.system() != "Linux" or not path.is_file():
            return False
        cpuinfo = path.read_text(errors="replace")
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() in ("flags", "features") and NATIVE_BF16_FLAGS & set(value.split()):
            return True
    return False


def runs_on_cpu(accelerator: object) -> bool:
    """Whether a Trainer with this ``accelerator`` setting trains on the CPU."""
    if isinstance(accelerator, str):
        if accelerator == "cpu":
            return True
        if accelerator == "auto":
            mps = getattr(torch.backends, "mps", None)
            return not torch.cuda.is_available() and not (mps is not None and mps.is_available())
        return False
    # an Accelerator instance (or None, Lightning's "auto")
    return accelerator is None and not torch.cuda.is_available()


def resolve_cpu_precision(precision: object, accelerator: object, without_native_bf16: str | None,
                          native_bf16: bool | None = None) -> object:
    """``precision``, or ``without_native_bf16`` in its place when ``precision`` is a bf16 one, the
    Trainer runs on the CPU and the CPU has no native bf16 (``native_bf16``: None reads this CPU)."""
    if without_native_bf16 is None or not str(precision).startswith("bf16") or not runs_on_cpu(accelerator):
        return precision
    if native_bf16 is None:
        native_bf16 = cpu_has_native_bf16()
    if native_bf16:
        return precision
    why = (f"{NATIVE_BF16_ENV}=0" if os.environ.get(NATIVE_BF16_ENV, "").strip() == "0"
           else f"no {'/'.join(sorted(NATIVE_BF16_FLAGS))} flag in /proc/cpuinfo")
    log.info("trainer.precision %s -> %s: this CPU has no native bf16 (%s), where bf16 runs many times slower than "
             "float32 (the config's precision_without_native_bf16; null keeps %s)", precision, without_native_bf16, why, precision)
    return without_native_bf16
