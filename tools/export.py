#!/usr/bin/env python
"""Export a checkpoint: safetensors + config (visiontf.load_model) and optionally ONNX (the same command as ``visiontf-export``).

    python tools/export.py --ckpt_path K.ckpt [--config C.yaml] --output model.safetensors [--onnx model.onnx] [--image_size 224 224]

The ONNX graph is compared with PyTorch through onnxruntime unless --no_check: raw outputs within
atol + rtol * |PyTorch| (--atol/--rtol, default 1e-3 each) and, for detectors, the post-processed
detections (visiontf.inference.onnx_check).
"""
import sys

from visiontf.cli import export_main

if __name__ == "__main__":
    sys.exit(export_main())
