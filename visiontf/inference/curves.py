"""Former home of the training-curve plots, now :mod:`visiontf.training_curves` (they read training
logs, not predictions); kept so ``visiontf.inference.curves`` imports keep working."""
from visiontf.training_curves import (  # noqa: F401
    METRIC_KEYS,
    find_metrics_csv,
    load_run,
    main,
    plot_curves,
    read_metrics_csv,
    read_tensorboard,
)
