#!/usr/bin/env python
"""A super-resolution figure: bicubic-upscaled input | model output | ground truth, crops side by side.

    python scripts/experiments/restoration_figure.py --ckpt_path outputs/ipt_tiny_sr_x2/checkpoints/last.ckpt \
        --image photo.jpg [--image other.jpg ...] --crop 96 --output docs/images/ipt_tiny_sr_x2.png

Each HR image is cut to a multiple of the scale, downscaled with MATLAB's bicubic (as the benchmarks'
LR images), restored by the checkpoint's model and, for the baseline, upscaled back with MATLAB's
bicubic. One row per image: its centre ``--crop`` pixels (or ``--at y x``), each panel labelled with
its PSNR-Y on the whole image (IPT's protocol).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from PIL import Image, ImageDraw  # noqa: E402

from visiontf.data.transforms.imresize import bicubic_downscale, imresize  # noqa: E402
from visiontf.inference import Predictor  # noqa: E402
from visiontf.tasks.restoration.restoration_files import read_rgb8  # noqa: E402
from visiontf.tasks.restoration.restoration_measures import calc_psnr  # noqa: E402


def _t(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a)).permute(2, 0, 1)[None].double() / 255


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ckpt_path", required=True)
    p.add_argument("--image", nargs="+", required=True)
    p.add_argument("--crop", type=int, default=96)
    p.add_argument("--at", type=int, nargs=2, action="append", help="top-left (y x) of the crop, one per image")
    p.add_argument("--zoom", type=int, default=2, help="nearest-neighbour enlargement of the crops")
    p.add_argument("--output", required=True)
    args = p.parse_args()
    predictor = Predictor.from_checkpoint(args.ckpt_path, device="cpu")
    scale = int(np.atleast_1d(predictor.model.scales)[0])
    rows = []
    for k, path in enumerate(args.image):
        hr = read_rgb8(Path(path))
        hr = hr[: hr.shape[0] - hr.shape[0] % scale, : hr.shape[1] - hr.shape[1] % scale]
        lr = bicubic_downscale(hr, scale)
        bic = np.clip(np.floor(imresize(lr.astype(np.float64), scale=float(scale)) + 0.5), 0, 255).astype(np.uint8)
        sr = predictor([torch.from_numpy(lr).permute(2, 0, 1).float() / 255])[0]["image"].permute(1, 2, 0).numpy()
        scores = [float(calc_psnr(_t(x), _t(hr), scale)[0]) for x in (bic, sr)]
        c = args.crop
        y, x = args.at[k] if args.at and k < len(args.at) else ((hr.shape[0] - c) // 2, (hr.shape[1] - c) // 2)
        panels = []
        for img, label in ((bic, f"bicubic {scores[0]:.2f} dB"), (sr, f"ipt_tiny {scores[1]:.2f} dB"), (hr, "ground truth")):
            crop = Image.fromarray(img[y : y + c, x : x + c]).resize((c * args.zoom, c * args.zoom), Image.NEAREST)
            ImageDraw.Draw(crop).rectangle([0, 0, 7 * len(label), 14], fill=(0, 0, 0))
            ImageDraw.Draw(crop).text((2, 2), label, fill=(255, 255, 255))
            panels.append(np.asarray(crop))
        gap = np.full((c * args.zoom, 4, 3), 255, np.uint8)
        rows.append(np.concatenate([panels[0], gap, panels[1], gap, panels[2]], axis=1))
        print(f"{path}: bicubic PSNR-Y {scores[0]:.3f} dB, model {scores[1]:.3f} dB")
    sep = np.full((4, rows[0].shape[1], 3), 255, np.uint8)
    figure = np.concatenate([r for row in rows for r in (row, sep)][:-1], axis=0)
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(figure).save(args.output, optimize=True)
    print(f"wrote {args.output} ({figure.shape[1]}x{figure.shape[0]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
