"""Evaluate a COCO results file: prints the 12-line table, optionally writes stats JSON (never imports torch)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

if __name__ == "__main__":
    from visiontf.cli.errors import run_tool
    from visiontf.evaluation.coco import main

    sys.exit(run_tool(main, prog="eval_coco_results.py"))
