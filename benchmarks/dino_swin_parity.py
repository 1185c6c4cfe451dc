"""DINO's Swin against IDEA-Research/DINO's own code (``models/dino/swin_transformer.py``), float32 CPU.

    python benchmarks/dino_swin_parity.py --dino /path/to/IDEA-Research/DINO     # a checkout of the original

Random weights (every tensor N(0, 0.2)) go into DINO's ``SwinTransformer``; the same state dict loads
into ``benchmarks/reference_dino_swin.py`` (the tests' reference) and into visiontf's
:mod:`visiontf.models.backbones.dino_swin`, and all run the same images at sizes on and off the window grid.
Prints the max |difference| of every output map against DINO's (``forward_raw``). ``--timm`` also
measures timm's Swin on the same weights (renamed into its layout), which is why visiontf does not
build DINO's Swin from timm's. Without ``--dino`` (or when the path does not hold DINO's code) it says
so and exits 0: CI has no copy of the original.
"""
from __future__ import annotations

import argparse
import re
import sys
import types
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.reference_dino_swin import ReferenceSwin  # noqa: E402
from visiontf.models.backbones.dino_swin import DINO_SWIN_NAMES, SwinTransformer  # noqa: E402

SIZES = [(224, 224), (97, 130), (200, 333), (35, 61)]
#: the tiny layout the CI tests use, then DINO's real ones (Swin-L takes a minute per size here)
LAYOUTS = {"tiny_w7": (32, (2, 2, 2, 2), (1, 2, 4, 8), 7), "tiny_w12": (32, (2, 2, 2, 2), (1, 2, 4, 8), 12)}


def import_dino_swin(root: Path):
    """DINO's swin module, importable on a CPU without its CUDA op (a stub module stands in for it)."""
    sys.path.insert(0, str(root))
    sys.modules.setdefault("MultiScaleDeformableAttention", types.ModuleType("MultiScaleDeformableAttention"))
    from models.dino import swin_transformer

    return swin_transformer


def compare(dino, layout: tuple, out_indices: tuple[int, ...], sizes, with_timm: bool) -> list[dict]:
    embed_dim, depths, heads, window = layout
    torch.manual_seed(0)
    original = dino.SwinTransformer(embed_dim=embed_dim, depths=list(depths), num_heads=list(heads), window_size=window,
                                    out_indices=out_indices)
    original.eval()  # its train() override returns None
    with torch.no_grad():
        for p in original.parameters():
            p.normal_(0, 0.2)
    state = original.state_dict()
    reference = ReferenceSwin(embed_dim, depths, heads, window, out_indices).eval()
    reference.load_state_dict(state)
    ours = SwinTransformer(embed_dim, depths, heads, window, out_indices).eval()
    ours.load_state_dict(state)
    rows = []
    for h, w in sizes:
        x = torch.randn(2, 3, h, w, generator=torch.Generator().manual_seed(h * w))
        with torch.no_grad():
            expected = original.forward_raw(x)
            row = {"layout": f"{embed_dim}/{list(depths)}/w{window}", "input": f"{h}x{w}",
                   "reference": max((a - b).abs().max().item() for a, b in zip(reference(x), expected, strict=True)),
                   "visiontf": max((a - b).abs().max().item() for a, b in zip(ours(x), expected, strict=True)),
                   "max_abs": max(e.abs().max().item() for e in expected)}
            if with_timm:
                row["timm_stages"] = timm_stage_diffs(original, layout, x)
        rows.append(row)
    return rows


def timm_stage_diffs(original, layout: tuple, x: torch.Tensor) -> list[float]:
    """timm's Swin on DINO's weights (its downsample sits at the start of the next stage): the max
    |difference| of each stage's output before DINO's output norms."""
    import timm

    embed_dim, depths, heads, window = layout
    model = timm.create_model(f"swin_tiny_patch4_window{window}_224" if window == 7 else "swin_base_patch4_window12_384",
                              embed_dim=embed_dim, depths=depths, num_heads=heads, strict_img_size=False, pretrained=False).eval()
    renamed = {}
    for key, value in original.state_dict().items():
        m = re.match(r"layers\.(\d+)\.downsample\.(.*)", key)
        renamed[f"layers.{int(m.group(1)) + 1}.downsample.{m.group(2)}" if m else key] = value
    own = model.state_dict()
    model.load_state_dict({k: v for k, v in renamed.items() if k in own and own[k].shape == v.shape}, strict=False)
    stages = []
    hooks = [layer.register_forward_hook(lambda m, i, o: stages.append(o[0])) for layer in original.layers]
    with torch.no_grad():
        original.forward_raw(x)
        # padded to the patch as DINO's patch embedding pads (timm refuses other sizes)
        padded = torch.nn.functional.pad(x, (0, -x.shape[-1] % 4, 0, -x.shape[-2] % 4))
        theirs = model.forward_intermediates(padded, indices=list(range(len(depths))), intermediates_only=True)
    for hook in hooks:
        hook.remove()
    diffs = []
    for a, b in zip(theirs, stages):
        diffs.append(round((a - b.view(a.shape[0], a.shape[2], a.shape[3], -1).permute(0, 3, 1, 2)).abs().max().item(), 6))
    return diffs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dino", type=Path, help="a checkout of IDEA-Research/DINO")
    p.add_argument("--full", nargs="*", default=[], choices=sorted(DINO_SWIN_NAMES), help="also DINO's real layouts (slow)")
    p.add_argument("--timm", action="store_true", help="also measure timm's Swin on the same weights")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    if args.dino is None or not (args.dino / "models" / "dino" / "swin_transformer.py").is_file():
        print("no IDEA-Research/DINO checkout given (--dino PATH): nothing compared")
        return
    torch.set_num_threads(args.threads)
    dino = import_dino_swin(args.dino)
    for name, layout in LAYOUTS.items():
        for row in compare(dino, layout, (0, 1, 2, 3) if name == "tiny_w12" else (1, 2, 3), SIZES, args.timm):
            print(row, flush=True)
    for name in args.full:
        for row in compare(dino, DINO_SWIN_NAMES[name], (1, 2, 3), [(97, 130)], False):
            print(name, row, flush=True)


if __name__ == "__main__":
    main()
