#!/usr/bin/env python
"""Evaluate a checkpoint, or a COCO results file.

    python tools/eval.py --config C.yaml --ckpt_path K.ckpt [--trainer.devices 2 --trainer.strategy ddp] --output stats.json
    python tools/eval.py --annotations ann.json --predictions results.json [--backend faster_coco_eval] --output stats.json

The results-file path imports neither torch nor Lightning, so it starts in a fraction of a second.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

if __name__ == "__main__":
    # a results file (both --annotations F and --annotations=F): no torch, no Lightning
    if any(a.split("=", 1)[0] in ("--annotations", "--predictions") for a in sys.argv[1:]):
        from visiontf.cli.errors import run_tool
        from visiontf.evaluation.coco import main as results_main

        sys.exit(run_tool(results_main, prog="eval.py"))
    from visiontf.cli import eval_main

    sys.exit(eval_main())
