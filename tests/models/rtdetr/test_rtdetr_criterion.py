"""RT-DETR's training loss in visiontf equals transformers' ``loss_rt_detr.py`` term by term.

The family's criterion is chosen by the model (``RTDETR.set_loss_options``: varifocal loss, focal matching cost class
2 / L1 5 / GIoU 2, weights 1 / 5 / 2): ``build_criterion(model)`` and the detection task build it with no flag. On
the same predictions (random, for every decoder layer, the selected proposals and the denoising queries of two
groups) and targets (an image without boxes among them), transformers' ``RTDetrLoss`` and visiontf's ``SetCriterion``
give the same matching and every weighted term within 1e-5. The original's own criterion is compared on its own
training step in ``tests/models/rtdetr/test_rtdetr_checkpoints.py``.
"""
from __future__ import annotations

import re

import pytest
import torch
from rtdetr_helpers import NUM_CLASSES, QUERIES, one_thread, transformers_config  # noqa: F401 (one_thread: a module fixture)

from visiontf.models import create_model
from visiontf.models.deformable_detr.denoising import build_contrastive_denoising
from visiontf.models.rtdetr.rtdetr import RTDETR_LOSS
from visiontf.set_prediction.set_loss import build_criterion

pytest.importorskip("transformers")

LAYERS = 3


def _outputs(seed: int, dn_queries: int):
    g = torch.Generator().manual_seed(seed)
    B = 3
    logits = lambda n: 2 * torch.randn(B, n, NUM_CLASSES, generator=g)  # noqa: E731
    boxes = lambda n: torch.cat([torch.rand(B, n, 2, generator=g) * 0.8 + 0.1, torch.rand(B, n, 2, generator=g) * 0.4 + 0.05], -1)  # noqa: E731
    layers = [(logits(dn_queries + QUERIES), boxes(dn_queries + QUERIES)) for _ in range(LAYERS)]
    return layers, (logits(QUERIES), boxes(QUERIES))


def _targets(seed: int):
    g = torch.Generator().manual_seed(seed)
    out = []
    for n in (2, 0, 4):
        centre = torch.rand(n, 2, generator=g) * 0.6 + 0.2
        size = torch.rand(n, 2, generator=g) * 0.3 + 0.05
        out.append({"labels": torch.randint(0, NUM_CLASSES, (n,), generator=g), "boxes": torch.cat([centre, size], 1)})
    return out


@pytest.fixture(scope="module")
def model():
    with torch.device("meta"):
        return create_model("rtdetrv2_r18vd", num_classes=NUM_CLASSES)


def test_the_family_chooses_the_varifocal_loss_and_its_weights(model):
    criterion = build_criterion(model, NUM_CLASSES)
    assert criterion.class_loss == "vfl" and criterion.weight_dict == {"loss_ce": 1.0, "loss_bbox": 5.0, "loss_giou": 2.0}
    matcher = criterion.matcher
    assert (matcher.cost_class, matcher.cost_bbox, matcher.cost_giou, matcher.focal_alpha, matcher.focal_gamma) == (2.0, 5.0, 2.0, 0.25, 2.0)
    # a task's named override still goes on top of the family's
    assert build_criterion(model, NUM_CLASSES, {"cost_class": 4.0}).matcher.cost_class == 4.0
    assert RTDETR_LOSS.class_loss == "vfl"


@pytest.mark.parametrize("seed", [0, 1])
def test_every_term_and_the_matching_equal_transformers(model, seed):
    from transformers.loss.loss_rt_detr import RTDetrHungarianMatcher, RTDetrLoss

    targets = _targets(seed)
    dn = build_contrastive_denoising(targets, NUM_CLASSES, QUERIES, 8, 0.5, 1.0, generator=torch.Generator().manual_seed(seed),
                                     inverse_sigmoid_eps=1e-5, pad_box="zero")
    P = dn.meta.pad_size
    assert dn.meta.num_groups == 2
    layers, proposals = _outputs(seed, P)
    ours = {"pred_logits": layers[-1][0][:, P:], "pred_boxes": layers[-1][1][:, P:],
            "aux_outputs": [{"pred_logits": a[:, P:], "pred_boxes": b[:, P:]} for a, b in layers[:-1]],
            "interm_outputs": {"pred_logits": proposals[0], "pred_boxes": proposals[1]},
            "dn_outputs": {"pred_logits": layers[-1][0][:, :P], "pred_boxes": layers[-1][1][:, :P],
                           "aux_outputs": [{"pred_logits": a[:, :P], "pred_boxes": b[:, :P]} for a, b in layers[:-1]]},
            "dn_meta": dn.meta}
    theirs = {"logits": ours["pred_logits"], "pred_boxes": ours["pred_boxes"],
              "auxiliary_outputs": [{"logits": a["pred_logits"], "pred_boxes": a["pred_boxes"]} for a in ours["aux_outputs"]]
              + [{"logits": proposals[0], "pred_boxes": proposals[1]}],
              "dn_auxiliary_outputs": [{"logits": a[:, :P], "pred_boxes": b[:, :P]} for a, b in layers],
              "denoising_meta_values": {"dn_positive_idx": list(dn.meta.positive_idx), "dn_num_group": dn.meta.num_groups,
                                        "dn_num_split": [P, QUERIES]}}
    labels = [{"class_labels": t["labels"], "boxes": t["boxes"]} for t in targets]
    config = transformers_config("v2")
    reference = RTDetrLoss(config)(theirs, labels)

    criterion = build_criterion(model, NUM_CLASSES)
    terms = criterion(ours, targets, sync_num_boxes=False)
    compared = {}
    for name, value in terms.items():
        m = re.fullmatch(r"loss_(ce|bbox|giou)(?:_(\d+|interm|dn)(?:_(\d+))?)?", name)
        if not m:
            continue
        base = {"ce": "loss_vfl", "bbox": "loss_bbox", "giou": "loss_giou"}[m[1]]
        weight = criterion.weight_dict[f"loss_{m[1]}"]
        suffix = {None: "", "interm": f"_aux_{LAYERS - 1}", "dn": f"_dn_{LAYERS - 1 if m[3] is None else m[3]}"}.get(m[2], f"_aux_{m[2]}")
        compared[base + suffix] = (weight * value).item()
    assert set(compared) == set(reference)
    worst = {k: abs(v - reference[k].item()) for k, v in compared.items()}
    assert max(worst.values()) < 1e-5, worst
    assert all(torch.isfinite(v) for v in reference.values()) and sum(v.item() for v in reference.values()) > 1.0

    matched_theirs = RTDetrHungarianMatcher(config)(theirs, labels)
    for (q, t), (q2, t2) in zip(criterion.matcher(ours, targets), matched_theirs):
        assert torch.equal(q, q2) and torch.equal(t, t2)
