"""Benchmark: peak memory of ``tools/predict.py`` on a folder of large images, streamed vs all decoded first.

Each run is a fresh process (peak RSS, ``VmHWM``, as in ``benchmarks/memory.py``) that predicts a
folder of ``N`` images of ``side`` x ``side`` pixels with a small ViT classifier, writing the
pictures and ``predictions.json`` as ``tools/predict.py`` does
(:func:`visiontf.inference.predict_files.predict_to_folder`, batches of 8, files decoded in
DataLoader workers). The reference is the former way: every image decoded to float first
(``load_inputs``), then predicted. Peak memory should not grow with ``N`` when streamed (about
``side^2 x 12`` bytes per image when not: 12 MB per 1024^2 image).

    .venv/bin/python benchmarks/predict_memory.py [--quick] [--side 1024] [--counts 25 100]

``--quick`` (and ``run_all.py --quick``) uses 512 x 512 images.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import row  # noqa: E402
from benchmarks.memory import _peak_rss_mib  # noqa: E402

KINDS = ("streamed", "eager")


def make_images(folder: Path, count: int, side: int) -> Path:
    """``count`` smooth JPEG images (gradients and a rectangle; quick to encode and decode)."""
    import numpy as np
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    ramp = np.linspace(0, 255, side, dtype=np.float32)
    base = np.stack([ramp[None, :].repeat(side, 0), ramp[:, None].repeat(side, 1), np.full((side, side), 128.0)], -1)
    rng = np.random.default_rng(0)
    for i in range(count):
        img = base.copy()
        x, y = rng.integers(0, side // 2, 2)
        img[y : y + side // 4, x : x + side // 4] = rng.integers(0, 256, 3)
        Image.fromarray(img.astype(np.uint8)).save(folder / f"{i:04d}.jpg", quality=90)
    return folder


def _child(kind: str, folder: str, out: str) -> dict:
    """Runs in the subprocess: predict ``folder`` into ``out``; returns the peak RSS in MiB."""
    import torch

    import visiontf
    from visiontf.inference.predict_files import predict_to_folder
    from visiontf.inference.predictor import Predictor, load_inputs

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = visiontf.create_model("vit_tiny_patch16_224", num_classes=10, depth=2).eval()
    predictor = Predictor(model, device="cpu", batch_size=8, num_workers=2)
    if kind == "streamed":
        report = predict_to_folder(predictor, [folder], out)
        n = report["predicted"]
    else:  # the former tools/predict.py: everything decoded to float, then predicted, then written
        images = load_inputs(folder)
        results = predictor(images)
        predictor.adapter.write_predictions(images, results, [Path(im.source).stem for im in images], Path(out), predictor)
        n = len(results)
    import resource

    workers = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # the largest worker's peak
    return {"kind": kind, "images": n, "peak_mib": round(_peak_rss_mib(), 1), "worker_peak_mib": round(workers, 1)}


def measure(kind: str, folder: Path, out: Path) -> dict:
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", kind, "--folder", str(folder),
                           "--out", str(out)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"predict_memory child {kind!r} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run(quick: bool = False, counts: tuple[int, ...] = (25, 100), side: int | None = None, kinds: tuple[str, ...] = KINDS
        ) -> list[dict]:
    """One row per image count: streamed peak (``ours_s``) vs all-decoded-first peak (``ref_s``), in MiB,
    plus ``growth_mib``: how much the streamed peak rose from the smallest count (the claim: about 0).
    ``side``: 1024, or 512 with ``quick``."""
    side = side or (512 if quick else 1024)
    results: dict[tuple[str, int], dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for n in counts:
            folder = make_images(Path(tmp) / f"images_{n}", n, side)
            for kind in kinds:
                results[kind, n] = measure(kind, folder, Path(tmp) / f"out_{kind}_{n}")
    rows = []
    base = results.get(("streamed", counts[0]))
    for n in counts:
        ours = results[("streamed", n)]
        ref = results.get(("eager", n), ours)
        rows.append(row(f"tools/predict.py peak RSS, {n} images {side}x{side}", ours["peak_mib"], ref["peak_mib"],
                        ours["images"] == n == ref["images"], "all images decoded first (former)", unit="MiB",
                        measure="peak RSS (VmHWM) of the main process, fresh process",
                        growth_mib=round(ours["peak_mib"] - base["peak_mib"], 1), worker_peak_mib=ours["worker_peak_mib"]))
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="512x512 images instead of 1024x1024 (about a minute)")
    p.add_argument("--side", type=int, default=1024)
    p.add_argument("--counts", type=int, nargs="+", default=[25, 100])
    p.add_argument("--child", choices=KINDS, help=argparse.SUPPRESS)
    p.add_argument("--folder", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(_child(args.child, args.folder, args.out)))
        return 0
    rows = run(args.quick, tuple(args.counts), 512 if args.quick and args.side == 1024 else args.side)
    for r in rows:
        print(f"{r['benchmark']}: streamed {r['ours_s']:.0f} MiB ({r['growth_mib']:+.0f} MiB vs {args.counts[0]} images; "
              f"largest decoding worker {r['worker_peak_mib']:.0f} MiB), all decoded first {r['ref_s']:.0f} MiB")
    return 0 if all(r["same_result"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
