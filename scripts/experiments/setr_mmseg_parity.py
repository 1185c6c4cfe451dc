"""Full-size logits parity of visiontf's SETR against the mmsegmentation reference (float32, CPU).

    python scripts/experiments/setr_mmseg_parity.py                       # ViT-L Naive/PUP/MLA, ADE20K, whole 512x512
    python scripts/experiments/setr_mmseg_parity.py --decoders pup --height 512 --width 683 --mode slide

Random mmseg-layout weights (every tensor non-trivial) are converted by ``create_model``'s filter and
both models run the same normalised input; prints the max |difference| and the logit scale. Both
models are built on the meta device and filled in place, so no default initialisation is paid for.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))  # the own-words baselines: tests/reference/
from reference.setr_mmseg import build_setr, randomize  # noqa: E402

from visiontf.models import create_model  # noqa: E402
from visiontf.models.setr.convert import convert_state_dict  # noqa: E402


def parity(decoder: str, dataset: str, height: int, width: int, mode: str) -> dict:
    name = f"setr_{decoder}_vit_large_patch16" + ("_cityscapes" if dataset == "cityscapes" else "")
    with torch.device("meta"):
        ref = build_setr(decoder, dataset)
        ours = create_model(name)
    ref = ref.to_empty(device="cpu").eval()
    randomize(ref)
    ours = ours.to_empty(device="cpu")
    ours.load_state_dict(convert_state_dict(ref.state_dict(), ours))
    ours.eval()
    x = torch.randn(1, 3, height, width, generator=torch.Generator().manual_seed(0))
    crop, stride = ours.pretrained_cfg.crop_size, ours.pretrained_cfg.stride
    with torch.no_grad():
        t0 = time.perf_counter()
        expected = ref.encode_decode(x) if mode == "whole" else ref.slide_inference(x, crop, stride)
        t1 = time.perf_counter()
        got = ours.inference(x, mode)
        t2 = time.perf_counter()
    return {"model": name, "input": f"{height}x{width}", "mode": mode, "max_abs_diff": (got - expected).abs().max().item(),
            "max_abs_logit": expected.abs().max().item(), "mmseg_s": round(t1 - t0, 1), "visiontf_s": round(t2 - t1, 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--decoders", nargs="+", default=["naive", "pup", "mla"], choices=["naive", "pup", "mla"])
    p.add_argument("--dataset", default="ade20k", choices=["ade20k", "cityscapes"])
    p.add_argument("--height", type=int, default=512)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--mode", default="whole", choices=["whole", "slide"])
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    for decoder in args.decoders:
        print(parity(decoder, args.dataset, args.height, args.width, args.mode), flush=True)


if __name__ == "__main__":
    main()
