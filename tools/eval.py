#!/usr/bin/env python
"""Evaluate a checkpoint, or a COCO results file (the same command as ``visiontf-eval``).

    python tools/eval.py --config C.yaml --ckpt_path K.ckpt [--trainer.devices 2 --trainer.strategy ddp] --output stats.json
    python tools/eval.py --annotations ann.json --predictions results.json [--backend faster_coco_eval] --output stats.json

The results-file mode imports neither torch nor Lightning, so it starts in a fraction of a second
(:mod:`visiontf.cli.eval`).
"""
import sys

from visiontf.cli.eval import main

if __name__ == "__main__":
    sys.exit(main())
