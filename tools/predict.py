#!/usr/bin/env python
"""Predict on images or folders: annotated pictures, predictions.json, optional attention maps (the same command as ``visiontf-predict``).

    python tools/predict.py --config C.yaml --ckpt_path K.ckpt --input img.jpg folder/ --output out/ [--attention]
    python tools/predict.py --weights model.safetensors --input folder/ --output out/ --score_threshold 0.7
    python tools/predict.py ... --annotations instances_val.json   # COCO image / category ids in predictions.json
    python tools/predict.py --ckpt_path ipt.ckpt --input lr/ --output sr/   # restoration: <name>.png per input
"""
import sys

from visiontf.cli import predict_main

if __name__ == "__main__":
    sys.exit(predict_main())
