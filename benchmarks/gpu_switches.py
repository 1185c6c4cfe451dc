"""Section (s) of the GPU benchmark: switches that might keep the GPU busier, each against the default.

One model, ``deformable_detr_resnet50_box_refine`` (``tiny``: its toy size), train step at batch 2,
800x1216 (64x96), bf16 autocast, fused AdamW, clipping (as section b). Each row times the default
("ref") and the switch ("ours") alternately; ratio > 1: the switch is faster. Nothing here changes a
default: a switch becomes one only after a GPU run shows it pays.

* ``gather core``: the CPU gather core instead of the fused Triton kernels (what the Triton kernels bring);
* ``channels_last``: the ResNet in channels-last memory format (``channels_last=True``; DINO's default);
* ``compile transformer``: ``torch.compile`` of the encoder-decoder (``DetectionTask(compile="transformer")``).

First, on CUDA, one train step of the default under ``torch.cuda.set_sync_debug_mode("warn")``: the
operations that made the host wait for the GPU, counted by the line of Python that called them.
"""
from __future__ import annotations

import collections
import contextlib
import warnings
from collections.abc import Iterator

import torch

from benchmarks.deformable_detr import TINY_OURS
from benchmarks.detr import NUM_CLASSES, make_batch
from benchmarks.gpu_common import Budget, free_cuda, gpu_row, time_alternating
from benchmarks.gpu_train import SIZE, _focal_criteria, _step
from visiontf.models import create_model
from visiontf.models.deformable_detr.build import build_deformable_detr
from visiontf.models.deformable_detr.deformable_detr import DeformableDETR
from visiontf.tasks.optim import build_optimizer

NAME = "deformable_detr_resnet50_box_refine"


def _model(tiny: bool, **kwargs):
    torch.manual_seed(0)
    if tiny:
        return build_deformable_detr(DeformableDETR, num_classes=NUM_CLASSES, dropout=0.0, with_box_refine=True, **TINY_OURS, **kwargs)
    return create_model(NAME, num_classes=NUM_CLASSES, dropout=0.0, **kwargs)


@contextlib.contextmanager
def gather_core() -> Iterator[None]:
    """The default method runs the gather core on CUDA too (the fused kernels' switch, read at each call)."""
    from visiontf.nn import ms_deform_attn

    saved = ms_deform_attn.fused_kernel_runs
    ms_deform_attn.fused_kernel_runs = lambda value: False
    try:
        yield
    finally:
        ms_deform_attn.fused_kernel_runs = saved


def run(device: torch.device, tiny: bool, budget: Budget) -> list[dict]:
    H, W = SIZE["tiny" if tiny else "real"]
    batch = make_batch(2, H, W, device)
    warmup, repeats = (0, 1) if tiny else (2, 5)
    rows = []

    def step_of(model):
        model = model.to(device).train()
        opt = build_optimizer("adamw", [{"params": [p for p in model.parameters() if p.requires_grad]}], 1e-4, 1e-4)
        crit, _ = _focal_criteria()
        return _step(model, lambda m, b: m(b[0], b[1]), crit.to(device), opt, batch, amp=True)[0]

    default = step_of(_model(tiny))
    if device.type == "cuda" and budget.allows("host synchronisation audit", 15):
        default()  # warm-up: autotuning and first-call allocations are not the steady state
        rows.append(gpu_row("s", f"{NAME} train step b2 {H}x{W} bf16: host synchronisations", "", None, None, None,
                            notes=sync_audit(default)))
    switches = {
        "gather core instead of the Triton kernels": lambda: (step_of(_model(tiny)), gather_core()),
        "channels_last backbone": lambda: (step_of(_model(tiny, channels_last=True)), contextlib.nullcontext()),
        "compile transformer": lambda: (_compiled(step_of, tiny), contextlib.nullcontext()),
    }
    for name, make in switches.items():
        label = f"{NAME} train step b2 {H}x{W} bf16, {name}"
        if not budget.allows(label, 10 if tiny else (120 if "compile" in name else 30)):
            continue
        switched, context = make()

        def with_switch(step=switched, context=context):
            with context:
                step()

        t = time_alternating({"ours": with_switch, "ref": default}, device, warmup + (1 if "compile" in name else 0), repeats)
        rows.append(gpu_row("s", label, "the default", t["ours"], t["ref"], None, notes="ratio > 1: the switch is faster"))
        free_cuda()
    return rows


def sync_audit(step) -> str:
    """Run ``step`` once under ``set_sync_debug_mode("warn")``; the synchronising calls by source line."""
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    where = collections.Counter(f"{w.filename.split('/visiontf/')[-1].split('/site-packages/')[-1]}:{w.lineno}"
                                for w in caught if "synchroniz" in str(w.message))
    return f"{sum(where.values())} synchronising calls: " + ", ".join(f"{k} x{n}" for k, n in where.most_common(12))


def _compiled(step_of, tiny: bool):
    model = _model(tiny)
    model.transformer.compile()
    return step_of(model)
