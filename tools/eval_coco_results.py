"""Deprecated: use ``tools/eval.py --annotations A --predictions P`` (or ``visiontf-eval``), which this forwards to."""
import sys

from visiontf.cli.eval import main

if __name__ == "__main__":
    print("eval_coco_results.py is deprecated: use tools/eval.py --annotations A --predictions P", file=sys.stderr)
    sys.exit(main())
