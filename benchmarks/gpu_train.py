"""Sections (b) and (e) of the GPU benchmark: detector train steps under bf16 autocast, and their peak memory.

A train step is what a training loop runs per batch: ``zero_grad``, forward and set loss under
``torch.autocast(bfloat16)`` (Lightning's ``bf16-mixed``), backward, gradient clipping at norm 0.1
(both projects' setting) and an AdamW step. Ours runs the optimizer the tasks build (torch's fused
AdamW, :func:`visiontf.tasks.optim.build_optimizer`), the references torch's default AdamW, as their
training scripts do. Images of 800x1216 (``tiny``: 64x96), batch 2 and 8, the second image padded.

Pairs (ratio = reference time / ours, > 1: ours faster), identical weights where the reference's
layout converts (same result: both losses in float32 with TF32 off, before timing, within 1e-3):

* Deformable DETR R50 plain, +box refinement, two-stage vs the original design
  (:mod:`reference.deformable_detr`) with the original's CUDA op as its core when
  ``--ref-op`` gives one (else its pure-PyTorch core, said in the row), its batch-wide focal matcher,
  and visiontf's focal ``SetCriterion`` (the original's maths) for both;
* DINO-4scale R50 vs IDEA's own code from a checkout (``--dino-repo``; CUDA op as above), both
  without denoising queries (DINO's denoising branch places its tensors with ``.cuda()``: the same step on
  every device); its outputs go through the same focal criterion with the original's matcher;
* DETR R50 vs the original design (:mod:`reference.detr`) and vs HF transformers'
  ``DetrForObjectDetection`` (its own loss; not checked here, ``benchmarks/detr.py`` checks parity).

Section (e): the peak GPU memory (``torch.cuda.max_memory_allocated``) of one more step of each,
after the timed ones.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn

from benchmarks.common import sync, tf32_off
from benchmarks.deformable_detr import TINY_OURS, TINY_REF, OriginalMatcher
from benchmarks.detr import NUM_CLASSES, BatchWideMatcher, _randomize, build_hf, build_models, make_batch
from benchmarks.gpu_common import Budget, free_cuda, gpu_row, peak_memory_mib, time_alternating

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the own-words baselines: tests/reference/
from reference.deformable_detr import OriginalDeformableDETR

from visiontf.models import create_model
from visiontf.models.deformable_detr.build import build_deformable_detr
from visiontf.models.deformable_detr.deformable_detr import DeformableDETR
from visiontf.set_prediction import HungarianMatcher, SetCriterion, build_criterion
from visiontf.tasks.optim import build_optimizer

SIZE = {"real": (800, 1216), "tiny": (64, 96)}
BATCHES = {"real": (2, 8), "tiny": (2,)}
DEFORMABLE = {  # our registry name -> the original's constructor switches
    "deformable_detr_resnet50": {},
    "deformable_detr_resnet50_box_refine": {"with_box_refine": True},
    "deformable_detr_resnet50_two_stage": {"with_box_refine": True, "two_stage": True},
}
#: the repository (scripts/fixtures/make_dino.py imports DINO's own code from a checkout)
ROOT = Path(__file__).resolve().parents[1]
TINY_DINO = dict(enc_layers=1, dec_layers=1, num_queries=20)


def _focal_criteria():
    ours = SetCriterion(NUM_CLASSES, HungarianMatcher(cost_class=2.0, class_cost="focal"), class_loss="focal")
    return ours, SetCriterion(NUM_CLASSES, OriginalMatcher(), class_loss="focal")


def _deformable(name: str, tiny: bool):
    switches = DEFORMABLE[name]
    torch.manual_seed(0)
    ref = OriginalDeformableDETR(num_classes=NUM_CLASSES, dropout=0.0, **switches, **(TINY_REF if tiny else {}))
    _randomize(ref)
    if tiny:
        ours = build_deformable_detr(DeformableDETR, num_classes=NUM_CLASSES, dropout=0.0, **switches, **TINY_OURS)
    else:
        ours = create_model(name, num_classes=NUM_CLASSES, dropout=0.0)
    from visiontf.models.deformable_detr.convert import convert_state_dict

    ours.load_state_dict(convert_state_dict(ref.state_dict(), ours))
    crit, ref_crit = _focal_criteria()
    return ours, ref, (lambda m, b: m(b[0], b[1])), (lambda m, b: m(b[0], b[1])), crit, ref_crit, True


def _dino(tiny: bool, repo: Path, core):
    """IDEA-Research/DINO's own code from the checkout ``repo`` (imported as the fixture generator does), on ``core``."""
    sys.path.insert(0, str(ROOT / "scripts" / "fixtures"))
    from make_dino import config_args, import_original

    from visiontf.models.deformable_detr.dino_convert import convert_state_dict

    original = import_original(repo, core)
    from util.misc import NestedTensor  # the checkout's, on the path now
    torch.manual_seed(0)
    extra = TINY_DINO if tiny else {}
    ref = original.build_dino(config_args(repo, "DINO_4scale.py", use_dn=False, num_classes=NUM_CLASSES, **extra))[0]
    ours = create_model("dino_resnet50_4scale", num_classes=NUM_CLASSES, num_denoising=0, **extra)
    # the reference keeps its denoising label book (label_enc) even with use_dn=False; ours has none without denoising
    converted = convert_state_dict(ref.state_dict(), ours)
    ours.load_state_dict({k: v for k, v in converted.items() if k != "label_enc.weight" or ours.dino_options.num_denoising})
    kept = ("pred_logits", "pred_boxes", "aux_outputs", "interm_outputs")

    def ref_forward(m, b):
        out = m(NestedTensor(b[0], b[1]))
        return {k: out[k] for k in kept}

    _, ref_crit = _focal_criteria()
    # two-stage top-K selection of random weights flips on rounding: speed only
    return ours, ref, (lambda m, b: m(b[0], b[1])), ref_forward, build_criterion(ours, NUM_CLASSES), ref_crit, False


def _detr(tiny: bool, hf: bool):
    device = torch.device("cpu")
    if hf:
        ours, ref = build_hf(tiny, device)
        ref.config.auxiliary_loss = True

        def ref_loss(m, b):
            labels = [{"class_labels": t["labels"], "boxes": t["boxes"]} for t in b[2]]
            return m(pixel_values=b[0], pixel_mask=(~b[1]).long(), labels=labels).loss

        return ours, ref, (lambda m, b: m(b[0], b[1])), ref_loss, SetCriterion(NUM_CLASSES, HungarianMatcher()), None, False
    ours, ref = build_models(tiny, device)
    return (ours, ref, (lambda m, b: m(b[0], b[1])), (lambda m, b: m.outputs(b[0], b[1])),
            SetCriterion(NUM_CLASSES, HungarianMatcher()), SetCriterion(NUM_CLASSES, BatchWideMatcher()), True)


def _step(model: nn.Module, forward, criterion, optimizer, batch, amp: bool):
    params = [p for p in model.parameters() if p.requires_grad]

    def loss_of() -> torch.Tensor:
        out = forward(model, batch)
        return out if criterion is None else criterion(out, batch[2])["loss"]

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(batch[0].device.type, dtype=torch.bfloat16, enabled=amp):
            loss = loss_of()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 0.1)
        optimizer.step()

    return step, loss_of


def _same_loss(ours_loss, ref_loss, device: torch.device) -> tuple[bool, str]:
    """Both losses in float32 with TF32 off (benchmarks/gpu_detr_parity.py says why)."""
    with torch.no_grad(), tf32_off():
        a, b = float(ours_loss()), float(ref_loss())
    return abs(a - b) <= 1e-3 * max(1.0, abs(b)), f"loss {a:.4f} vs {b:.4f}"


def _pairs(tiny: bool, ref_core, dino_repo: Path | None, budget: Budget):
    attn = "CUDA op" if ref_core is not None else "pure-PyTorch core: no --ref-op"
    for name in DEFORMABLE:
        yield name.replace("_resnet50", "_r50"), f"original Deformable DETR design ({attn})", lambda n=name: _deformable(n, tiny)
    if dino_repo is None:
        budget.notes.append("dino_r50_4scale rows skipped: no --dino-repo (a checkout of IDEA-Research/DINO)")
    else:
        yield "dino_r50_4scale (no denoising)", f"IDEA DINO code ({attn})", lambda: _dino(tiny, dino_repo, ref_core)
    yield "detr_r50", "original DETR design", lambda: _detr(tiny, hf=False)
    yield "detr_r50", "HF transformers DETR", lambda: _detr(tiny, hf=True)


def run(device: torch.device, tiny: bool, budget: Budget, ref_core=None,
        dino_repo: Path | None = None) -> tuple[list[dict], list[dict]]:
    """(train-step rows of section b, peak-memory rows of section e)."""
    size = "tiny" if tiny else "real"
    H, W = SIZE[size]
    warmup, repeats = (0, 1) if tiny else (2, 5)
    steps, memory = [], []
    for name, reference, build in _pairs(tiny, ref_core, dino_repo, budget):
        for B in BATCHES[size]:
            label = f"{name} train step b{B} {H}x{W} bf16"
            if not budget.allows(label, 8 if tiny else (25 if B == 2 else 45)):
                continue
            ours, ref, fwd, ref_fwd, crit, ref_crit, check = build()
            ours, ref = ours.to(device).train(), ref.to(device).train()
            crit = crit.to(device)
            ref_crit = ref_crit.to(device) if ref_crit is not None else None
            batch = make_batch(B, H, W, device)
            opt = build_optimizer("adamw", [{"params": [p for p in ours.parameters() if p.requires_grad]}], 1e-4, 1e-4)
            ref_opt = torch.optim.AdamW([p for p in ref.parameters() if p.requires_grad], lr=1e-4, weight_decay=1e-4)
            step, loss = _step(ours, fwd, crit, opt, batch, amp=True)
            ref_step, ref_loss = _step(ref, ref_fwd, ref_crit, ref_opt, batch, amp=True)
            same, note = _same_loss(loss, ref_loss, device) if check and B == BATCHES[size][0] else (None, "")
            t = time_alternating({"ours": step, "ref": ref_step}, device, warmup, repeats)
            steps.append(gpu_row("b", label, reference, t["ours"], t["ref"], same,
                                 notes=f"{B / t['ours']:.1f} vs {B / t['ref']:.1f} images/s; {note}".rstrip("; ")))
            mem = peak_memory_mib(step, device), peak_memory_mib(ref_step, device)
            if mem[0] is not None:
                memory.append(gpu_row("e", f"{name} train step peak memory b{B} {H}x{W} bf16", reference, mem[0], mem[1], None,
                                      unit="MiB"))
            del ours, ref, opt, ref_opt, step, ref_step, batch
            sync(device)
            free_cuda()
    return steps, memory
