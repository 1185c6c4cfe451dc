"""Contrastive denoising queries (visiontf.models.deformable_detr.denoising): layout, noise, mask, losses' indices."""
from __future__ import annotations

import logging

import pytest
import torch
from torch import nn
from torchvision.ops import box_convert

import visiontf.models.deformable_detr.denoising as dn
from visiontf.models.deformable_detr.denoising import (
    build_contrastive_denoising,
    denoising_match_indices,
    split_denoising_outputs,
)
from visiontf.set_prediction import SetCriterion


def _targets(counts, num_classes=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for n in counts:
        cxcy = torch.rand(n, 2, generator=g) * 0.4 + 0.3
        wh = torch.rand(n, 2, generator=g) * 0.2 + 0.1
        out.append({"labels": torch.randint(0, num_classes, (n,), generator=g), "boxes": torch.cat([cxcy, wh], 1)})
    return out


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def test_group_sizes_and_layout():
    targets = _targets([3, 1, 0])
    q = build_contrastive_denoising(targets, num_classes=4, num_queries=7, num_denoising=100, generator=_gen())
    m = q.meta
    # DINO: 100 // n_max groups of n_max positives + n_max negatives
    assert (m.num_groups, m.group_size, m.pad_size) == (33, 6, 198)
    assert q.labels.shape == (3, 198) and q.boxes_unact.shape == (3, 198, 4) and q.attn_mask.shape == (205, 205)
    assert [len(i) for i in m.positive_idx] == [3 * 33, 1 * 33, 0]
    assert m.valid.sum(1).tolist() == [2 * 3 * 33, 2 * 1 * 33, 0]
    assert int(m.negative.sum()) == 99
    # positives sit in the first half of their group, at their box's offset, target order repeats per group
    for pos, tgt in zip(m.positive_idx, m.target_idx):
        assert not m.negative[pos].any()
        assert torch.equal(pos % m.group_size, tgt)
        assert torch.equal(pos // m.group_size, torch.arange(m.num_groups).repeat_interleave(len(tgt) // m.num_groups))
    # padding slots carry the padding label num_classes and the zero reference
    assert (q.labels[~m.valid] == 4).all() and (q.boxes_unact[~m.valid] == 0).all()
    assert (q.labels[m.valid] < 4).all()


def test_attention_mask_semantics():
    q = build_contrastive_denoising(_targets([2, 1]), num_classes=4, num_queries=5, num_denoising=6, generator=_gen())
    m, mask = q.meta, q.attn_mask
    assert (m.num_groups, m.group_size, m.pad_size) == (3, 4, 12)
    p = m.pad_size
    group = torch.arange(p) // m.group_size
    assert mask[p:, :p].all(), "matching queries must not see denoising queries"
    assert not mask[p:, p:].any() and not mask[:p, p:].any(), "everyone sees the matching queries"
    assert torch.equal(mask[:p, :p], group[:, None] != group[None, :]), "a group sees itself only"

    # the same statement through real attention: changing group 1 leaves group 0 and matching untouched
    torch.manual_seed(0)
    attn = nn.MultiheadAttention(8, 2, batch_first=True).eval()
    x = torch.randn(1, p + 5, 8)
    y = x.clone()
    changed = torch.cat([group == 1, torch.zeros(5, dtype=torch.bool)])
    y[0, changed] += torch.randn(int(changed.sum()), 8)
    with torch.no_grad():
        ax, _ = attn(x, x, x, attn_mask=mask)
        ay, _ = attn(y, y, y, attn_mask=mask)
    assert torch.allclose(ax[0, ~changed], ay[0, ~changed], atol=1e-6)
    assert not torch.allclose(ax[0, changed], ay[0, changed], atol=1e-3)
    # and without the mask the matching queries would read the denoising ones (the test has teeth)
    with torch.no_grad():
        bx, _ = attn(x, x, x)
        by, _ = attn(y, y, y)
    assert not torch.allclose(bx[0, p:], by[0, p:], atol=1e-4)


def _corner_shift_ratio(q, targets, scale):
    """|corner displacement| / (scale * half width or height), per valid copy and coordinate."""
    m = q.meta
    noised = box_convert(q.boxes_unact.sigmoid().double(), "cxcywh", "xyxy")
    ratios, negatives = [], []
    for i, t in enumerate(targets):
        n = len(t["labels"])
        if n == 0:
            continue
        gt = t["boxes"].double()
        for slot in range(m.pad_size):
            j = slot % m.group_size % (m.group_size // 2)
            if not m.valid[i, slot]:
                continue
            ref = box_convert(gt[j : j + 1], "cxcywh", "xyxy")[0]
            half = gt[j, 2:].repeat(2) * 0.5
            ratios.append((noised[i, slot] - ref).abs() / (half * scale))
            negatives.append(bool(m.negative[slot]))
    return torch.stack(ratios), torch.tensor(negatives)


def test_negatives_are_noised_strictly_harder_than_positives():
    # centred boxes small enough never to be clamped at the image border
    targets = [{"labels": torch.tensor([0, 1]), "boxes": torch.tensor([[0.5, 0.5, 0.2, 0.2], [0.4, 0.6, 0.1, 0.3]])}]
    q = build_contrastive_denoising(targets, num_classes=4, num_queries=3, num_denoising=200, box_noise_scale=0.4,
                                    generator=_gen(1))
    ratio, negative = _corner_shift_ratio(q, targets, 0.4)
    pos, neg = ratio[~negative], ratio[negative]
    assert len(pos) == len(neg) == 2 * 100
    tol = 1e-4  # inverse sigmoid round trip in float32
    assert pos.max() < 1 + tol and pos.min() >= 0
    assert neg.min() > 1 - tol and neg.max() < 2 + tol
    assert pos.max() <= neg.min() + tol, "every negative copy is farther from its box than every positive"
    assert 0.4 < pos.mean() < 0.6 and 1.4 < neg.mean() < 1.6  # U[0,1) and U[1,2)


def test_no_noise_gives_the_ground_truth_back():
    targets = _targets([2, 3])
    q = build_contrastive_denoising(targets, num_classes=4, num_queries=1, num_denoising=6, label_noise_ratio=0.0,
                                    box_noise_scale=0.0)
    for i, t in enumerate(targets):
        pos, tgt = q.meta.positive_idx[i], q.meta.target_idx[i]
        assert torch.equal(q.labels[i, pos], t["labels"][tgt])
        assert torch.allclose(q.boxes_unact[i, pos].sigmoid(), t["boxes"][tgt], atol=1e-6)


def test_label_flip_rate():
    num_classes, ratio = 10, 0.5
    targets = _targets([50] * 8, num_classes=num_classes)
    q = build_contrastive_denoising(targets, num_classes, num_queries=1, num_denoising=2000,
                                    label_noise_ratio=ratio, generator=_gen(2))
    m = q.meta
    changed, total = 0, 0
    for i, t in enumerate(targets):
        for half in (0, 1):  # positives and negatives are flipped alike
            slots = m.positive_idx[i] + half * (m.group_size // 2)
            changed += int((q.labels[i, slots] != t["labels"][m.target_idx[i]]).sum())
            total += len(slots)
    # a label is re-drawn with p = ratio * 0.5 and the new draw differs with p (K-1)/K
    expected = ratio * 0.5 * (num_classes - 1) / num_classes
    assert total == 8 * 50 * 40 * 2
    assert abs(changed / total - expected) < 0.01, (changed / total, expected)


def test_empty_batch_has_no_denoising_queries():
    targets = [{"labels": torch.zeros(0, dtype=torch.int64), "boxes": torch.zeros(0, 4)} for _ in range(3)]
    q = build_contrastive_denoising(targets, num_classes=4, num_queries=5, generator=_gen())
    assert q.meta.pad_size == 0 and q.meta.num_groups == 0
    assert q.labels.shape == (3, 0) and q.boxes_unact.shape == (3, 0, 4)
    assert q.attn_mask.shape == (5, 5) and not q.attn_mask.any()
    outputs = {"pred_logits": torch.randn(3, 5, 5), "pred_boxes": torch.rand(3, 5, 4),
               "aux_outputs": [{"pred_logits": torch.randn(3, 5, 5), "pred_boxes": torch.rand(3, 5, 4)}]}
    dn_out, match = split_denoising_outputs(outputs, q.meta)
    assert dn_out["pred_logits"].shape == (3, 0, 5) and match["pred_logits"].shape == (3, 5, 5)
    indices = denoising_match_indices(q.meta)
    assert [len(i) for i, _ in indices] == [0, 0, 0]
    # the criterion's terms on zero denoising queries are zeros, not errors
    crit = SetCriterion(4, weight_dict={"loss_ce": 1, "loss_bbox": 5, "loss_giou": 2})
    boxes = crit.loss_boxes(dn_out, targets, indices, num_boxes=1.0)
    assert float(boxes["loss_bbox"]) == 0 and float(boxes["loss_giou"]) == 0


def test_more_boxes_than_queries_shrinks_to_one_group_logged_once(caplog, monkeypatch):
    monkeypatch.setattr(dn, "_logged_oversize", False)
    targets = _targets([7, 2])
    with caplog.at_level(logging.WARNING, logger="visiontf.models.deformable_detr.denoising"):
        for seed in range(3):
            q = build_contrastive_denoising(targets, num_classes=4, num_queries=3, num_denoising=5, generator=_gen(seed))
    assert (q.meta.num_groups, q.meta.pad_size) == (1, 14)
    assert [len(i) for i in q.meta.positive_idx] == [7, 2]
    lines = [r for r in caplog.records if "more than num_denoising" in r.getMessage()]
    assert len(lines) == 1, [r.getMessage() for r in caplog.records]


def test_generator_makes_it_deterministic():
    targets = _targets([3, 2])
    a = build_contrastive_denoising(targets, 4, 5, num_denoising=30, generator=_gen(7))
    b = build_contrastive_denoising(targets, 4, 5, num_denoising=30, generator=_gen(7))
    c = build_contrastive_denoising(targets, 4, 5, num_denoising=30, generator=_gen(8))
    assert torch.equal(a.labels, b.labels) and torch.equal(a.boxes_unact, b.boxes_unact)
    assert not torch.equal(a.boxes_unact, c.boxes_unact)


def test_split_and_fixed_indices_feed_the_criterion():
    """Denoising outputs that reproduce their targets at the positive slots have zero box loss."""
    targets = _targets([2, 3])
    q = build_contrastive_denoising(targets, num_classes=4, num_queries=6, num_denoising=9, generator=_gen())
    m = q.meta
    total = m.pad_size + m.num_queries
    boxes = torch.rand(2, total, 4) * 0.3 + 0.2
    for i, t in enumerate(targets):
        boxes[i, m.positive_idx[i]] = t["boxes"][m.target_idx[i]]
    outputs = {"pred_logits": torch.randn(2, total, 5), "pred_boxes": boxes,
               "aux_outputs": [{"pred_logits": torch.randn(2, total, 5), "pred_boxes": boxes.clone()}],
               "enc_outputs": {"pred_logits": torch.randn(2, 11, 5), "pred_boxes": torch.rand(2, 11, 4)}}
    dn_out, match = split_denoising_outputs(outputs, m)
    assert dn_out["pred_boxes"].shape == (2, m.pad_size, 4) and match["pred_boxes"].shape == (2, 6, 4)
    assert len(dn_out["aux_outputs"]) == 1 and dn_out["aux_outputs"][0]["pred_logits"].shape[1] == m.pad_size
    assert "enc_outputs" in match and "enc_outputs" not in dn_out
    assert torch.equal(match["pred_boxes"], boxes[:, m.pad_size:])

    crit = SetCriterion(4)
    indices = denoising_match_indices(m)
    num_boxes = 5.0 * m.num_groups  # DINO normalises the denoising terms by num_boxes * groups
    exact = crit.loss_boxes(dn_out, targets, indices, num_boxes)
    assert float(exact["loss_bbox"]) < 1e-6 and float(exact["loss_giou"]) < 1e-6
    shifted = {**dn_out, "pred_boxes": dn_out["pred_boxes"].roll(1, dims=1)}
    assert float(crit.loss_boxes(shifted, targets, indices, num_boxes)["loss_bbox"]) > 1e-3


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="outside \\[0, 4\\)"):
        build_contrastive_denoising([{"labels": torch.tensor([4]), "boxes": torch.rand(1, 4)}], 4, 3)
    with pytest.raises(KeyError, match="'labels' and 'boxes'"):
        build_contrastive_denoising([{"labels": torch.tensor([1])}], 4, 3)
    with pytest.raises(ValueError, match="2 labels but 1 boxes"):
        build_contrastive_denoising([{"labels": torch.tensor([1, 2]), "boxes": torch.rand(1, 4)}], 4, 3)
    q = build_contrastive_denoising(_targets([2]), 4, 3, num_denoising=4)
    with pytest.raises(ValueError, match="denoising \\+ 3 matching"):
        split_denoising_outputs({"pred_logits": torch.randn(1, 3, 4), "pred_boxes": torch.rand(1, 3, 4)}, q.meta)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_runs_on_cuda_with_a_cpu_generator():
    targets = [{k: v.cuda() for k, v in t.items()} for t in _targets([2, 1])]
    a = build_contrastive_denoising(targets, 4, 5, num_denoising=10, generator=_gen(3))
    b = build_contrastive_denoising(_targets([2, 1]), 4, 5, num_denoising=10, generator=_gen(3))
    assert a.labels.is_cuda and a.attn_mask.is_cuda and a.meta.positive_idx[0].is_cuda
    assert torch.equal(a.labels.cpu(), b.labels) and torch.allclose(a.boxes_unact.cpu(), b.boxes_unact, atol=1e-5)


def test_the_noise_traces_under_torch_compile_at_any_number_of_boxes():
    """torch.compile(model) reaches the denoising builder with a new box count every few batches; it runs eagerly
    there and draws what eager mode draws at the same seed (before: tracing failed once the count was a symbol,
    torch.rand(generator=None) at a symbolic size)."""
    torch._dynamo.reset()
    def in_a_model(targets):  # as a model's compiled forward calls it
        queries = build_contrastive_denoising(targets, num_classes=4, num_queries=7, num_denoising=20, box_noise_scale=0.4)
        return queries.labels + 0, queries.boxes_unact * 1

    compiled = torch.compile(in_a_model, dynamic=True)
    for counts in ([3, 1], [5, 2], [4, 4]):
        targets = _targets(counts)
        torch.manual_seed(7)
        got_labels, got_boxes = compiled(targets)
        torch.manual_seed(7)
        want = build_contrastive_denoising(targets, num_classes=4, num_queries=7, num_denoising=20, box_noise_scale=0.4)
        assert torch.equal(got_labels, want.labels)
        assert torch.equal(got_boxes, want.boxes_unact)
    torch._dynamo.reset()
