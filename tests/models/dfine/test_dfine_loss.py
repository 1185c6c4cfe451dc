"""D-FINE's and DEIM's training loss in visiontf equals transformers' ``loss_d_fine.py`` and ``loss_deimv2.py`` term by term.

The family's criterion is chosen by the model (``DFINE.set_loss_options``; ``build_criterion(model)`` and the
detection task build it with no flag): varifocal (D-FINE) or matchability-aware (DEIM, gamma 1.5), L1, GIoU, the
fine-grained localisation loss (FGL) and the decoupled distillation (DDF, GO-LSD), with the box terms on the union of
all layers' matchings. On the same random predictions (3 decoder layers with edge logits, the first layer's extra
box, the selected proposals, two denoising groups) and targets (an image without boxes among them), each term is
compared with transformers' own function for it, given the same matching, normaliser and weights: within 1e-5.

transformers composes the terms differently from the originals (it matches every layer on its own, has no union in
D-FINE and lists the first layer's extra box with the next layer's edge logits), so its composition is not compared;
the originals' composition is, on their own recorded losses (``tests/models/dfine/test_dfine_checkpoints.py``). One
term is the originals' and not transformers': the denoising queries' DDF weighs matched and unmatched edges with the
matching queries' counts, where transformers counts the denoising queries; it is compared there too.
"""
from __future__ import annotations

import pytest
import torch
from rtdetr_helpers import NUM_CLASSES, QUERIES, one_thread  # noqa: F401 (one_thread: a module fixture)
from torchvision.ops import box_convert

from visiontf.models import create_model
from visiontf.models.deformable_detr.denoising import build_contrastive_denoising, denoising_match_indices
from visiontf.set_prediction.fine_grained import FineGrainedCriterion, box_to_distance, union_matching
from visiontf.set_prediction.set_loss import build_criterion

pytest.importorskip("transformers")

LAYERS, BINS = 3, 33
TOL = 1e-5


def _outputs(seed: int, P: int) -> dict:
    """Random outputs in visiontf's layout: matching queries, then the denoising ones under ``dn_outputs``."""
    g = torch.Generator().manual_seed(seed)
    B, N = 3, P + QUERIES
    logits = lambda: 2 * torch.randn(B, N, NUM_CLASSES, generator=g)  # noqa: E731
    boxes = lambda: torch.cat([torch.rand(B, N, 2, generator=g) * 0.6 + 0.2, torch.rand(B, N, 2, generator=g) * 0.3 + 0.05], -1)  # noqa: E731
    corners = lambda: 1.5 * torch.randn(B, N, 4 * BINS, generator=g)  # noqa: E731
    ref = boxes()
    layers = [(logits(), boxes(), corners()) for _ in range(LAYERS)]
    pre = (logits(), boxes())

    def part(s):
        group = {"pred_logits": layers[-1][0][:, s], "pred_boxes": layers[-1][1][:, s], "pred_corners": layers[-1][2][:, s], "ref_points": ref[:, s],
                 "aux_outputs": [{"pred_logits": a[:, s], "pred_boxes": b[:, s], "pred_corners": c[:, s], "ref_points": ref[:, s]}
                                 for a, b, c in layers[:-1]],
                 "pre_outputs": {"pred_logits": pre[0][:, s], "pred_boxes": pre[1][:, s]}}
        return group

    out = part(slice(P, None))
    out["interm_outputs"] = {"pred_logits": 2 * torch.randn(B, QUERIES, NUM_CLASSES, generator=g),
                             "pred_boxes": torch.cat([torch.rand(B, QUERIES, 2, generator=g) * 0.6 + 0.2,
                                                      torch.rand(B, QUERIES, 2, generator=g) * 0.3 + 0.05], -1)}
    out["dn_outputs"] = part(slice(None, P))
    return out


def _targets(seed: int):
    g = torch.Generator().manual_seed(seed)
    out = []
    for n in (3, 0, 4):
        centre = torch.rand(n, 2, generator=g) * 0.6 + 0.2
        size = torch.rand(n, 2, generator=g) * 0.3 + 0.05
        out.append({"labels": torch.randint(0, NUM_CLASSES, (n,), generator=g), "boxes": torch.cat([centre, size], 1)})
    return out


def _hf(layer: dict, teacher: dict | None = None) -> dict:
    """One output in transformers' naming."""
    out = {"logits": layer["pred_logits"], "pred_boxes": layer["pred_boxes"]}
    if "pred_corners" in layer:
        out |= {"pred_corners": layer["pred_corners"], "ref_points": layer["ref_points"]}
        out |= {"teacher_corners": (teacher or layer)["pred_corners"], "teacher_logits": (teacher or layer)["pred_logits"]}
    return out


@pytest.fixture(scope="module")
def models():
    with torch.device("meta"):
        return {"dfine": create_model("dfine_s", num_classes=NUM_CLASSES), "deim": create_model("deim_dfine_s", num_classes=NUM_CLASSES)}


def _reference(kind: str):
    from transformers import Deimv2Config, DFineConfig
    from transformers.loss.loss_d_fine import DFineLoss
    from transformers.loss.loss_deimv2 import Deimv2Loss

    if kind == "dfine":
        return DFineLoss(DFineConfig(num_labels=NUM_CLASSES))
    return Deimv2Loss(Deimv2Config(num_labels=NUM_CLASSES, focal_loss_gamma=1.5))


def test_the_families_choose_their_losses(models):
    dfine, deim = build_criterion(models["dfine"], NUM_CLASSES), build_criterion(models["deim"], NUM_CLASSES)
    assert isinstance(dfine, FineGrainedCriterion) and isinstance(deim, FineGrainedCriterion)
    assert (dfine.class_loss, dfine.focal_gamma, deim.class_loss, deim.focal_gamma) == ("vfl", 2.0, "mal", 1.5)
    weights = {"loss_ce": 1.0, "loss_bbox": 5.0, "loss_giou": 2.0, "loss_fgl": 0.15, "loss_ddf": 1.5}
    assert dfine.weight_dict == weights and deim.weight_dict == weights
    for c in (dfine, deim):  # DEIM's class loss has its own gamma; the matcher keeps D-FINE's focal cost
        m = c.matcher
        assert (m.cost_class, m.cost_bbox, m.cost_giou, m.focal_alpha, m.focal_gamma) == (2.0, 5.0, 2.0, 0.25, 2.0)
        assert (c.reg_max, c.reg_scale, c.up, c.ddf_temperature, c.union_matching) == (32, 4.0, 0.5, 5.0, True)
    assert build_criterion(models["dfine"], NUM_CLASSES, {"cost_class": 4.0}).matcher.cost_class == 4.0


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("kind", ["dfine", "deim"])
def test_every_term_equals_transformers(models, kind, seed):
    targets = _targets(seed)
    dn = build_contrastive_denoising(targets, NUM_CLASSES, QUERIES, 8, 0.5, 1.0, generator=torch.Generator().manual_seed(seed),
                                     inverse_sigmoid_eps=1e-5, pad_box="zero")
    assert dn.meta.num_groups == 2
    out = _outputs(seed, dn.meta.pad_size)
    out["dn_meta"] = dn.meta
    criterion = build_criterion(models[kind], NUM_CLASSES)
    terms = criterion(out, targets, sync_num_boxes=False)
    reference = _reference(kind)
    labels = [{"class_labels": t["labels"], "boxes": t["boxes"]} for t in targets]
    class_term = {"dfine": ("loss_labels_vfl", "loss_vfl"), "deim": ("loss_labels_mal", "loss_mal")}[kind]

    # the matchings: each output's own, and their union (transformers' dense one-to-one indices, DEIM's GO indices)
    layers = [*out["aux_outputs"], out]
    own = [criterion.matcher(x, targets) for x in (*layers, out["pre_outputs"], out["interm_outputs"])]
    theirs = [reference.matcher(_hf(x), labels) for x in (*layers, out["pre_outputs"], out["interm_outputs"])]
    for a, b in zip(own, theirs):
        assert all(torch.equal(q, q2) and torch.equal(t, t2) for (q, t), (q2, t2) in zip(a, b))
    from transformers.loss.loss_deimv2 import Deimv2Loss

    union = union_matching([own[-3], *own[:-3], own[-2], own[-1]])
    dense = Deimv2Loss._get_dense_o2o_indices(None, theirs[-3], [*theirs[:-3], theirs[-2], theirs[-1]])
    assert all(torch.equal(q, q2) and torch.equal(t, t2) for (q, t), (q2, t2) in zip(union, dense))
    num_boxes, num_union = 7.0, float(sum(len(q) for q, _ in union))

    compared = {}
    named = {"": (out, own[-3]), **{f"_{i}": (x, own[i]) for i, x in enumerate(out["aux_outputs"])}, "_pre": (out["pre_outputs"], own[-2]),
             "_interm": (out["interm_outputs"], own[-1])}
    for suffix, (x, matched) in named.items():
        teacher = out if suffix[1:].isdigit() else None
        hf = _hf(x, teacher)
        compared[f"loss_ce{suffix}"] = getattr(reference, class_term[0])(hf, labels, matched, num_boxes)[class_term[1]]
        boxes = reference.loss_boxes(hf, labels, union, num_union)
        compared[f"loss_bbox{suffix}"], compared[f"loss_giou{suffix}"] = boxes["loss_bbox"], boxes["loss_giou"]
        if "pred_corners" in x:
            local = reference.loss_local(hf, labels, union, num_union)
            compared[f"loss_fgl{suffix}"] = local["loss_fgl"]
            if teacher is not None:
                compared[f"loss_ddf{suffix}"] = local["loss_ddf"]
    fixed = denoising_match_indices(dn.meta)
    n = num_boxes * dn.meta.num_groups
    dn_layers = [*out["dn_outputs"]["aux_outputs"], out["dn_outputs"]]
    for i, x in enumerate(dn_layers):
        suffix = "_dn" if i == len(dn_layers) - 1 else f"_dn_{i}"
        hf = _hf(x)
        compared[f"loss_ce{suffix}"] = getattr(reference, class_term[0])(hf, labels, fixed, n)[class_term[1]]
        boxes = reference.loss_boxes(hf, labels, fixed, n)
        compared[f"loss_bbox{suffix}"], compared[f"loss_giou{suffix}"] = boxes["loss_bbox"], boxes["loss_giou"]
        compared[f"loss_fgl{suffix}"] = reference.loss_local(hf, labels, fixed, n)["loss_fgl"]
    hf = _hf(out["dn_outputs"]["pre_outputs"])
    compared["loss_ce_dn_pre"] = getattr(reference, class_term[0])(hf, labels, fixed, n)[class_term[1]]
    boxes = reference.loss_boxes(hf, labels, fixed, n)
    compared["loss_bbox_dn_pre"], compared["loss_giou_dn_pre"] = boxes["loss_bbox"], boxes["loss_giou"]

    ours = {k: v for k, v in terms.items() if k.startswith("loss_") and not k.startswith("loss_ddf_dn")}
    assert set(ours) == set(compared)
    worst = {k: abs(ours[k].item() - v.item()) for k, v in compared.items()}
    assert max(worst.values()) < TOL, worst
    assert min(abs(v.item()) for v in compared.values() if v.item()) > 1e-3  # every term is alive
    # the weighted sum: every term with its weight (aux, pre, proposals and denoising share the base weights)
    expected = sum(criterion.weight_dict[k.split("_")[0] + "_" + k.split("_")[1]] * v for k, v in terms.items()
                   if k.startswith("loss_"))
    assert abs(terms["loss"].item() - expected.item()) < 1e-4


def test_target_edges_split_between_their_two_nearest_bins():
    """The FGL target of an edge (its offset between two bins of W) against transformers' ``bbox2distance``."""
    from transformers.loss.loss_d_fine import bbox2distance

    g = torch.Generator().manual_seed(0)
    ref = torch.cat([torch.rand(50, 2, generator=g) * 0.6 + 0.2, torch.rand(50, 2, generator=g) * 0.3 + 0.05], -1)
    target = torch.cat([ref[:, :2] + 0.2 * torch.randn(50, 2, generator=g), ref[:, 2:] * (0.2 + 3 * torch.rand(50, 2, generator=g))], -1)
    xyxy = box_convert(target, "cxcywh", "xyxy")
    ours = box_to_distance(ref, xyxy, 32, 4.0, 0.5)
    theirs = bbox2distance(ref, xyxy, 32, 4.0, torch.tensor([0.5]))
    for a, b in zip(ours, theirs):
        assert (a - b).abs().max() < 1e-6
    assert (ours[0] == 31.9).any() and (ours[0] == 0).any()  # both ends of W are reached
