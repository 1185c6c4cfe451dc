"""Benchmark: DETR-R50 train step and inference, visiontf vs the original design vs HuggingFace.

Rows (ratio = reference time / ours, > 1: ours faster):

* ``detr_r50 train step`` vs the ORIGINAL design (:mod:`reference.detr`: sequence-first
  ``nn.MultiheadAttention``, elementwise frozen BN, contiguous NCHW, the batch-wide matcher of
  :mod:`benchmarks.matcher`), identical weights, dropout off: forward + matching + set loss
  (visiontf's ``SetCriterion`` for both) + backward. Batch 2 at 512x640 (``--quick``: 384x512),
  the second image padded as in a real batch.
* ``detr_r50 train step`` vs HuggingFace ``DetrForObjectDetection`` (random weights converted into
  ours, ``auxiliary_loss=True``, dropout off; HF computes its own loss from ``labels=``).
* ``detr_r50 inference`` vs the original and vs HF: eval-mode forward under ``no_grad``.
* with ``--compile``: ours compiled (``model.compile()``) vs ours eager, train step.
* ``matcher`` and ``coco_eval`` rows from :mod:`benchmarks.matcher` / :mod:`benchmarks.coco_eval`
  (script only; ``run_all.py`` runs those itself).

``--profile`` prints torch.profiler's top-10 ops (self CPU time) of one train step of ours and of
the original.

    .venv/bin/python benchmarks/detr.py [--quick] [--device cuda] [--compile] [--profile]
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import format_table, pick_device, row, setup_torch, tf32_off, time_interleaved  # noqa: E402
from benchmarks.matcher import reference_batchwide_match  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the own-words baselines: tests/reference/
from reference.detr import OriginalDETR  # noqa: E402

from visiontf.models import create_model  # noqa: E402
from visiontf.models.detr.convert import convert_state_dict  # noqa: E402
from visiontf.models.detr.detr import DETR, build_detr  # noqa: E402
from visiontf.set_prediction import HungarianMatcher, SetCriterion  # noqa: E402

NUM_CLASSES = 91  # COCO layout, as the published models
#: (batch, height, width) per mode; "tiny" is the smoke test's size with a small model
SIZES = {"full": (2, 512, 640), "quick": (2, 384, 512), "tiny": (2, 64, 96)}
TINY_MODEL = dict(backbone="resnet18", d=64, h=4, ne=1, nd=1, ff=96, nq=10)
LOSS_RTOL = 1e-3  # float32 sums of 6 layers' losses in a different op order


class BatchWideMatcher(nn.Module):
    """The original's matcher (one (B*Q) x sum(N) cost matrix) as a SetCriterion matcher."""

    def forward(self, outputs, targets):
        return reference_batchwide_match(outputs, targets)


def _randomize(module: nn.Module, seed: int = 0) -> None:
    """Moderate, non-trivial weights and BN statistics, so that losses and matches are meaningful."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in list(module.named_parameters()) + list(module.named_buffers()):
            if not t.is_floating_point():
                continue
            if name.endswith("running_var"):
                t.copy_(torch.empty(t.shape).uniform_(0.5, 1.5, generator=g))
            elif name.endswith("running_mean"):
                t.copy_(0.1 * torch.randn(t.shape, generator=g))
            elif t.dim() == 1 and ("norm" in name or "bn" in name or "downsample.1" in name):
                t.copy_((0.5 if name.endswith("weight") else 0.0) + 0.1 * torch.randn(t.shape, generator=g))
            elif name.endswith(("query_embed.weight", "query_position_embeddings.weight")):
                t.copy_(torch.randn(t.shape, generator=g))
            else:
                fan = t[0].numel() if t.dim() > 1 else 16
                t.copy_(torch.randn(t.shape, generator=g) / math.sqrt(max(1, fan)))


def make_batch(batch: int, height: int, width: int, device: torch.device, seed: int = 0):
    """Images, padding mask (image 1 padded right/bottom) and 3..12 random targets per image."""
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(batch, 3, height, width, generator=g)
    mask = torch.zeros(batch, height, width, dtype=torch.bool)
    if batch > 1:
        mask[1, :, 7 * width // 8 :] = True
        mask[1, 7 * height // 8 :, :] = True
    images[mask[:, None].expand_as(images)] = 0
    targets = []
    for _ in range(batch):
        n = int(torch.randint(3, 13, (1,), generator=g))
        boxes = torch.cat([0.2 + 0.6 * torch.rand(n, 2, generator=g), 0.05 + 0.3 * torch.rand(n, 2, generator=g)], -1)
        targets.append({"labels": torch.randint(0, NUM_CLASSES - 1, (n,), generator=g).to(device), "boxes": boxes.to(device)})
    return images.to(device), mask.to(device), targets


def _ours(tiny: bool, channels_last: bool | None) -> DETR:
    """``detr_resnet50`` as the registry builds it (channels-last, folded frozen BN), dropout off."""
    kw = {} if channels_last is None else {"channels_last": channels_last}
    if tiny:
        return build_detr(DETR, num_classes=NUM_CLASSES, dropout=0.0, backbone="resnet18", hidden_dim=64, nheads=4, enc_layers=1,
                          dec_layers=1, dim_feedforward=96, num_queries=10, **kw)
    return create_model("detr_resnet50", num_classes=NUM_CLASSES, dropout=0.0, **kw)


def build_models(tiny: bool, device: torch.device, channels_last: bool | None = None):
    """(ours, original) with identical weights, dropout off, train mode."""
    torch.manual_seed(0)
    ref_kw = TINY_MODEL if tiny else {}
    ref = OriginalDETR(num_classes=NUM_CLASSES, **ref_kw)
    _randomize(ref)
    ours = _ours(tiny, channels_last)
    ours.load_state_dict(convert_state_dict(ref.state_dict(), ours))
    return ours.to(device).train(), ref.to(device).train()


def build_hf(tiny: bool, device: torch.device, channels_last: bool | None = None, with_ours: bool = True):
    """(ours, HF DetrForObjectDetection) with identical (converted) random weights, dropout off."""
    import transformers

    cfg = dict(num_labels=NUM_CLASSES, auxiliary_loss=True, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)
    if tiny:
        cfg.update(backbone="resnet18", encoder_layers=1, decoder_layers=1, d_model=64, encoder_attention_heads=4,
                   decoder_attention_heads=4, encoder_ffn_dim=96, decoder_ffn_dim=96, num_queries=10)
    torch.manual_seed(0)
    hf = transformers.DetrForObjectDetection(transformers.DetrConfig(use_pretrained_backbone=False, **cfg))
    _randomize(hf)
    if not with_ours:
        return None, hf.to(device).train()
    ours = _ours(tiny, channels_last)
    ours.load_state_dict(convert_state_dict(hf.state_dict(), ours))
    return ours.to(device).train(), hf.to(device).train()


def _ours_step(model, criterion, images, mask, targets):
    model.zero_grad(set_to_none=True)
    loss = criterion(model(images, mask), targets)["loss"]
    loss.backward()
    return loss.detach()


def _ref_step(model, criterion, images, mask, targets):
    model.zero_grad(set_to_none=True)
    loss = criterion(model.outputs(images, mask), targets)["loss"]
    loss.backward()
    return loss.detach()


def _hf_step(model, images, mask, targets):
    model.zero_grad(set_to_none=True)
    labels = [{"class_labels": t["labels"], "boxes": t["boxes"]} for t in targets]
    loss = model(pixel_values=images, pixel_mask=(~mask).long(), labels=labels).loss
    loss.backward()
    return loss.detach()


def _close(a: torch.Tensor, b: torch.Tensor, rtol: float = LOSS_RTOL) -> bool:
    return bool(torch.isfinite(a) and abs(float(a) - float(b)) <= rtol * max(1.0, abs(float(b))))


def _repeats(quick: bool, tiny: bool) -> tuple[int, int]:
    return (0, 1) if tiny else ((1, 3) if quick else (1, 5))


def bench_original(quick: bool, device: torch.device, tiny: bool = False) -> list[dict]:
    """Train step and inference: ours vs the original design."""
    B, H, W = SIZES["tiny" if tiny else "quick" if quick else "full"]
    images, mask, targets = make_batch(B, H, W, device)
    ours, ref = build_models(tiny, device)
    crit = SetCriterion(NUM_CLASSES, HungarianMatcher()).to(device)
    ref_crit = SetCriterion(NUM_CLASSES, BatchWideMatcher()).to(device)
    warmup, repeats = _repeats(quick, tiny)
    size = f"b{B} {H}x{W}"

    # parity in float32: the GPU's default TF32 convolutions moved the gradient past atol 1e-5 and
    # swapped near-tied matches ("same result: False" on an H100; benchmarks/gpu_detr_parity.py)
    with tf32_off():
        l_ours = _ours_step(ours, crit, images, mask, targets)
        l_ref = _ref_step(ref, ref_crit, images, mask, targets)
    g_ours = ours.class_embed.weight.grad
    g_ref = ref.class_embed.weight.grad
    same_train = _close(l_ours, l_ref) and torch.allclose(g_ours, g_ref, rtol=1e-3, atol=1e-5)
    t = time_interleaved(
        {"ours": lambda: _ours_step(ours, crit, images, mask, targets),
         "ref": lambda: _ref_step(ref, ref_crit, images, mask, targets)},
        device, warmup, repeats,
    )
    rows = [row(f"detr_r50 train step {size}", t["ours"], t["ref"], same_train, "original DETR design",
                loss_ours=round(float(l_ours), 5), loss_ref=round(float(l_ref), 5), device=str(device))]

    ours.eval()
    ref.eval()
    with torch.no_grad():
        with tf32_off():
            out = ours(images, mask)
            ref_logits, ref_boxes = ref(images, mask)
        same_inf = bool((out["pred_boxes"] - ref_boxes[-1]).abs().max() < 1e-4
                        and (out["pred_logits"] - ref_logits[-1]).abs().max() < 1e-3)
        t = time_interleaved({"ours": lambda: ours(images, mask), "ref": lambda: ref(images, mask)}, device, warmup, repeats)
    rows.append(row(f"detr_r50 inference {size}", t["ours"], t["ref"], same_inf, "original DETR design", device=str(device)))
    return rows


def bench_hf(quick: bool, device: torch.device, tiny: bool = False) -> list[dict]:
    """Train step and inference: ours vs HuggingFace transformers' DETR (same weights)."""
    B, H, W = SIZES["tiny" if tiny else "quick" if quick else "full"]
    images, mask, targets = make_batch(B, H, W, device)
    ours, hf = build_hf(tiny, device)
    crit = SetCriterion(NUM_CLASSES, HungarianMatcher()).to(device)
    warmup, repeats = _repeats(quick, tiny)
    size = f"b{B} {H}x{W}"

    # transformers 5.x with auxiliary_loss feeds the layer-normed output of each decoder layer to
    # the next one (the original passes the un-normed one), so parity is checked with it off ...
    hf.config.auxiliary_loss = False
    labels = [{"class_labels": t["labels"], "boxes": t["boxes"]} for t in targets]
    with torch.no_grad(), tf32_off():
        hf_terms = hf(pixel_values=images, pixel_mask=(~mask).long(), labels=labels).loss_dict
        our_terms = crit(ours(images, mask), targets)
    same_train = all(_close(our_terms[k], hf_terms[k]) for k in ("loss_ce", "loss_bbox", "loss_giou"))
    # ... and the timing runs with it on, as the original trains
    hf.config.auxiliary_loss = True
    l_ours = _ours_step(ours, crit, images, mask, targets)
    l_hf = _hf_step(hf, images, mask, targets)
    t = time_interleaved(
        {"ours": lambda: _ours_step(ours, crit, images, mask, targets), "ref": lambda: _hf_step(hf, images, mask, targets)},
        device, warmup, repeats,
    )
    rows = [row(f"detr_r50 train step {size}", t["ours"], t["ref"], same_train, "HF transformers DETR",
                loss_ours=round(float(l_ours), 5), loss_ref=round(float(l_hf), 5), device=str(device))]
    ours.eval()
    hf.eval()
    hf.config.auxiliary_loss = False  # inference configuration of the Hub checkpoints
    pixel_mask = (~mask).long()
    with torch.no_grad():
        out = ours(images, mask)
        ref = hf(pixel_values=images, pixel_mask=pixel_mask)
        same = bool((out["pred_boxes"] - ref.pred_boxes).abs().max() < 1e-4 and (out["pred_logits"] - ref.logits).abs().max() < 1e-3)
        t = time_interleaved({"ours": lambda: ours(images, mask), "ref": lambda: hf(pixel_values=images, pixel_mask=pixel_mask)},
                             device, warmup, repeats)
    rows.append(row(f"detr_r50 inference {size}", t["ours"], t["ref"], same, "HF transformers DETR", device=str(device)))
    return rows


def bench_compile(quick: bool, device: torch.device) -> list[dict]:
    """Ours compiled (``nn.Module.compile``, criterion eager) vs ours eager: train step."""
    B, H, W = SIZES["quick" if quick else "full"]
    images, mask, targets = make_batch(B, H, W, device)
    eager, _ = build_models(False, device)
    compiled, _ = build_models(False, device)
    compiled.compile()
    crit = SetCriterion(NUM_CLASSES, HungarianMatcher()).to(device)
    l_e = _ours_step(eager, crit, images, mask, targets)
    l_c = _ours_step(compiled, crit, images, mask, targets)  # compiles here, outside the timing
    t = time_interleaved({"ours": lambda: _ours_step(compiled, crit, images, mask, targets),
                          "ref": lambda: _ours_step(eager, crit, images, mask, targets)}, device, 1, 3)
    return [row(f"detr_r50 train step compiled b{B} {H}x{W}", t["ours"], t["ref"], _close(l_c, l_e), "visiontf eager",
                device=str(device))]


def profile(quick: bool, device: torch.device, row_limit: int = 10) -> dict[str, str]:
    """torch.profiler top ops (self CPU time) of one train step of ours and of the original."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as tprofile

    B, H, W = SIZES["quick" if quick else "full"]
    images, mask, targets = make_batch(B, H, W, device)
    ours, ref = build_models(False, device)
    crit = SetCriterion(NUM_CLASSES, HungarianMatcher()).to(device)
    ref_crit = SetCriterion(NUM_CLASSES, BatchWideMatcher()).to(device)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    tables = {}
    for name, step in (("ours", lambda: _ours_step(ours, crit, images, mask, targets)),
                       ("original", lambda: _ref_step(ref, ref_crit, images, mask, targets))):
        step()  # warm-up
        with tprofile(activities=acts, record_shapes=True) as prof:
            step()
        tables[name] = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=row_limit)
    return tables


def run(quick: bool = False, device: str = "cpu", tiny: bool = False, compile: bool = False,
        hf: bool = True, others: bool = False) -> list[dict]:
    """DETR rows for ``run_all.py``; ``others`` also runs the matcher and COCO-eval benchmarks."""
    dev = pick_device(device)
    rows = bench_original(quick, dev, tiny)
    if hf:
        rows += bench_hf(quick, dev, tiny)
    if compile and not tiny:
        rows += bench_compile(quick, dev)
    if others:
        from benchmarks import coco_eval, matcher

        rows += matcher.run(quick, str(dev))
        rows += coco_eval.run(quick)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="384x512 images, 3 repeats")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--compile", action="store_true", help="add the torch.compile row (minutes of compilation on CPU)")
    p.add_argument("--no-hf", action="store_true", help="skip the HuggingFace rows")
    p.add_argument("--no-others", action="store_true", help="skip the matcher and COCO-eval rows")
    p.add_argument("--profile", action="store_true", help="only print the profiler tables")
    args = p.parse_args(argv)
    setup_torch()
    if args.profile:
        for name, table in profile(args.quick, pick_device(args.device)).items():
            print(f"== {name} ==\n{table}")
        return 0
    rows = run(args.quick, args.device, compile=args.compile, hf=not args.no_hf, others=not args.no_others)
    print(format_table(rows))
    return 0 if all(r["same_result"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
