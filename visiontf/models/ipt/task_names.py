"""IPT's task names: the six of the pre-trained multi-task checkpoint, and the scale a name means."""
from __future__ import annotations

import re

#: the tasks of ``IPT_pretrain.pt``'s six heads, tails and queries, in order. The PyTorch release
#: does not say; this is the order of the authors' MindSpore port (its pre-training data pipeline
#: and its evaluation script: 0-2 SR x2/x3/x4, 3 deraining, 4 and 5 denoising at sigma 30 and 50).
PRETRAIN_TASKS = ("sr_x2", "sr_x3", "sr_x4", "derain", "denoise_sigma30", "denoise_sigma50")


def task_scale(name: str) -> int:
    """The upscaling factor of a task name: ``sr_xN`` -> N, anything else (denoising, deraining) -> 1."""
    m = re.fullmatch(r"sr_x(\d+)", name)
    return int(m.group(1)) if m else 1
