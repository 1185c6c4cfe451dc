#!/usr/bin/env python
"""Train / validate / test / predict any visiontf task from a YAML config.

    python tools/train.py fit --config configs/vit/vit_tiny_synthetic.yaml
    python tools/train.py validate --config configs/detr/detr_tiny_shapes.yaml --ckpt_path last
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from visiontf.cli import train_main  # noqa: E402

if __name__ == "__main__":
    sys.exit(train_main())
