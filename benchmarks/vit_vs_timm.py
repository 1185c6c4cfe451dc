"""Benchmark: visiontf ViT/DeiT vs timm with identical weights (timm's state dict copied into ours).

Rows (ratio = timm time / ours, > 1: ours faster):

* ``vit_base_patch16_224 inference``: batch 8 at 224 (``--quick``: batch 4), eval, ``no_grad``.
* ``deit_small_patch16_224 inference``: batch 8 (quick 4).
* ``deit_small_patch16_224 train step``: forward + cross-entropy + backward + AdamW step, batch 8
  (quick 4), both models starting from the same weights; equal outputs and losses are checked on
  the first step.

Outputs must agree to 1e-4 (max abs). Each pair is timed in one process, alternating ours/timm.

    .venv/bin/python benchmarks/vit_vs_timm.py [--quick] [--device cuda]
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import cli, max_abs_diff, pick_device, row, time_interleaved  # noqa: E402
from visiontf.models import create_model  # noqa: E402

TOL = 1e-4


def _pair(name: str, device: torch.device, **kwargs):
    import timm

    torch.manual_seed(0)
    ref = timm.create_model(name, pretrained=False, **kwargs)
    ours = create_model(name, **kwargs)
    ours.load_state_dict(ref.state_dict())
    return ours.to(device), ref.to(device)


def bench_inference(name: str, batch: int, img: int, device: torch.device, warmup: int, repeats: int, **kwargs) -> dict:
    ours, ref = _pair(name, device, img_size=img, **kwargs)
    ours.eval()
    ref.eval()
    x = torch.randn(batch, 3, img, img, generator=torch.Generator().manual_seed(1)).to(device)
    with torch.inference_mode():
        diff = max_abs_diff(ours(x), ref(x))
        t = time_interleaved({"ours": lambda: ours(x), "ref": lambda: ref(x)}, device, warmup, repeats)
    return row(f"{name} inference b{batch} {img}px", t["ours"], t["ref"], diff < TOL, "timm",
               max_abs_diff=diff, images_per_s_ours=round(batch / t["ours"], 2), device=str(device))


def bench_train(name: str, batch: int, img: int, device: torch.device, warmup: int, repeats: int, **kwargs) -> dict:
    ours, ref = _pair(name, device, img_size=img, **kwargs)
    ours.train()
    ref.train()
    g = torch.Generator().manual_seed(2)
    x = torch.randn(batch, 3, img, img, generator=g).to(device)
    y = torch.randint(0, ours.num_classes, (batch,), generator=g).to(device)
    opts = {"ours": torch.optim.AdamW(ours.parameters(), lr=1e-5), "ref": torch.optim.AdamW(ref.parameters(), lr=1e-5)}
    models = {"ours": ours, "ref": ref}

    def step(key: str):
        model, opt = models[key], opts[key]
        opt.zero_grad(set_to_none=True)
        out = model(x)
        loss = F.cross_entropy(out, y)
        loss.backward()
        opt.step()
        return out.detach(), loss.detach()

    (o_ours, l_ours), (o_ref, l_ref) = step("ours"), step("ref")
    same = max_abs_diff(o_ours, o_ref) < TOL and abs(float(l_ours) - float(l_ref)) < TOL
    # the first AdamW step must move both copies alike
    same = same and max_abs_diff(ours.head.weight, ref.head.weight) < TOL
    t = time_interleaved({"ours": lambda: step("ours"), "ref": lambda: step("ref")}, device, warmup, repeats)
    return row(f"{name} train step b{batch} {img}px", t["ours"], t["ref"], same, "timm",
               images_per_s_ours=round(batch / t["ours"], 2), device=str(device))


def run(quick: bool = False, device: str = "cpu", tiny: bool = False) -> list[dict]:
    """ViT-B/16 and DeiT-S rows; ``tiny`` (smoke test): ViT-Ti at 32 px, batch 2, one repeat."""
    dev = pick_device(device)
    if tiny:
        kw = dict(batch=2, img=32, device=dev, warmup=0, repeats=1)
        return [bench_inference("vit_tiny_patch16_224", **kw), bench_train("deit_tiny_patch16_224", **kw)]
    batch = 4 if quick and dev.type == "cpu" else 8
    if dev.type == "cuda":
        batch = 64
    warmup, repeats = (1, 3) if quick else (2, 7)
    kw = dict(batch=batch, img=224, device=dev, warmup=warmup, repeats=repeats)
    return [
        bench_inference("vit_base_patch16_224", **kw),
        bench_inference("deit_small_patch16_224", **kw),
        bench_train("deit_small_patch16_224", **kw),
    ]


if __name__ == "__main__":
    raise SystemExit(cli(run, __doc__))
