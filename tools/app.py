#!/usr/bin/env python
"""A local web app to try a model: drop an image, see its detections, masks, restorations or classes (the same command as ``visiontf-app``).

    python tools/app.py --ckpt_path K.ckpt [--device cpu] [--port 7860] [--score_threshold 0.5]
    python tools/app.py --weights model.safetensors

Needs Gradio (``pip install visiontf[app]``); serves on http://127.0.0.1:7860 and sends nothing anywhere.
Uploads and results live in one ``visiontf_app_*`` temporary folder, removed when the app stops (Ctrl+C, SIGTERM).
"""
import sys

from visiontf.cli import app_main

if __name__ == "__main__":
    sys.exit(app_main())
