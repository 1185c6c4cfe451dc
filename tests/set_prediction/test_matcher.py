"""HungarianMatcher: optimality (brute force), equality with the original batch-wide design, edge cases."""
import itertools

import pytest
import torch
from scipy.optimize import linear_sum_assignment
from torchvision.ops import box_convert, generalized_box_iou

from visiontf.set_prediction import HungarianMatcher

WEIGHTS = dict(cost_class=1.0, cost_bbox=5.0, cost_giou=2.0)


def random_boxes(n, g):
    """Normalised cxcywh boxes with sizes in [0.05, 0.45]."""
    return torch.cat([torch.rand(n, 2, generator=g), 0.05 + 0.4 * torch.rand(n, 2, generator=g)], -1)


def random_case(g, batch, queries, num_classes, sizes, dtype=torch.float32):
    outputs = {
        "pred_logits": torch.randn(batch, queries, num_classes + 1, generator=g).to(dtype),
        "pred_boxes": random_boxes(batch * queries, g).view(batch, queries, 4).to(dtype),
    }
    targets = [
        {"labels": torch.randint(0, num_classes, (n,), generator=g), "boxes": random_boxes(n, g)}
        for n in sizes
    ]
    return outputs, targets


def image_cost(logits, boxes, labels, tboxes):
    """Q x N cost of one image, written independently of the matcher under test."""
    prob = logits.float().softmax(-1)
    c_class = -prob[:, labels]
    c_bbox = torch.cdist(boxes.float(), tboxes.float(), p=1)
    giou = generalized_box_iou(
        box_convert(boxes.float(), "cxcywh", "xyxy"), box_convert(tboxes.float(), "cxcywh", "xyxy")
    )
    return 5.0 * c_bbox + 1.0 * c_class - 2.0 * giou


def batchwide_reference(outputs, targets):
    """The original DETR design: one (B*Q) x sum(N) matrix, diagonal blocks solved."""
    bs, nq = outputs["pred_logits"].shape[:2]
    prob = outputs["pred_logits"].float().flatten(0, 1).softmax(-1)
    boxes = outputs["pred_boxes"].float().flatten(0, 1)
    ids = torch.cat([t["labels"] for t in targets])
    tboxes = torch.cat([t["boxes"] for t in targets]).float()
    cost = (
        5.0 * torch.cdist(boxes, tboxes, p=1)
        + 1.0 * -prob[:, ids]
        + 2.0 * -generalized_box_iou(box_convert(boxes, "cxcywh", "xyxy"), box_convert(tboxes, "cxcywh", "xyxy"))
    ).view(bs, nq, -1)
    sizes = [len(t["boxes"]) for t in targets]
    return [linear_sum_assignment(c[i]) for i, c in enumerate(cost.split(sizes, -1))]


def assert_same_matches(ours, ref):
    assert len(ours) == len(ref)
    for (q, t), (rq, rt) in zip(ours, ref):
        assert q.dtype == torch.int64 and t.dtype == torch.int64
        assert q.tolist() == list(rq) and t.tolist() == list(rt)


@pytest.mark.parametrize("seed", range(12))
def test_matches_brute_force_optimum(seed):
    g = torch.Generator().manual_seed(seed)
    queries = int(torch.randint(1, 7, (1,), generator=g))
    sizes = [int(torch.randint(0, 5, (1,), generator=g)) for _ in range(3)]
    outputs, targets = random_case(g, 3, queries, 4, sizes)
    matches = HungarianMatcher(**WEIGHTS)(outputs, targets)

    for b, (q_idx, t_idx) in enumerate(matches):
        n = sizes[b]
        assert len(q_idx) == len(t_idx) == min(queries, n)
        if n == 0:
            continue
        cost = image_cost(
            outputs["pred_logits"][b], outputs["pred_boxes"][b], targets[b]["labels"], targets[b]["boxes"]
        ).double()
        # Enumerate every injective assignment of the smaller side into the larger one.
        if n <= queries:
            candidates = [
                (list(qs), list(range(n))) for qs in itertools.permutations(range(queries), n)
            ]
        else:
            candidates = [(list(range(queries)), list(ts)) for ts in itertools.permutations(range(n), queries)]
        totals = sorted((cost[qs, ts].sum().item(), qs, ts) for qs, ts in candidates)
        best_total = totals[0][0]
        ours_total = cost[q_idx, t_idx].sum().item()
        assert ours_total == pytest.approx(best_total, abs=1e-6)
        assert torch.all(q_idx[1:] > q_idx[:-1]), "query indices must be sorted"
        if len(totals) > 1 and totals[1][0] - best_total > 1e-5:  # unique optimum: same pairs
            best_pairs = sorted(zip(totals[0][1], totals[0][2]))
            assert sorted(zip(q_idx.tolist(), t_idx.tolist())) == best_pairs


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("seed", range(4))
def test_equals_batchwide_reference(seed, dtype):
    g = torch.Generator().manual_seed(100 + seed)
    sizes = [0, 3, 17, 0, 1, 30, 8, 12]  # includes images without targets and N > Q
    outputs, targets = random_case(g, len(sizes), 20, 7, sizes, dtype=dtype)
    ours = HungarianMatcher(**WEIGHTS)(outputs, targets)
    # The matcher works in float32 whatever the model dtype; the reference sees the same values.
    assert_same_matches(ours, batchwide_reference(outputs, targets))


def test_cost_blocks_are_the_diagonal_blocks_of_the_batchwide_cost():
    g = torch.Generator().manual_seed(7)
    sizes = [2, 0, 5]
    outputs, targets = random_case(g, 3, 6, 3, sizes)
    cost, got_sizes, flags = HungarianMatcher(**WEIGHTS).cost_blocks(outputs, targets)
    assert got_sizes == sizes and cost.shape == (7, 6) and flags.tolist() == [0.0, 0.0]
    for b, block in zip([0, 2], cost.split([2, 5])):
        expected = image_cost(
            outputs["pred_logits"][b], outputs["pred_boxes"][b], targets[b]["labels"], targets[b]["boxes"]
        )
        torch.testing.assert_close(block.T, expected, rtol=0, atol=1e-6)


def test_all_images_without_targets():
    g = torch.Generator().manual_seed(1)
    outputs, targets = random_case(g, 2, 5, 3, [0, 0])
    targets[1]["boxes"] = torch.zeros(0)  # a flat empty tensor is accepted for an empty image
    for q, t in HungarianMatcher()(outputs, targets):
        assert q.dtype == t.dtype == torch.int64 and q.numel() == t.numel() == 0


def test_degenerate_boxes_do_not_crash():
    g = torch.Generator().manual_seed(2)
    outputs, targets = random_case(g, 1, 4, 3, [3])
    targets[0]["boxes"][0, 2] = 0.0  # zero width
    targets[0]["boxes"][1, 2:] = 0.0  # a point
    outputs["pred_boxes"][0, 0] = targets[0]["boxes"][1]  # degenerate prediction on the point
    (q, t), = HungarianMatcher()(outputs, targets)
    assert len(q) == 3 and sorted(t.tolist()) == [0, 1, 2]


def test_nan_predictions_raise_clear_error():
    g = torch.Generator().manual_seed(3)
    outputs, targets = random_case(g, 2, 4, 3, [1, 2])
    outputs["pred_boxes"][1, 2, 0] = float("nan")
    with pytest.raises(ValueError, match="predictions .* non-finite"):
        HungarianMatcher()(outputs, targets)


def test_nan_target_boxes_raise_clear_error():
    g = torch.Generator().manual_seed(4)
    outputs, targets = random_case(g, 2, 4, 3, [1, 2])
    targets[1]["boxes"][0, 1] = float("nan")
    with pytest.raises(ValueError, match=r"target boxes of images \[1\]"):
        HungarianMatcher()(outputs, targets)


def test_label_out_of_range_raises():
    g = torch.Generator().manual_seed(5)
    outputs, targets = random_case(g, 2, 4, 3, [1, 2])
    targets[0]["labels"][0] = 3  # == num_classes: the "no object" slot
    with pytest.raises(ValueError, match=r"images \[0\].*outside \[0, 3\)"):
        HungarianMatcher()(outputs, targets)


def test_batch_size_mismatch_and_zero_costs_raise():
    g = torch.Generator().manual_seed(6)
    outputs, targets = random_case(g, 2, 4, 3, [1, 2])
    with pytest.raises(ValueError, match="2 predictions|batch of 2"):
        HungarianMatcher()(outputs, targets[:1])
    with pytest.raises(ValueError, match="cannot all be 0"):
        HungarianMatcher(0, 0, 0)
