#!/usr/bin/env python
"""Plot a run's losses and validation metrics (mAP / mIoU / accuracy) into one PNG.

    python tools/plot_logs.py outputs/run1 --output curves.png
    python tools/plot_logs.py outputs/run1/csv/version_0/metrics.csv --output curves.png [--tensorboard]
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from visiontf.training_curves import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
