"""Do two sets of post-processed detections agree (ONNX vs PyTorch), allowing the order of near ties?

Both come from the same post-processing (sorted by score, the best ``k`` (query, class) pairs), on
outputs that differ by float32 noise. Two pairs whose scores are within that noise may swap
places, and a pair that ties with the last kept one may be swapped out for it, so a rank-by-rank
comparison would refuse a good export; these are compared as what a user reads instead.
"""
from __future__ import annotations

from torch import Tensor

__all__ = ["detections_disagreement"]


def detections_disagreement(ref: dict[str, Tensor], got: dict[str, Tensor], score_atol: float, box_atol: float) -> str | None:
    """None when ``got`` matches ``ref`` up to the tolerances, else what differs.

    ``ref``/``got``: ``scores`` (N,) sorted decreasingly, ``labels`` (N,), ``boxes`` (N, 4) in
    pixels. Passes when both keep as many detections, their scores agree rank by rank within
    ``score_atol`` (sorted lists: a tie's swap leaves them equal), and every detection of either
    side scoring clearly above the last kept score (by more than ``score_atol``) has a counterpart
    on the other: the same label, a score within ``score_atol`` and box corners within ``box_atol``.
    """
    n, m = len(ref["scores"]), len(got["scores"])
    if n != m:
        return f"{m} detections, PyTorch {n}"
    if n == 0:
        return None
    score_diff = float((got["scores"] - ref["scores"]).abs().max())
    if not score_diff <= score_atol:
        return f"sorted scores differ by up to {score_diff:.3g} (> {score_atol:g})"
    same = (
        (got["labels"][:, None] == ref["labels"][None, :])
        & ((got["scores"][:, None] - ref["scores"][None, :]).abs() <= score_atol)
        & ((got["boxes"][:, None, :] - ref["boxes"][None, :, :]).abs().amax(-1) <= box_atol)
    )  # (got, ref)
    floor = float(ref["scores"][-1]) + score_atol  # below: may be swapped with a pair just outside the top k
    for side, matched, scores in (("onnxruntime", same.any(1), got["scores"]), ("PyTorch", same.any(0), ref["scores"])):
        missing = ((scores > floor) & ~matched).nonzero().flatten()
        if len(missing):
            i = int(missing[0])
            other = "PyTorch" if side == "onnxruntime" else "onnxruntime"
            d = got if side == "onnxruntime" else ref
            return (f"{len(missing)} {side} detection(s) have no {other} counterpart within score {score_atol:g} and "
                    f"box {box_atol:.3g} px, e.g. #{i}: label {int(d['labels'][i])}, score {float(d['scores'][i]):.4f}, "
                    f"box {[round(float(v), 2) for v in d['boxes'][i]]}")
    return None
