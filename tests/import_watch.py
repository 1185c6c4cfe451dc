"""``python tests/import_watch.py OUT.json SCRIPT ARGS...``: run SCRIPT as ``__main__`` and write to OUT.json who
imported the optional packages (W&B, MLflow, Gradio): for each first import, the file whose code asked for it.

The test of the default path (``tests/integration/test_detection_readouts.py``) runs ``tools/train.py`` through this:
visiontf must not import them unless a config asks (timm's ``utils/summary.py`` tries ``import wandb``
on its own whenever wandb is installed; the test names that importer, and no other may appear).
"""
from __future__ import annotations

import atexit
import json
import runpy
import sys
import traceback

WATCHED = ("wandb", "mlflow", "gradio")
out_path, script = sys.argv[1], sys.argv[2]
sys.argv = sys.argv[2:]
found: list[dict[str, str | None]] = []


class _Watch:
    def find_spec(self, name, path=None, target=None):
        if name in WATCHED:
            frames = [f.filename for f in traceback.extract_stack()[:-1]
                      if "importlib" not in f.filename and not f.filename.endswith("import_watch.py")]
            found.append({"module": name, "importer": frames[-1] if frames else None})
        return None


sys.meta_path.insert(0, _Watch())
atexit.register(lambda: open(out_path, "w").write(json.dumps(found)))
runpy.run_path(script, run_name="__main__")
