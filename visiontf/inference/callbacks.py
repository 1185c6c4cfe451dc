"""Former home of :class:`~visiontf.callbacks.LogPredictionImages`, kept so that configs and code
naming ``visiontf.inference.callbacks.LogPredictionImages`` keep working."""
from visiontf.callbacks.prediction_images import LogPredictionImages

__all__ = ["LogPredictionImages"]
