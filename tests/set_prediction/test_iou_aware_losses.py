"""IoU-aware classification losses (visiontf.set_prediction.losses) against their formulas, evaluated directly."""
from __future__ import annotations

import math

import pytest
import torch

from visiontf.set_prediction.losses import ia_bce_loss, matchability_aware_loss, varifocal_loss


def _case(seed=0, n=12, k=5, matched=5):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, k, generator=g, dtype=torch.float64) * 3
    target = torch.full((n,), k, dtype=torch.int64)
    target[:matched] = torch.randint(0, k, (matched,), generator=g)
    iou = torch.rand(n, generator=g, dtype=torch.float64)
    return logits, target, iou


def _weighted_bce_direct(logits, target, iou, num_boxes, soft_target, weight):
    """Sum over (query, class) of weight(p, matched, iou) * BCE(p, soft_target(iou) or 0), element by element in float64."""
    total = 0.0
    n, k = logits.shape
    for i in range(n):
        for c in range(k):
            p = torch.sigmoid(logits[i, c]).item()
            pos = int(target[i]) == c
            q = soft_target(float(iou[i])) if pos else 0.0
            total += weight(p, pos, float(iou[i])) * -(q * math.log(p) + (1 - q) * math.log(1 - p))
    return total / num_boxes


def _varifocal_direct(logits, target, iou, num_boxes, alpha=0.75, gamma=2.0):
    """VarifocalNet / RT-DETR: BCE towards the IoU, matched weight the IoU, negatives alpha p^gamma."""
    return _weighted_bce_direct(logits, target, iou, num_boxes, lambda u: u, lambda p, pos, u: u if pos else alpha * p**gamma)


def _ia_bce_direct(logits, target, iou, num_boxes, alpha=0.25, gamma=2.0):
    """RF-DETR's -w+ log p - w- log(1-p), element by element in float64."""
    total = 0.0
    n, k = logits.shape
    for i in range(n):
        for c in range(k):
            p = torch.sigmoid(logits[i, c]).item()
            if int(target[i]) == c:
                tau = max(p**alpha * float(iou[i]) ** (1 - alpha), 0.01)
                w_pos, w_neg = tau, 1 - tau
            else:
                w_pos, w_neg = 0.0, p**gamma
            total += -w_pos * torch.log(torch.tensor(p)).item() - w_neg * torch.log(torch.tensor(1 - p)).item()
    return total / num_boxes


def _mal_direct(logits, target, iou, num_boxes, alpha=None, gamma=1.5):
    """DEIM's loss_labels_mal: BCE towards IoU^gamma, matched weight 1, negatives (alpha or 1) p^gamma."""
    a = 1.0 if alpha is None else alpha
    return _weighted_bce_direct(logits, target, iou, num_boxes, lambda u: u**gamma, lambda p, pos, u: 1.0 if pos else a * p**gamma)


@pytest.mark.parametrize("seed,alpha,gamma", [(0, None, 1.5), (1, None, 1.5), (1, 0.75, 2.0)])
def test_matchability_aware_loss_matches_its_formula(seed, alpha, gamma):
    logits, target, iou = _case(seed)
    got = matchability_aware_loss(logits, target, iou, num_boxes=3.0, alpha=alpha, gamma=gamma)
    assert got.item() == pytest.approx(_mal_direct(logits, target, iou, 3.0, alpha, gamma), rel=1e-5)
    # unlike varifocal, a matched query with IoU 0 still learns (pushed down, weight 1)
    zero = matchability_aware_loss(logits, target, torch.zeros_like(iou), 3.0)
    assert zero.item() > varifocal_loss(logits, target, torch.zeros_like(iou), 3.0).item()


@pytest.mark.parametrize("seed", [0, 1])
def test_varifocal_matches_its_formula(seed):
    logits, target, iou = _case(seed)
    got = varifocal_loss(logits, target, iou, num_boxes=3.0)
    assert got.dtype == torch.float32
    assert got.item() == pytest.approx(_varifocal_direct(logits, target, iou, 3.0), rel=1e-5)


@pytest.mark.parametrize("seed", [0, 1])
def test_ia_bce_matches_its_formula(seed):
    logits, target, iou = _case(seed)
    got = ia_bce_loss(logits, target, iou, num_boxes=3.0)
    assert got.item() == pytest.approx(_ia_bce_direct(logits, target, iou, 3.0), rel=1e-5)


def test_one_hot_and_ids_agree_and_batched_shapes_work():
    logits, target, iou = _case(2)
    one_hot = torch.nn.functional.one_hot(target, 6)[:, :5]
    for fn in (varifocal_loss, ia_bce_loss):
        a = fn(logits, target, iou, 4.0)
        assert fn(logits, one_hot, iou, 4.0).item() == pytest.approx(a.item(), rel=1e-6)
        # (B, Q, K) as the criterion holds them; the Deformable-DETR normaliser mean(1).sum() * Q
        b = fn(logits.view(3, 4, 5), target.view(3, 4), iou.view(3, 4), 4.0)
        assert b.item() == pytest.approx(a.item(), rel=1e-6)
        none = fn(logits.view(3, 4, 5), target.view(3, 4), iou.view(3, 4), 4.0, reduction="none")
        assert none.shape == (3, 4, 5)
        assert (none.mean(1).sum() * 4 / 4.0).item() == pytest.approx(a.item(), rel=1e-6)


def test_perfect_iou():
    logits, target, _ = _case(3)
    iou = torch.ones(len(target), dtype=torch.float64)
    p = logits.sigmoid()
    pos = torch.nn.functional.one_hot(target, 6)[:, :5].bool()
    # varifocal: matched classes are plain BCE towards 1, the rest alpha p^gamma-weighted BCE towards 0
    expected = (-torch.log(p[pos])).sum() + (0.75 * p[~pos] ** 2 * -torch.log(1 - p[~pos])).sum()
    assert varifocal_loss(logits, target, iou, 1.0).item() == pytest.approx(expected.item(), rel=1e-5)
    # IA-BCE: the soft target is the score itself raised to alpha (floored at 0.01)
    tau = (p[pos] ** 0.25).clamp(min=0.01)
    expected = (-tau * torch.log(p[pos]) - (1 - tau) * torch.log(1 - p[pos])).sum() + \
        (p[~pos] ** 2 * -torch.log(1 - p[~pos])).sum()
    assert ia_bce_loss(logits, target, iou, 1.0).item() == pytest.approx(expected.item(), rel=1e-5)


def test_no_targets():
    logits, _, iou = _case(4)
    target = torch.full((len(logits),), 5, dtype=torch.int64)
    p = logits.sigmoid()
    neg_log = -torch.log(1 - p)
    assert varifocal_loss(logits, target, iou, 2.0).item() == pytest.approx((0.75 * p**2 * neg_log).sum().item() / 2, rel=1e-5)
    assert ia_bce_loss(logits, target, iou, 2.0).item() == pytest.approx((p**2 * neg_log).sum().item() / 2, rel=1e-5)
    empty = torch.zeros(0, 5)
    for fn in (varifocal_loss, ia_bce_loss):
        assert fn(empty, torch.zeros(0, dtype=torch.int64), torch.zeros(0), 1.0).item() == 0.0


def test_gradients_are_finite_even_for_saturated_logits():
    logits = torch.tensor([[40.0, -40.0, 0.0], [-60.0, 60.0, 3.0], [0.0, 0.0, 0.0]], requires_grad=True)
    target = torch.tensor([0, 1, 3])
    for iou in (torch.tensor([0.0, 1.0, 0.5]), torch.tensor([1.0, 0.0, 0.0])):
        for fn in (varifocal_loss, ia_bce_loss):
            logits.grad = None
            loss = fn(logits, target, iou, 2.0)
            loss.backward()
            assert torch.isfinite(loss) and torch.isfinite(logits.grad).all(), (fn.__name__, iou, logits.grad)


def test_varifocal_gradient_is_weight_times_p_minus_q():
    """The focal weight is detached, so d loss / dx = w (p - q) / num_boxes."""
    logits, target, iou = _case(5)
    x = logits.clone().requires_grad_(True)
    varifocal_loss(x, target, iou, 2.0).backward()
    p = logits.sigmoid()
    t = torch.nn.functional.one_hot(target, 6)[:, :5].double()
    q = iou[:, None] * t
    w = 0.75 * p**2 * (1 - t) + q
    assert torch.allclose(x.grad, w * (p - q) / 2.0, atol=1e-6)


def test_iou_is_a_target_not_a_path_for_gradients():
    logits, target, iou = _case(6)
    logits.requires_grad_(True)
    iou = iou.clone().requires_grad_(True)
    for fn in (varifocal_loss, ia_bce_loss):
        fn(logits, target, iou, 1.0).backward()
        assert iou.grad is None and logits.grad is not None


def test_bad_shapes_are_named():
    logits, target, iou = _case(7)
    with pytest.raises(ValueError, match="one per query"):
        varifocal_loss(logits, target, iou[:-1], 1.0)
    with pytest.raises(ValueError, match="class ids of shape"):
        ia_bce_loss(logits, target[:-1], iou, 1.0)
    with pytest.raises(ValueError, match="reduction"):
        ia_bce_loss(logits, target, iou, 1.0, reduction="mean")
