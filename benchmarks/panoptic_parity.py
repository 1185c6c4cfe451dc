"""visiontf's PQ (``visiontf.evaluation.panoptic.pq_compute``) against cocodataset/panopticapi's own ``pq_compute``.

    python benchmarks/panoptic_parity.py --panopticapi /path/to/panopticapi [--images 40]

panopticapi is pure Python but not on PyPI: give a checkout. Compared on (a) the fixed files of
``tests/data/panoptic_small`` (whose panopticapi numbers the tests hold) and (b) a synthetic panoptic
set (``make_synthetic.py --task panoptic``) against predictions made from its ground truth by random
edits: segments shifted, eroded, relabelled, dropped, merged, marked crowd, pixels set to void. Prints
the largest difference over every PQ/SQ/RQ/N of All, Things, Stuff and every class; exit status 1 if
any exceeds 1e-12. Without the checkout it says so and exits 0.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _flatten(results: dict) -> dict[str, float]:
    out = {}
    for name in ("All", "Things", "Stuff"):
        for k, v in results[name].items():
            out[f"{name}.{k}"] = float(v)
    for cat, values in results["per_class"].items():
        for k, v in values.items():
            out[f"class {cat}.{k}"] = float(v)
    return out


def _edited_predictions(gt_json: Path, gt_folder: Path, out: Path, seed: int) -> tuple[Path, Path]:
    """Predictions made from the ground truth by random edits (see the module docstring)."""
    from visiontf.io.panoptic_ids import id2rgb, read_panoptic_png

    rng = np.random.default_rng(seed)
    gt = json.loads(gt_json.read_text())
    cats = [c["id"] for c in gt["categories"]]
    folder = out / "pred"
    folder.mkdir(parents=True)
    annotations = []
    for ann in gt["annotations"]:
        ids = read_panoptic_png(gt_folder / ann["file_name"])
        pred = np.zeros_like(ids)
        segments = []
        for s in ann["segments_info"]:
            if rng.random() < 0.1:
                continue  # missed
            m = ids == s["id"]
            dy, dx = (int(v) for v in rng.integers(-4, 5, size=2))
            m = np.roll(m, (dy, dx), axis=(0, 1))
            new_id = 1000 + len(segments)
            pred[m] = new_id
            cat = int(rng.choice(cats)) if rng.random() < 0.15 else s["category_id"]
            segments.append({"id": new_id, "category_id": cat})
        if rng.random() < 0.3:  # a strip of void
            y = int(rng.integers(0, pred.shape[0] - 3))
            pred[y:y + 3] = 0
        present = set(np.unique(pred).tolist())
        segments = [s for s in segments if s["id"] in present]
        Image.fromarray(id2rgb(pred)).save(folder / ann["file_name"])
        annotations.append({"image_id": ann["image_id"], "file_name": ann["file_name"], "segments_info": segments})
    pred_json = out / "pred.json"
    pred_json.write_text(json.dumps({"annotations": annotations}))
    return pred_json, folder


def _crowded_gt(gt_json: Path, out: Path, seed: int) -> Path:
    """The ground truth with some thing segments marked crowd."""
    rng = np.random.default_rng(seed)
    gt = json.loads(gt_json.read_text())
    things = {c["id"] for c in gt["categories"] if c["isthing"]}
    for ann in gt["annotations"]:
        for s in ann["segments_info"]:
            if s["category_id"] in things and rng.random() < 0.2:
                s["iscrowd"] = 1
    path = out / "gt.json"
    path.write_text(json.dumps(gt))
    return path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--panopticapi", type=Path, help="a checkout of cocodataset/panopticapi")
    p.add_argument("--images", type=int, default=40)
    args = p.parse_args(argv)
    if not (args.panopticapi and (args.panopticapi / "panopticapi" / "evaluation.py").is_file()):
        print("no checkout of cocodataset/panopticapi given: nothing to compare")
        return 0
    sys.path.insert(0, str(args.panopticapi))
    from panopticapi.evaluation import pq_compute as theirs

    from visiontf.data.synthetic.panoptic import make_panoptic_dataset
    from visiontf.evaluation.panoptic import format_pq_table
    from visiontf.evaluation.panoptic import pq_compute as ours

    small = ROOT / "tests" / "data" / "panoptic_small"
    cases = {"tests/data/panoptic_small": (small / "gt.json", small / "pred.json", small / "gt", small / "pred")}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        paths = make_panoptic_dataset(tmp / "set", num_train=0, num_val=args.images, seed=7)
        gt_json = _crowded_gt(paths["val_panoptic"], tmp, seed=8)
        pred_json, pred_folder = _edited_predictions(gt_json, paths["val_segments"], tmp, seed=9)
        cases[f"synthetic, {args.images} images, edited predictions"] = (gt_json, pred_json, paths["val_segments"], pred_folder)
        worst = 0.0
        for name, (g, pr, gf, pf) in cases.items():
            with contextlib.redirect_stdout(io.StringIO()):
                want = theirs(str(g), str(pr), str(gf), str(pf))
            got = ours(g, pr, gf, pf)
            a, b = _flatten(want), _flatten(got)
            if set(a) != set(b):
                print(f"{name}: different keys {sorted(set(a) ^ set(b))[:5]}")
                return 1
            diff = max(abs(a[k] - b[k]) for k in a)
            worst = max(worst, diff)
            print(f"{name}: max |diff| over {len(a)} numbers = {diff:.3g}\n{format_pq_table(got)}\n")
    print("FAILED" if worst > 1e-12 else "equal to panopticapi")
    return 1 if worst > 1e-12 else 0


if __name__ == "__main__":
    sys.exit(main())
