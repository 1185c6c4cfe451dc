#!/usr/bin/env python
"""The end-to-end demo behind ``make demo``: data -> training -> COCO evaluation -> pictures.

1. writes the synthetic COCO-format shapes set (if missing),
2. trains ``detr_tiny`` on it on the CPU with ``configs/detr/detr_tiny_shapes.yaml``,
3. evaluates the checkpoint and prints the standard 12-line COCO table,
4. draws predicted boxes on a few validation images.
Everything runs offline; nothing is downloaded.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
CONFIG = "configs/detr/detr_tiny_shapes.yaml"


def run(cmd: list[str]) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, cwd=ROOT, check=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("outputs/demo"))
    p.add_argument("--data", type=Path, default=Path("data/demo_det"))
    p.add_argument("--epochs", type=int, default=None, help="override the config's max_epochs")
    p.add_argument("--num-pictures", type=int, default=4)
    p.add_argument("--num-train", type=int, default=256, help="synthetic training images (smaller for a smoke test)")
    p.add_argument("--num-val", type=int, default=32)
    args = p.parse_args(argv)
    start = time.time()
    py = sys.executable

    if not (args.data / "annotations" / "instances_val2017.json").is_file():
        run([py, "tools/make_synthetic.py", "--task", "detection", "--preset", "demo", "--out", str(args.data),
             "--num-train", str(args.num_train), "--num-val", str(args.num_val), "--seed", "0"])

    run_dir = args.out / "train"
    train = [py, "tools/train.py", "fit", "--config", CONFIG, f"--data.init_args.root={args.data}",
             f"--trainer.default_root_dir={run_dir}", "--trainer.enable_progress_bar=false"]
    if args.epochs:
        train.append(f"--trainer.max_epochs={args.epochs}")
    run(train)
    ckpt = run_dir / "checkpoints" / "last.ckpt"

    stats_path = args.out / "coco_stats.json"
    run([py, "tools/eval.py", "--config", CONFIG, f"--data.init_args.root={args.data}", "--ckpt_path", str(ckpt),
         f"--trainer.default_root_dir={args.out / 'eval'}", "--trainer.enable_progress_bar=false", "--output", str(stats_path)])

    pictures = args.out / "pictures"
    val_images = sorted((args.data / "val2017").glob("*.jpg"))[: args.num_pictures]
    from visiontf.data.io import read_image
    from visiontf.inference.predictor import Predictor
    from visiontf.inference.visualize import draw_detections, save_image

    predictor = Predictor.from_checkpoint(ckpt)
    pictures.mkdir(parents=True, exist_ok=True)
    written = []
    for path, result in zip(val_images, predictor([str(p) for p in val_images], score_threshold=0.5)):
        picture = draw_detections(read_image(path), result, predictor.class_names)
        written.append(save_image(picture, pictures / f"{path.stem}_pred.png"))

    stats = json.loads(stats_path.read_text())
    minutes = (time.time() - start) / 60
    print(f"\nmake demo finished in {minutes:.1f} min")
    print(f"COCO mAP@[.5:.95] on the synthetic val set: {stats.get('map', stats.get('val/map', float('nan'))):.3f} "
          f"(AP50 {stats.get('map_50', stats.get('val/map_50', float('nan'))):.3f}); stats in {stats_path}")
    print("pictures with predicted boxes:")
    for w in written:
        print("  ", w)
    return 0


if __name__ == "__main__":
    sys.exit(main())
