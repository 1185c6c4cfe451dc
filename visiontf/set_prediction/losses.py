"""IoU-aware classification losses for sigmoid (focal-style) DETR heads.

Both replace the focal classification term of Deformable DETR: a matched query is asked to score
its class in proportion to how well its box fits, so that scores rank detections by localisation
quality (which is what COCO mAP rewards).

Conventions (shared with Deformable DETR's ``sigmoid_focal_loss``):

* ``logits``: ``(..., K)`` raw class scores, one sigmoid per class, no "no object" entry; the
  leading dims are usually ``(B, Q)`` or a flat ``(N,)``.
* ``target``: the class of each query's matched box, either as int64 ids of shape ``(...)``
  with ``K`` meaning "unmatched / no object", or directly as a one-hot ``(..., K)`` (rows of
  zeros for unmatched queries).
* ``iou``: ``(...)``, IoU of each query's predicted box with its matched target box (ignored
  where the query is unmatched). It is a training *target*: it is detached here, as in every
  source.
* The result is ``sum over queries and classes / num_boxes``, float32: the value of Deformable
  DETR's ``loss_ce`` (its ``sigmoid_focal_loss(...).mean(1).sum() / num_boxes * Q``), so either
  loss drops in for the focal term with the same weight and normaliser. ``reduction="none"``
  returns the element-wise ``(..., K)`` loss instead (not divided).
"""
from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor


def _one_hot(logits: Tensor, target: Tensor) -> Tensor:
    num_classes = logits.shape[-1]
    if target.shape == logits.shape:
        return target.to(torch.float32)
    if target.shape == logits.shape[:-1] and not target.is_floating_point():
        # ids outside [0, K] make F.one_hot raise; the matcher has validated the labels already
        return F.one_hot(target.long(), num_classes + 1)[..., :num_classes].to(torch.float32)
    raise ValueError(
        f"target must be class ids of shape {tuple(logits.shape[:-1])} or a one-hot of shape "
        f"{tuple(logits.shape)}, got {tuple(target.shape)} ({target.dtype})"
    )


def _iou(logits: Tensor, iou: Tensor) -> Tensor:
    if iou.shape != logits.shape[:-1]:
        raise ValueError(f"iou must have shape {tuple(logits.shape[:-1])} (one per query), got {tuple(iou.shape)}")
    return iou.detach().to(torch.float32).clamp(0, 1)


def _reduce(loss: Tensor, num_boxes: float, reduction: str) -> Tensor:
    if reduction == "none":
        return loss
    if reduction != "sum":
        raise ValueError(f"reduction must be 'sum' (divided by num_boxes) or 'none', got {reduction!r}")
    return loss.sum() / num_boxes


def varifocal_loss(
    logits: Tensor,
    target: Tensor,
    iou: Tensor,
    num_boxes: float,
    alpha: float = 0.75,
    gamma: float = 2.0,
    reduction: Literal["sum", "none"] = "sum",
) -> Tensor:
    r"""Varifocal loss (Zhang et al., VarifocalNet, CVPR 2021) as RT-DETR and D-FINE use it.

    Source: RT-DETR ``rtdetrv2_pytorch/src/zoo/rtdetr/rtdetrv2_criterion.py``
    (``loss_labels_vfl``; ``alpha`` 0.75, ``gamma`` 2 in its configs); D-FINE's is the same.
    With ``t`` the one-hot target, ``q = IoU * t`` (the IoU at the matched class, 0 elsewhere),
    ``p = sigmoid(x)``:

    .. math::
        w = \alpha \, \mathrm{sg}(p)^\gamma (1 - t) + q, \qquad
        \mathcal{L} = \frac{1}{N_{box}} \sum w \cdot \mathrm{BCE}(x, q)

    where ``sg`` stops the gradient and ``BCE(x, q) = -q log p - (1-q) log(1-p)``. A matched
    query's class is pulled towards its IoU, weighted by it; everything else is pushed to 0 with
    focal down-weighting of easy negatives. A matched query with IoU 0 contributes nothing (as in
    RT-DETR).

    Args:
        logits: ``(..., K)``. target: ``(...)`` ids (``K`` = no object) or ``(..., K)`` one-hot.
        iou: ``(...)``. num_boxes: normaliser (number of target boxes, averaged over ranks).
    """
    t = _one_hot(logits, target)
    x = logits.float()
    q = _iou(logits, iou)[..., None] * t
    weight = alpha * x.sigmoid().detach().pow(gamma) * (1 - t) + q
    loss = F.binary_cross_entropy_with_logits(x, q, weight=weight, reduction="none")
    return _reduce(loss, num_boxes, reduction)


def ia_bce_loss(
    logits: Tensor,
    target: Tensor,
    iou: Tensor,
    num_boxes: float,
    alpha: float = 0.25,
    gamma: float = 2.0,
    reduction: Literal["sum", "none"] = "sum",
) -> Tensor:
    r"""IoU-aware BCE of RF-DETR / LW-DETR (``ia_bce_loss``, on by default in RF-DETR).

    Source: ``roboflow/rf-detr``, ``rfdetr/models/lwdetr.py``, ``SetCriterion.loss_labels``
    (``alpha`` = its ``focal_alpha`` 0.25, ``gamma`` 2). With ``p = sigmoid(x)``, at each
    matched (query, class) pair

    .. math::
        \tau = \mathrm{sg}\big(\max(p^\alpha \, \mathrm{IoU}^{1-\alpha},\ 0.01)\big)

    is the soft target; the positive and negative weights are
    ``w+ = tau, w- = 1 - tau`` there and ``w+ = 0, w- = p^gamma`` everywhere else (``p^gamma``
    is *not* detached, as in the source), and

    .. math::
        \mathcal{L} = \frac{1}{N_{box}} \sum \big(-w_+ \log p - w_- \log(1-p)\big)
        = \frac{1}{N_{box}} \sum \big(w_- x - (w_+ + w_-) \log\sigma(x)\big)

    (the second form, with ``log(1 - p) = log sigma(x) - x``, is the numerically stable one the
    source evaluates). Unlike varifocal, the soft target mixes the current score and the IoU, and
    a matched query with IoU 0 is still pulled to the floor 0.01.

    Args: as :func:`varifocal_loss`.
    """
    t = _one_hot(logits, target)
    x = logits.float()
    p = x.sigmoid()
    tau = (p.detach().pow(alpha) * _iou(logits, iou)[..., None].pow(1 - alpha)).clamp(min=0.01)
    positive = t > 0
    w_pos = torch.where(positive, tau, torch.zeros_like(x))
    w_neg = torch.where(positive, 1 - tau, p.pow(gamma))
    loss = w_neg * x - F.logsigmoid(x) * (w_pos + w_neg)
    return _reduce(loss, num_boxes, reduction)


def matchability_aware_loss(
    logits: Tensor,
    target: Tensor,
    iou: Tensor,
    num_boxes: float,
    alpha: float | None = None,
    gamma: float = 1.5,
    reduction: Literal["sum", "none"] = "sum",
) -> Tensor:
    r"""Matchability-aware loss (Huang et al., DEIM, CVPR 2025), the class loss of its dense one-to-one matching.

    Source: ShihuaHuang95/DEIM ``engine/deim/deim_criterion.py`` (``loss_labels_mal``; ``gamma`` 1.5 and
    no ``mal_alpha`` in its configs). With ``t`` the one-hot target, ``q = IoU * t`` and ``p = sigmoid(x)``:

    .. math::
        w = a \, \mathrm{sg}(p)^\gamma (1 - t) + t, \qquad
        \mathcal{L} = rac{1}{N_{box}} \sum w \cdot \mathrm{BCE}(x, q^\gamma)

    with ``a`` = ``alpha``, or 1 when None. Against varifocal: a matched query weighs 1 whatever its IoU
    (varifocal weighs it by ``q``, so a poorly placed match, as many are when a mosaic packs small
    objects, hardly learns), its target is ``q^gamma``, and the negatives keep full weight (no 0.75).

    Args: as :func:`varifocal_loss`.
    """
    t = _one_hot(logits, target)
    x = logits.float()
    q = (_iou(logits, iou)[..., None] * t).pow(gamma)
    negative = x.sigmoid().detach().pow(gamma) * (1 - t)
    weight = (negative if alpha is None else alpha * negative) + t
    loss = F.binary_cross_entropy_with_logits(x, q, weight=weight, reduction="none")
    return _reduce(loss, num_boxes, reduction)


__all__ = ["ia_bce_loss", "matchability_aware_loss", "varifocal_loss"]
