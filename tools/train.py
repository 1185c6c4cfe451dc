#!/usr/bin/env python
"""Train / validate / test / predict any visiontf task from a YAML config (the same command as ``visiontf-train``).

    python tools/train.py fit --config configs/vit/vit_tiny_synthetic.yaml
    python tools/train.py validate --config configs/detr/detr_tiny_shapes.yaml --ckpt_path last
"""
import sys

from visiontf.cli import train_main

if __name__ == "__main__":
    sys.exit(train_main())
