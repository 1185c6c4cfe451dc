"""Former home of the predict/export command lines, now :mod:`visiontf.cli.predict` (one CLI
package for every tool); kept so ``visiontf.inference.cli`` imports keep working."""
from visiontf.cli.predict import (  # noqa: F401
    build_predictor,
    coco_results,
    datamodule_from_config,
    export_main,
    predict_main,
)
