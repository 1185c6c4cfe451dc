#!/usr/bin/env python
"""Write a small synthetic dataset in the real on-disk layout of a task's data module.

    python tools/make_synthetic.py --task classification --out data/synthetic_cls --num_train 200 --num_val 60 --seed 0
    python tools/make_synthetic.py --task detection --out data/synthetic_det
    python tools/make_synthetic.py --task detection --preset demo --out data/demo_det   # make demo's set
    python tools/make_synthetic.py --task segmentation --out data/synthetic_seg
    python tools/make_synthetic.py --task depth --out data/synthetic_depth
    python tools/make_synthetic.py --task panoptic --out data/panoptic_shapes   # shapes on sky and ground (COCO panoptic)
    python tools/make_synthetic.py --task photos --out data/photos   # scikit-image's photographs

Each set's writer is named by the task table (visiontf/tasks/task_table.py: a row's ``synthetic``, and
``data_synthetic`` for a data module of another layout), by task and by the writer's own name
(``panoptic``, ``photos``: restoration and generation read the photographs). Deterministic for a seed. No
network, no downloads.
"""
import inspect
import sys
from pathlib import Path

from visiontf.cli.tool_errors import run_tool
from visiontf.core.arguments import ToolParser, UsageError

#: the set `make demo` trains detr_tiny on: large, class-coloured shapes a CPU DETR learns in minutes
DETECTION_DEMO = {"image_size": (128, 160), "object_size": (0.12, 0.35), "max_objects": 3, "colour_by_class": True}


def generators() -> dict[str, str]:
    """``--task`` -> the ``module:function`` writing its set: the task table's (which imports nothing), each task's
    and each writer's by its own name: the photographs (real photos scikit-image ships: the IPT and VQGAN recipes)
    and the panoptic set (things and stuff in COCO's panoptic format, the things also as instances with RLE masks:
    DETR's masks)."""
    from visiontf.tasks.task_table import synthetic_writers

    return synthetic_writers()


def main(argv=None) -> int:
    import argparse

    p = ToolParser(prog="make_synthetic.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", required=True, choices=sorted(generators()))
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--num_train", type=int, default=None)
    p.add_argument("--num_val", type=int, default=None)
    p.add_argument("--num_classes", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--preset", choices=["demo"], default=None,
                   help="detection: the easier set of `make demo` and configs/detr/detr_tiny_shapes.yaml "
                        "(128x160 images, 1-3 large objects, one colour per class)")
    args = p.parse_args(argv)
    for name, least in (("num_train", 1), ("num_val", 1), ("num_classes", 1)):
        value = getattr(args, name)
        if value is not None and value < least:
            raise UsageError(f"--{name} {value}: must be >= {least} (a split or class set with nothing in it trains and "
                             "scores nothing)")
    if args.out.is_dir() and any(args.out.iterdir()):
        # a set written over another mixes in the old files (more images, stale annotations)
        raise UsageError(f"--out {args.out}: the folder is not empty; remove it or give a new folder")
    from visiontf.tasks.task_table import import_class

    make = import_class(generators()[args.task])
    kwargs = {"seed": args.seed}
    for name in ("num_train", "num_val", "num_classes"):
        if getattr(args, name) is not None:
            if name not in inspect.signature(make).parameters:
                raise UsageError(f"--{name}: the {args.task} set has no such setting")
            kwargs[name] = getattr(args, name)
    if args.preset == "demo":
        if args.task != "detection":
            raise UsageError("--preset demo is for --task detection")
        kwargs.update(DETECTION_DEMO)
        kwargs.setdefault("num_train", 256)
        kwargs.setdefault("num_val", 32)
    out = make(args.out, **kwargs)
    print(f"wrote {args.task} set to {out if out is not None else args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(run_tool(main, prog="make_synthetic.py"))
