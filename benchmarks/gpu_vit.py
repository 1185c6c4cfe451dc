"""Section (d) of the GPU benchmark: ViT-B/16 and DeiT-S against timm under bf16 autocast, eager and compiled.

Identical weights (timm's state dict copied into ours, :func:`benchmarks.vit_vs_timm._pair`), batch
64 at 224 px (``tiny``: ViT-Ti and DeiT-Ti at 32 px, batch 2). Ratio = timm time / ours.

* ``inference``: eval mode, ``torch.inference_mode``, ``torch.autocast(bfloat16)``;
* ``train step``: forward + cross-entropy under autocast, backward, an AdamW step (torch's fused
  AdamW for both: the models are compared, not optimizers);
* ``compiled``: both models through ``torch.compile`` (default mode), compilation outside the
  timing; the most expensive rows (about a minute of compilation per model), run last.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from benchmarks.gpu_common import Budget, gpu_row, time_alternating
from benchmarks.vit_vs_timm import _pair

MODELS = {"real": ("vit_base_patch16_224", "deit_small_patch16_224"), "tiny": ("vit_tiny_patch16_224", "deit_tiny_patch16_224")}


def _inference(model, x):
    def run():
        with torch.inference_mode(), torch.autocast(x.device.type, dtype=torch.bfloat16):
            return model(x)

    return run


def _train(model, x, y):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)

    def run():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(x.device.type, dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    return run


def run(device: torch.device, tiny: bool, budget: Budget, compile_models: bool = True) -> list[dict]:
    size = "tiny" if tiny else "real"
    batch, img = (2, 32) if tiny else (64, 224)
    warmup, repeats, inner = (0, 1, 1) if tiny else (3, 7, 3)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, 3, img, img, generator=g).to(device)
    rows = []
    for compiled in (False, True) if compile_models else (False,):
        for name in MODELS[size]:
            for kind in ("inference", "train step"):
                label = f"{name} {kind} b{batch} {img}px bf16{' compiled' if compiled else ''}"
                if not budget.allows(label, (5 if tiny else 150) if compiled else (3 if tiny else 15)):
                    continue
                ours, ref = _pair(name, device, img_size=img)
                y = torch.randint(0, ours.num_classes, (batch,), generator=g).to(device)
                if compiled:
                    ours, ref = torch.compile(ours), torch.compile(ref)
                if kind == "inference":
                    ours.eval()
                    ref.eval()
                    fns = {"ours": _inference(ours, x), "ref": _inference(ref, x)}
                    a, b = fns["ours"](), fns["ref"]()
                    same = float((a.float() - b.float()).abs().max()) < 5e-2  # bf16 logits of the same weights
                else:
                    fns = {"ours": _train(ours.train(), x, y), "ref": _train(ref.train(), x, y)}
                    same = abs(float(fns["ours"]()) - float(fns["ref"]())) < 2e-2
                t = time_alternating(fns, device, warmup, repeats, inner)
                rows.append(gpu_row("d", label, "timm", t["ours"], t["ref"], same,
                                    notes=f"{batch / t['ours']:.0f} vs {batch / t['ref']:.0f} images/s"))
    return rows
