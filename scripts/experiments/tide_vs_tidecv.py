"""Check: visiontf's TIDE breakdown (``visiontf.evaluation.readouts.tide``) against tidecv itself (dbolya/tide on PyPI).

tidecv 1.0.1 (2020) still runs with numpy 2 (it uses no removed aliases such as ``np.float``), but its
requirements pull ``opencv-python`` (a second ``cv2`` beside the ``opencv-python-headless`` that
albumentations installs: both write the same ``cv2`` package) and seaborn, for its plots. So it is no
dependency of visiontf; install it aside, without its dependencies, and name the folder here:

    pip install --no-deps --target /tmp/tidecv tidecv appdirs seaborn
    python scripts/experiments/tide_vs_tidecv.py --tidecv /tmp/tidecv
    python scripts/experiments/tide_vs_tidecv.py --tidecv /tmp/tidecv --annotations A.json --predictions detections.json
    python scripts/experiments/tide_vs_tidecv.py --tidecv /tmp/tidecv --record tests/fixtures/tide/tide_reference.json

Cases: the 100 real val2017 annotations of ``tests/fixtures/coco_real/boxes`` with generated detections
(two seeds), a generated set with crowd regions (``tests/evaluation/test_coco_eval.py``'s generator), and the
files given. The boxes go to tidecv through its ``Data`` API (``add_ground_truth``, ``add_ignore_region``
for crowd regions, ``add_detection``), as its own COCO loader does, minus the masks it needs a
``segmentation`` for. ``--record`` writes the cases (their detections included) and tidecv's numbers,
which ``tests/evaluation/test_tide.py`` compares against without tidecv.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from visiontf.evaluation.readouts.tide import ERROR_TYPES, SPECIAL_TYPES, tide_errors  # noqa: E402

TOLERANCE = 1e-9
#: the cases --record stores (with their detections, 2 decimals: about 100 kB)
RECORDED = ("coco_real_100_seed0", "generated_with_crowds")


def tidecv_numbers(gt: dict, dets: list[dict]) -> dict:
    """tidecv's AP50, dAP of each error type and error counts for the COCO dicts ``gt`` and ``dets``."""
    from tidecv import TIDE
    from tidecv.data import Data

    truth = Data("gt", max_dets=100)
    for im in gt["images"]:
        truth.add_image(im["id"], im.get("file_name", str(im["id"])))
    for c in gt["categories"]:
        truth.add_class(c["id"], c["name"])
    for a in gt["annotations"]:
        add = truth.add_ignore_region if a.get("iscrowd", 0) else truth.add_ground_truth
        add(a["image_id"], a["category_id"], list(a["bbox"]), None)
    preds = Data("dets")
    for d in dets:
        preds.add_detection(d["image_id"], d["category_id"], d["score"], list(d["bbox"]), None)
    tide = TIDE()
    run = tide.evaluate(truth, preds, mode=TIDE.BOX)
    errors = tide.get_all_errors()
    main, special = errors["main"]["dets"], errors["special"]["dets"]
    counts = {k: 0 for k in ERROR_TYPES}
    for e in run.errors:
        counts[type(e).short_name] += 1
    return {"ap": run.ap, "main": {k: main[k] for k in ERROR_TYPES}, "special": {k: special[k] for k in SPECIAL_TYPES},
            "counts": counts}


def cases(annotations: Path | None, predictions: Path | None) -> list[tuple[str, dict, list[dict], str | None]]:
    """(name, gt, detections, gt file relative to the repository or None when the gt is stored inline)."""
    from readout_data import ANN_100, make_detections
    from test_coco_eval import make_gt_and_dets

    real = json.loads(ANN_100.read_text())
    out = [(f"coco_real_100_seed{s}", real, make_detections(real, seed=s), str(ANN_100.relative_to(REPO))) for s in (0, 1)]
    gt, dets = make_gt_and_dets(seed=0, num_images=30)
    out.append(("generated_with_crowds", gt, dets, None))
    if annotations is not None:
        out.append((predictions.name, json.loads(annotations.read_text()), json.loads(predictions.read_text()),
                    str(annotations)))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tidecv", type=Path, help="a folder holding the tidecv package (pip install --target ...)")
    parser.add_argument("--annotations", type=Path, help="a COCO annotation file to compare on too")
    parser.add_argument("--predictions", type=Path, help="its COCO results file")
    parser.add_argument("--record", type=Path, help="write the generated cases and tidecv's numbers here")
    args = parser.parse_args(argv)
    if args.tidecv is not None:
        sys.path.insert(0, str(args.tidecv))
    try:
        version = importlib.metadata.version("tidecv")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    try:
        import tidecv  # noqa: F401
    except ImportError as e:
        print(f"tidecv is not importable ({e}); see this script's docstring", file=sys.stderr)
        return 2
    worst, recorded = 0.0, []
    for name, gt, dets, gt_file in cases(args.annotations, args.predictions):
        theirs = tidecv_numbers(gt, dets)
        ours = tide_errors(gt, dets)
        diffs = [abs(ours.ap - theirs["ap"])] + [abs(ours.main[k] - theirs["main"][k]) for k in ERROR_TYPES]
        diffs += [abs(ours.special[k] - theirs["special"][k]) for k in SPECIAL_TYPES]
        same_counts = ours.counts == theirs["counts"]
        worst = max(worst, *diffs)
        print(f"{name}: {len(dets)} detections; AP50 tidecv {theirs['ap']:.4f} ours {ours.ap:.4f}; max |diff| of AP and "
              f"the 8 dAP {max(diffs):.2e}; error counts {'equal' if same_counts else 'DIFFER'} {ours.counts}")
        print("   dAP tidecv " + " ".join(f"{k} {theirs['main'][k]:.3f}" for k in ERROR_TYPES)
              + " | " + " ".join(f"{k} {theirs['special'][k]:.3f}" for k in SPECIAL_TYPES))
        if not same_counts:
            worst = float("inf")
        if name in RECORDED:
            recorded.append({"name": name, "annotations": gt_file, "gt": None if gt_file else gt,
                             "detections": [{"image_id": d["image_id"], "category_id": d["category_id"],
                                             "bbox": [round(v, 2) for v in d["bbox"]], "score": round(d["score"], 5)}
                                            for d in dets], "tidecv": None})
    if args.record is not None:
        for case in recorded:  # tidecv's numbers of the rounded detections, the ones stored
            gt = case["gt"] or json.loads((REPO / case["annotations"]).read_text())
            case["tidecv"] = tidecv_numbers(gt, case["detections"])
        args.record.write_text(json.dumps({"tidecv_version": version, "cases": recorded}, separators=(",", ":")) + "\n")
        print(f"recorded {len(recorded)} cases to {args.record}")
    print(f"tidecv {version}: worst difference {worst:.2e} (tolerance {TOLERANCE:g})")
    return 0 if worst <= TOLERANCE else 1


if __name__ == "__main__":
    sys.exit(main())
