"""Every Lightning callback of visiontf, in one package.

Names resolve lazily: ``import visiontf.callbacks`` stays light, and the drawing code behind
``LogPredictionImages`` is imported only when that callback is used.
"""
from visiontf.core.lazy import lazy_getattr

_LAZY = {
    "BudgetCosine": "visiontf.callbacks.budget_schedule",
    "DataWaitTimer": "visiontf.callbacks.data_wait",
    "DetectionReadouts": "visiontf.callbacks.detection_readouts",
    "ElapsedTime": "visiontf.callbacks.elapsed_time",
    "EpochLines": "visiontf.callbacks.epoch_lines",
    "LastAndBestCheckpoint": "visiontf.callbacks.checkpoint",
    "RNGStateCheckpoint": "visiontf.callbacks.rng_state",
    "LogPredictionImages": "visiontf.callbacks.prediction_images",
    "ModelEMA": "visiontf.callbacks.ema",
    "OnnxRuntimeEvaluation": "visiontf.callbacks.onnx_eval",
    "ValidationSchedule": "visiontf.callbacks.validation_schedule",
    "WandbCheckpoints": "visiontf.callbacks.wandb_checkpoints",
}

__all__ = sorted(_LAZY)


__getattr__ = lazy_getattr(__name__, _LAZY, globals())
