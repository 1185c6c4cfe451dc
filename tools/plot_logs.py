#!/usr/bin/env python
"""Plot a run's losses and validation metrics (mAP / mIoU / accuracy) into one PNG.

    python tools/plot_logs.py outputs/run1 --output curves.png
    python tools/plot_logs.py outputs/run1/csv/version_0/metrics.csv --output curves.png [--tensorboard]

Or mAP against training minutes, one line per run (runs trained with visiontf.callbacks.ElapsedTime,
e.g. by scripts/experiments/convergence.py), one colour per [LABEL=]PATH argument:

    python tools/plot_logs.py --vs_minutes detr=outputs/conv/runs/detr deform=outputs/conv/runs/deform --output conv.png
"""
import sys

from visiontf.cli.tool_errors import run_tool

if __name__ == "__main__":
    if {"--vs_minutes", "--vs-minutes"} & set(sys.argv[1:]):
        from visiontf.evaluation.convergence import main as convergence_main

        sys.exit(run_tool(convergence_main, [a for a in sys.argv[1:] if a not in ("--vs_minutes", "--vs-minutes")],
                          prog="plot_logs.py"))
    from visiontf.evaluation.training_curves import main

    sys.exit(run_tool(main, prog="plot_logs.py"))
