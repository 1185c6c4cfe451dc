#!/usr/bin/env python
"""The end-to-end demo behind ``make demo``: data -> training -> COCO evaluation -> pictures.

    python tools/demo.py [--out outputs/demo] [--epochs N] [--num_pictures 4]

The recipe is ``visiontf.cli.demo.DEMO_CONFIG``; see :mod:`visiontf.cli.demo`.
"""
import sys

from visiontf.cli.demo import demo_main

if __name__ == "__main__":
    sys.exit(demo_main())
