"""The command lines behind ``tools/``, in one package.

* :mod:`visiontf.cli.train`: one LightningCLI for every task (``tools/train.py``, ``tools/eval.py``).
* :mod:`visiontf.cli.predict`: prediction and export from a checkpoint or an exported model
  (``tools/predict.py``, ``tools/export.py``).
* :mod:`visiontf.cli.demo`: ``make demo`` (``tools/demo.py``); its recipe is ``DEMO_CONFIG``.
* :mod:`visiontf.cli.app`: the local web app (``tools/app.py``, Gradio: ``pip install visiontf[app]``).
* :mod:`visiontf.cli.tool_errors`: every tool's ``main`` runs through ``run_tool``: a user mistake ends
  as one line on stderr and exit code 2 (``--debug`` or ``VISIONTF_DEBUG=1`` for the traceback).

Names resolve lazily, so the predict/export path never imports Lightning's CLI machinery.
"""
from visiontf.core.lazy import lazy_getattr

_LAZY = {
    "VisionCLI": "visiontf.cli.train",
    "make_cli": "visiontf.cli.train",
    "train_main": "visiontf.cli.train",
    "eval_main": "visiontf.cli.train",
    "predict_main": "visiontf.cli.predict",
    "demo_main": "visiontf.cli.demo",
    "app_main": "visiontf.cli.app",
    "export_main": "visiontf.cli.predict",
    "build_predictor": "visiontf.cli.predict",
    "datamodule_from_config": "visiontf.cli.predict",
}

__all__ = sorted(_LAZY)


__getattr__ = lazy_getattr(__name__, _LAZY, globals())
