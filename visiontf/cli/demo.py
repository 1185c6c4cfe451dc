"""The end-to-end demo behind ``make demo``: data -> training -> COCO evaluation -> pictures -> one line.

1. writes the synthetic COCO-format shapes set (if missing),
2. trains the model of :data:`DEMO_CONFIG` on the CPU, a line per epoch (loss, time left, val mAP),
3. evaluates the last checkpoint and prints the standard 12-line COCO table,
4. draws ground truth beside the predictions on a few validation images, enlarged to at least
   :data:`MIN_PICTURE_SIDE` pixels, and the same pairs stacked in one picture for the README,
5. ends with one line: model, steps and epochs, images, minutes, mAP and AP50, where the pictures are.

Everything runs offline; nothing is downloaded. Switching the demo to another recipe is
:data:`DEMO_CONFIG` (the data preset it trains on is :data:`DATA_PRESET`).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from visiontf.cli.tool_errors import run_tool
from visiontf.core.arguments import ToolParser
from visiontf.core.errors import UserError

ROOT = Path(__file__).resolve().parents[2]
#: the demo's model and recipe: the one setting that switches `make demo` to another config
#: (RT-DETR's CPU config: ahead of dino_tiny's on every held-out seed measured side by side, docs/recipes.md#make-demo)
DEMO_CONFIG = "configs/rtdetr/rtdetr_tiny_shapes.yaml"
#: the synthetic set it trains on (tools/make_synthetic.py --preset) and its size: the CPU recipe's
#: second bar (``--preset demo --num_train 1000 --num_val 100``)
DATA_PRESET = "demo"
NUM_TRAIN, NUM_VAL = 1000, 100
#: the training budget: the recipe anneals its learning rate over it (visiontf.callbacks.BudgetCosine)
MAX_TIME = "00:00:08:00"
#: detections drawn in the pictures
SCORE_THRESHOLD = 0.5
#: the pictures' shorter side, at least (the synthetic images are 130-190 px)
MIN_PICTURE_SIDE = 384


class StepFailed(UserError, RuntimeError):
    """A step of the demo exited with an error (its own message is printed above)."""


def _run(cmd: list[str], quiet: bool = False) -> str:
    """Run a step; its output goes to the terminal (``quiet``: stdout is returned instead)."""
    print("+", " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE if quiet else None, text=True)
    if proc.returncode != 0:
        if quiet and proc.stdout:
            print(proc.stdout, end="")
        raise StepFailed(f"step `{' '.join(cmd[1:3])}` failed with exit code {proc.returncode} (its output is above)")
    return proc.stdout or ""


def _config_model(config: str) -> tuple[str, int]:
    """The recipe's model name and the images of one optimizer step (batch size times DDP processes)."""
    import yaml

    cfg = yaml.safe_load((ROOT / config).read_text())
    model = ((cfg.get("model") or {}).get("init_args") or {}).get("model_name", "the model")
    batch_size = int(((cfg.get("data") or {}).get("init_args") or {}).get("batch_size", 1))
    devices = (cfg.get("trainer") or {}).get("devices", 1)
    return model, batch_size * (devices if isinstance(devices, int) and devices > 0 else 1)


def _trained_steps(ckpt: Path) -> int:
    """Optimizer steps of a Lightning checkpoint (read with weights_only)."""
    from visiontf.io.weights import safe_torch_load

    return int(safe_torch_load(ckpt).get("global_step", 0))


def draw_pictures(ckpt: Path, ann_file: Path, images_dir: Path, out: Path, num: int,
                  score_threshold: float = SCORE_THRESHOLD, min_side: int = MIN_PICTURE_SIDE) -> list[Path]:
    """``<stem>_pred.png``: ground truth | prediction for the first ``num`` validation images, and
    ``demo_detections.png``: all of them stacked (the README's picture)."""
    import torch

    from visiontf.data.io import read_image
    from visiontf.inference.predictor import Predictor
    from visiontf.tasks.detection.coco_annotations import load_coco_json, parse_coco
    from visiontf.tasks.drawing import compare_detections, save_image, side_by_side

    index = parse_coco(load_coco_json(ann_file), ann_file)
    predictor = Predictor.from_checkpoint(ckpt, device="cpu")
    chosen = sorted(range(len(index.images)), key=lambda i: index.images[i]["file_name"])[:num]
    paths = [images_dir / index.images[i]["file_name"] for i in chosen]
    results = predictor([str(p) for p in paths], score_threshold=score_threshold)
    written, pairs = [], []
    for i, path, result in zip(chosen, paths, results):
        xywh = torch.as_tensor(index.boxes[i]).reshape(-1, 4)
        truth = {"boxes": torch.cat([xywh[:, :2], xywh[:, :2] + xywh[:, 2:]], dim=1), "labels": torch.as_tensor(index.labels[i])}
        pair = compare_detections(read_image(path), truth, result, predictor.class_names, min_side=min_side,
                                  titles=("ground truth", f"prediction (score > {score_threshold:g})"))
        written.append(save_image(pair, out / f"{path.stem}_pred.png"))
        pairs.append(pair)
    if pairs:
        written.append(save_image(side_by_side(pairs, gap=12, vertical=True), out / "demo_detections.png"))
    return written


def _demo(argv: Sequence[str]) -> int:
    p = ToolParser(prog="demo.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("outputs/demo"))
    p.add_argument("--data", type=Path, default=Path("data/demo_det"))
    p.add_argument("--config", default=DEMO_CONFIG, help=f"the recipe (default {DEMO_CONFIG})")
    p.add_argument("--epochs", type=int, default=None, help="override the config's max_epochs")
    p.add_argument("--max_time", default=MAX_TIME, help=f"training budget DD:HH:MM:SS (default {MAX_TIME}; 'none': the config's)")
    p.add_argument("--num_pictures", type=int, default=4)
    p.add_argument("--num_train", type=int, default=NUM_TRAIN, help="synthetic training images (smaller for a smoke test)")
    p.add_argument("--num_val", type=int, default=NUM_VAL)
    args = p.parse_args(argv)
    # the steps run in the repository (cwd=ROOT): the user's paths are taken from where the command was typed
    args.out, args.data = args.out.resolve(), args.data.resolve()
    if Path(args.config).is_file():
        args.config = str(Path(args.config).resolve())
    start = time.time()
    py = sys.executable
    model, images_per_step = _config_model(args.config)

    ann_file = args.data / "annotations" / "instances_val2017.json"
    if not ann_file.is_file():
        _run([py, "tools/make_synthetic.py", "--task", "detection", "--preset", DATA_PRESET, "--out", str(args.data),
              "--num_train", str(args.num_train), "--num_val", str(args.num_val), "--seed", "0"])

    run_dir = args.out / "train"
    train = [py, "tools/train.py", "fit", "--config", args.config, f"--data.init_args.root={args.data}",
             f"--trainer.default_root_dir={run_dir}", "--trainer.enable_progress_bar=false",
             "--trainer.enable_model_summary=false"]
    if args.epochs:
        train.append(f"--trainer.max_epochs={args.epochs}")
    if args.max_time and args.max_time.lower() != "none":
        train.append(f"--trainer.max_time={args.max_time}")
    train_start = time.time()
    _run(train)  # a line per epoch (visiontf.callbacks.EpochLines)
    train_min = (time.time() - train_start) / 60
    ckpt = run_dir / "checkpoints" / "last.ckpt"
    steps = _trained_steps(ckpt)

    stats_path = args.out / "coco_stats.json"
    report = _run([py, "tools/eval.py", "--config", args.config, f"--data.init_args.root={args.data}", "--ckpt_path", str(ckpt),
                   f"--trainer.default_root_dir={args.out / 'eval'}", "--trainer.enable_progress_bar=false",
                   "--trainer.logger=false", "--output", str(stats_path)], quiet=True)
    print("\n".join(line for line in report.splitlines() if line.lstrip().startswith("Average ")), flush=True)

    pictures = draw_pictures(ckpt, ann_file, args.data / "val2017", args.out / "pictures", args.num_pictures)
    stats = json.loads(stats_path.read_text())
    num_train = len(list((args.data / "train2017").glob("*.jpg")))
    num_val = len(list((args.data / "val2017").glob("*.jpg")))
    total_min = (time.time() - start) / 60
    print(f"\nmake demo: {model} trained for {steps} steps ({steps * images_per_step / max(num_train, 1):.1f} epochs) on {num_train} images in {train_min:.1f} min "
          f"({total_min:.1f} min in all): COCO mAP {stats.get('map', float('nan')):.3f}, "
          f"AP50 {stats.get('map_50', float('nan')):.3f} on {num_val} val images; "
          f"pictures: {pictures[-1] if pictures else args.out / 'pictures'}", flush=True)
    return 0


def demo_main(argv: Sequence[str] | None = None) -> int:
    """``tools/demo.py`` (``make demo``)."""
    return run_tool(_demo, argv, prog="demo.py")
