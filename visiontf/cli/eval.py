"""``visiontf-eval`` / ``tools/eval.py``: evaluate a checkpoint, or a COCO results file.

    visiontf-eval --config C.yaml --ckpt_path K.ckpt [--trainer.devices 2 --trainer.strategy ddp] --output stats.json
    visiontf-eval --annotations ann.json --predictions results.json [--backend faster_coco_eval] --output stats.json

The second form (a results file: ``--annotations`` or ``--predictions`` given) imports neither torch nor
Lightning, so it starts in a fraction of a second; it is what ``tools/eval_coco_results.py`` used to run.
"""
from __future__ import annotations

import sys
from collections.abc import Sequence

#: the options that select the results-file mode (``--annotations F`` and ``--annotations=F`` alike)
RESULTS_FILE_OPTIONS = ("--annotations", "--predictions")

__all__ = ["RESULTS_FILE_OPTIONS", "is_results_file_mode", "main"]


def is_results_file_mode(argv: Sequence[str]) -> bool:
    """Whether a command line evaluates a COCO results file rather than a checkpoint."""
    return any(a.split("=", 1)[0] in RESULTS_FILE_OPTIONS for a in argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Evaluate a results file (no torch) or a checkpoint (``validate`` through the training CLI)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if is_results_file_mode(args):
        from visiontf.cli.tool_errors import run_tool
        from visiontf.evaluation.coco import main as results_main

        return run_tool(results_main, args, prog="eval.py")
    if "-h" in args or "--help" in args:
        print("A checkpoint (the options below) or a COCO results file: eval.py --annotations A --predictions P "
              "[--backend B] [--output stats.json] (add --help to it for that mode's options).\n")
    from visiontf.cli.train import eval_main

    return eval_main(args)
