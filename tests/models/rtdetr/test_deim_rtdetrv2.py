"""ShihuaHuang95/DEIM's RT-DETRv2 models (``deim_rtdetrv2_*``): its checkpoints load through the RT-DETR converter with
its outputs, and its training loss (the matchability-aware loss) runs on the RT-DETRv2 decoder.

DEIM's RT-DETRv2 is lyuwenyu's v2 network with options (read from its ``configs/base/rt_deim.yml`` and
``engine/deim/rtdetrv2_decoder.py``): SiLU in the decoder's FFNs and MLP heads, a query-position MLP of three d-wide
layers (``query_pos_method: as_reg``; v2's has two, 2d wide), every backbone BatchNorm trained, D-FINE's denoising
boxes (negative sizes flipped) and ``DEIMCriterion`` with the matchability-aware loss (gamma 1.5) and no union of the
layers' matchings. Its key names are v2's (``published_rtdetrv2_layouts.txt``), so its files load through
:mod:`visiontf.models.rtdetr.convert`.

The baseline is recorded, not re-run: ``tests/fixtures/deim/deim_rtdetrv2_r18.safetensors`` holds what DEIM's own code
(at the commit in its meta) computed with random weights at toy widths (``scripts/fixtures/make_deim.py --repo PATH``
writes it). The fixture's weights are saved as DEIM's solver saves a checkpoint (``model`` and ``ema`` entries) and
loaded with ``create_model("deim_rtdetrv2_r18vd", pretrained=file)``. Compared: evaluation outputs on a padded batch
and a single image (float32 1e-4, float64 1e-8), a training step with the denoising queries DEIM drew (every layer's
outputs, each weighted loss term against DEIMCriterion's, the matching), the parameter counts and key layouts of the
five published models; and on the RT-DETRv2 decoder's own outputs, the matchability-aware and box terms against
transformers' ``loss_deimv2`` (< 1e-5 per term).
"""
from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest
import torch
from reference.fixtures import FIXTURES, Fixture, load_fixture, read_layouts
from rtdetr_helpers import assert_eval_outputs_match, one_thread, recorded_settings  # noqa: F401 (one_thread: a module fixture, one torch thread)

from visiontf.core.config_files import read_config
from visiontf.models import WeightsLayoutError, create_model
from visiontf.models.deformable_detr.denoising import DenoisingQueries, build_contrastive_denoising, denoising_match_indices
from visiontf.models.rtdetr.convert import checkpoint_entry, convert_state_dict
from visiontf.set_prediction.criterion import SetCriterion
from visiontf.set_prediction.set_loss import build_criterion
from visiontf.tasks.detection.detection_task import DetectionTask
from visiontf.tasks.optim import FlatCosine

TOL = {"float32": 1e-4, "float64": 1e-8}
LOSS_TOL = {"float32": 5e-5, "float64": 1e-5}
CASE, NAME = "deim_rtdetrv2_r18", "deim_rtdetrv2_r18vd"
LAYOUTS = FIXTURES / "deim" / "published_rtdetrv2_layouts.txt"
#: DEIM's README: parameters in millions (S, M, M*, L, X)
PUBLISHED_MILLIONS = {"r18vd": 20, "r34vd": 31, "r50vd_m": 33, "r50vd": 42, "r101vd": 76}
WIDER = {torch.float16: torch.float32, torch.int16: torch.int64}
CONFIGS = Path(__file__).resolve().parents[3] / "configs" / "deim"
#: DEIM's configs/deim_rtdetrv2/deim_*_coco.yml (with base/rt_deim.yml, rt_optimizer.yml): model -> (config, epochs, backbone
#: lr, its policy epochs [start, mosaic and MixUp stop, strong augmentation stop], flat_epoch, no_aug_epoch); every one:
#: lr 2e-4, weight decay 1e-4, total batch 16, EMA 0.9999 over 2000 warm-up updates, flat-cosine with lr_gamma 0.5
RECIPES = {"r18vd": ("120e", 120, 2e-4, (4, 64, 117), 64, 3), "r34vd": ("120e", 120, 1e-4, (4, 64, 117), 64, 3),
           "r50vd_m": ("60e", 60, 2e-5, (4, 34, 58), 34, 2), "r50vd": ("60e", 60, 2e-5, (4, 34, 58), 34, 2),
           "r101vd": ("60e", 60, 2e-6, (4, 34, 58), 34, 2)}


@cache
def fixture() -> Fixture:
    return load_fixture("deim", CASE)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """The fixture's weights as DEIM's solver saves them (both entries)."""
    state = {k: v.to(WIDER.get(v.dtype, v.dtype)) for k, v in fixture().weights.items()}
    path = tmp_path_factory.mktemp("deim_rtdetrv2") / f"{CASE}.pth"
    torch.save({"model": state, "ema": {"module": state, "updates": 1000}, "last_epoch": 119, "date": "2024-12-03"}, path)
    return path


def load(path: Path) -> torch.nn.Module:
    return create_model(NAME, pretrained=str(path), input_norm="none", **recorded_settings(fixture().meta["settings"], NAME)).eval()


def diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.double() - b.double()).abs().max().item()


def test_the_variants_are_v2_with_deims_options():
    with torch.device("meta"):
        deim, v2 = create_model("deim_rtdetrv2_r50vd_m"), create_model("rtdetrv2_r50vd_m")
    d, o = deim.options["decoder"], v2.options["decoder"]
    assert (d.activation, d.mlp_act, d.query_pos_method) == ("silu", "silu", "as_reg")
    assert (o.activation, o.mlp_act, o.query_pos_method) == ("relu", "relu", "default")
    assert (d.num_layers, d.eval_idx, o.num_layers) == (3, 2, 6)  # DEIM's M* keeps 3 of the 6 layers
    assert [tuple(x.weight.shape) for x in deim.decoder.query_pos_head.layers] == [(256, 4), (256, 256), (256, 256)]
    # every backbone BatchNorm trained (their affine parameters count) and nothing frozen
    assert all(p.requires_grad for p in deim.parameters()) and not all(p.requires_grad for p in v2.parameters())
    assert not any("FrozenBatchNorm" in type(m).__name__ for m in deim.modules())
    assert deim.denoising.flip_negative_sizes and not v2.denoising.flip_negative_sizes
    assert isinstance(deim.decoder.layers[0].mlp.act, torch.nn.SiLU)


# ------------------------------------------------------------------------------------ the recorded original
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_eval_outputs_equal_deims(dtype, checkpoint):
    fx = fixture()
    assert fx.meta["ranking_margin"] > 100 * 1e-6
    model = load(checkpoint).to(getattr(torch, dtype))
    inputs = {name: fx.inputs[f"{name}.images"].to(getattr(torch, dtype)) for name in ("batch", "single")}
    assert_eval_outputs_match(model, fx.outputs[dtype], inputs, TOL[dtype])


def _targets(fx: Fixture) -> list[dict[str, torch.Tensor]]:
    return [{"labels": fx.inputs[f"targets.{i}.labels"].long(), "boxes": fx.inputs[f"targets.{i}.boxes"].float()} for i in range(2)]


def _recorded_denoising(fx: Fixture, targets: list[dict]) -> DenoisingQueries:
    settings = fx.meta["settings"]
    layout = build_contrastive_denoising(targets, settings["num_classes"], settings["decoder"]["num_queries"],
                                         settings["denoising"]["num_denoising"], 0.5, 1.0, inverse_sigmoid_eps=1e-5, pad_box="zero")
    assert layout.meta.num_groups == fx.meta["dn"]["num_groups"] and torch.equal(layout.attn_mask, fx.inputs["dn.attn_mask"])
    return DenoisingQueries(fx.inputs["dn.labels"].long(), fx.inputs["dn.boxes_unact"], layout.attn_mask, layout.meta)


def _deim_name(ours: str, layers: int) -> str:
    """visiontf's term (``loss_ce_1``, ``loss_bbox_interm``, ``loss_giou_dn_0``) -> DEIMCriterion's."""
    m = re.fullmatch(r"loss_(ce|bbox|giou)(?:_(\d+|interm|dn)(?:_(\d+))?)?", ours)
    base = {"ce": "loss_mal", "bbox": "loss_bbox", "giou": "loss_giou"}[m[1]]
    if m[2] is None:
        return base
    if m[2] == "interm":
        return f"{base}_enc_0"
    if m[2] == "dn":
        return f"{base}_dn_{layers - 1 if m[3] is None else m[3]}"
    return f"{base}_aux_{m[2]}"


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_training_step_and_loss_terms_equal_deims(dtype, checkpoint):
    fx = fixture()
    model = load(checkpoint).to(getattr(torch, dtype)).train()
    targets = _targets(fx)
    dn = _recorded_denoising(fx, targets)
    model.denoising = lambda *args: dn
    out = model(fx.inputs["batch.images"].to(getattr(torch, dtype)), targets=targets)
    theirs = fx.outputs[dtype]
    named = {"pred_logits": out["pred_logits"], "pred_boxes": out["pred_boxes"],
             "enc.0.pred_logits": out["interm_outputs"]["pred_logits"], "enc.0.pred_boxes": out["interm_outputs"]["pred_boxes"]}
    for prefix, layers in (("aux", out["aux_outputs"]), ("dn", [*out["dn_outputs"]["aux_outputs"], out["dn_outputs"]])):
        for i, layer in enumerate(layers):
            named |= {f"{prefix}.{i}.pred_logits": layer["pred_logits"], f"{prefix}.{i}.pred_boxes": layer["pred_boxes"]}
    assert set(named) == {k[6:] for k in theirs if k.startswith("train.") and not k.startswith(("train.loss.", "train.match."))}
    worst = {k: diff(v, theirs[f"train.{k}"]) for k, v in named.items()}
    assert max(worst.values()) < TOL[dtype], worst

    criterion = build_criterion(model, model.num_classes)
    terms = criterion(out, targets, sync_num_boxes=False)
    layers = len(out["aux_outputs"]) + 1
    compared = {}
    for name, value in terms.items():
        if re.fullmatch(r"loss_(ce|bbox|giou).*", name):
            weight = criterion.weight_dict.get(name, criterion.weight_dict["_".join(name.split("_")[:2])])
            compared[_deim_name(name, layers)] = (weight * value).item()
    assert set(compared) == set(fx.meta["loss_names"])
    worst = {k: abs(v - theirs[f"train.loss.{k}"].item()) for k, v in compared.items()}
    assert max(worst.values()) < LOSS_TOL[dtype], worst
    for b, (q, t) in enumerate(criterion.matcher(out, targets)):
        assert torch.equal(q, theirs[f"train.match.{b}.query"].long()) and torch.equal(t, theirs[f"train.match.{b}.target"].long())


def test_both_entries_load_strictly_and_the_toy_counts_agree(checkpoint):
    model = load(checkpoint)
    assert sum(p.numel() for p in model.parameters()) == fixture().meta["parameters"]
    saved = torch.load(checkpoint, weights_only=True)
    for entry in ("model", "ema"):
        converted = convert_state_dict(checkpoint_entry(saved, entry), model)
        assert converted.keys() == model.state_dict().keys()
        assert all(torch.equal(converted[k], v) for k, v in model.state_dict().items() if not k.endswith("num_batches_tracked"))


def test_a_deim_file_does_not_load_into_plain_rtdetrv2(checkpoint):
    """The query-position MLPs differ (DEIM's third layer, v2's 2d-wide first): picking the wrong name fails loudly."""
    with pytest.raises(WeightsLayoutError, match=r"tensor\(s\) of the weights have another shape than in rtdetrv2_r18vd as "
                                                 r"built \(weights -> model\): decoder\.query_pos_head"):
        create_model("rtdetrv2_r18vd", pretrained=str(checkpoint), input_norm="none",
                     **recorded_settings(fixture().meta["settings"], "rtdetrv2_r18vd"))
    settings = recorded_settings(fixture().meta["settings"], NAME)  # the same spec over either variant's backbone
    with pytest.raises(RuntimeError, match="query_pos_head"):  # and the other way round (torch's own load_state_dict)
        create_model(NAME, **settings).load_state_dict(create_model("rtdetrv2_r18vd", **settings).state_dict())


def published() -> dict[str, tuple[int, dict[str, torch.Size]]]:
    """``LAYOUTS``: section -> (parameter count, {key: shape})."""
    return read_layouts(LAYOUTS)


@pytest.mark.parametrize("size", sorted(PUBLISHED_MILLIONS))
def test_published_models_have_deims_layout_and_parameter_count(size):
    """DEIM's own build at full width (80 classes): the same count, and every tensor of the listed layouts mapped to
    one of the same shape (the stored anchors dropped)."""
    name = f"deim_rtdetrv2_{size}"
    count, layout = published()[name]
    assert count // 10**6 == PUBLISHED_MILLIONS[size]
    with torch.device("meta"):
        model = create_model(name)
    assert sum(p.numel() for p in model.parameters()) == count
    if layout:
        assert "decoder.anchors" in layout and "decoder.query_pos_head.layers.2.weight" in layout
        own = model.state_dict()
        converted = convert_state_dict({k: torch.empty(s, device="meta") for k, s in layout.items()}, model)
        assert set(converted) == set(own)
        assert all(converted[k].shape == own[k].shape for k in own)


# ------------------------------------------------------------------------------------ training with the MAL
def _tiny(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return create_model(NAME, num_classes=5, input_norm="none", backbone={"kwargs": {"stem_width": 4, "widths": (8, 8, 16, 16), "blocks": (1, 1, 1, 1)}},
                        encoder={"hidden_dim": 16, "nhead": 2, "dim_feedforward": 32},
                        decoder={"hidden_dim": 16, "nhead": 2, "dim_feedforward": 32, "num_queries": 10},
                        denoising={"num_denoising": 6}, num_select=10)


def _batch(seed: int) -> tuple[torch.Tensor, list[dict[str, torch.Tensor]]]:
    g = torch.Generator().manual_seed(seed)
    targets = []
    for n in (3, 0, 2):
        centre, size = 0.25 + 0.5 * torch.rand(n, 2, generator=g), 0.1 + 0.3 * torch.rand(n, 2, generator=g)
        targets.append({"labels": torch.randint(0, 5, (n,), generator=g), "boxes": torch.cat([centre, size], 1)})
    return torch.rand(3, 3, 64, 64, generator=g), targets


def test_the_criterion_is_deims():
    with torch.device("meta"):
        model = create_model(NAME)
    criterion = build_criterion(model, 80)
    assert type(criterion) is SetCriterion
    assert (criterion.class_loss, criterion.focal_gamma) == ("mal", 1.5)
    assert criterion.weight_dict == {"loss_ce": 1.0, "loss_bbox": 5.0, "loss_giou": 2.0}
    m = criterion.matcher  # the matching cost keeps RT-DETR's focal gamma 2
    assert (m.cost_class, m.cost_bbox, m.cost_giou, m.focal_alpha, m.focal_gamma) == (2.0, 5.0, 2.0, 0.25, 2.0)


def test_a_training_step_with_the_mal_is_finite_and_reaches_every_parameter():
    model = _tiny().train()
    images, targets = _batch(1)
    out = model(images, targets=targets)
    criterion = build_criterion(model, model.num_classes)
    terms = criterion(out, targets, sync_num_boxes=False)
    assert torch.isfinite(terms["loss"]) and terms["loss"] > 0
    assert {"loss_ce", "loss_ce_0", "loss_ce_interm", "loss_ce_dn"} <= set(terms)
    terms["loss"].backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.requires_grad}
    assert all(g is not None and torch.isfinite(g).all() for g in grads.values()), [n for n, g in grads.items() if g is None]
    assert grads["decoder.query_pos_head.layers.2.weight"].abs().sum() > 0


@pytest.mark.parametrize("seed", [0, 1])
def test_mal_and_box_terms_equal_transformers(seed):
    """Each class (MAL) and box term on the RT-DETRv2 decoder's outputs against transformers' ``Deimv2Loss``, given
    the same matching and normaliser."""
    pytest.importorskip("transformers")
    from transformers import Deimv2Config
    from transformers.loss.loss_deimv2 import Deimv2Loss

    model = _tiny(seed).train()
    images, targets = _batch(seed)
    out = model(images, targets=targets)
    criterion = build_criterion(model, model.num_classes)
    terms = criterion(out, targets, sync_num_boxes=False)
    reference = Deimv2Loss(Deimv2Config(num_labels=model.num_classes, focal_loss_gamma=1.5))
    labels = [{"class_labels": t["labels"], "boxes": t["boxes"]} for t in targets]
    num_boxes = float(sum(len(t["labels"]) for t in targets))
    outputs = {"": out, **{f"_{i}": x for i, x in enumerate(out["aux_outputs"])}, "_interm": out["interm_outputs"]}
    compared = {}
    for suffix, x in outputs.items():
        hf = {"logits": x["pred_logits"], "pred_boxes": x["pred_boxes"]}
        matched = criterion.matcher(x, targets)
        compared[f"loss_ce{suffix}"] = reference.loss_labels_mal(hf, labels, matched, num_boxes)["loss_mal"]
        boxes = reference.loss_boxes(hf, labels, matched, num_boxes)
        compared[f"loss_bbox{suffix}"], compared[f"loss_giou{suffix}"] = boxes["loss_bbox"], boxes["loss_giou"]
    fixed, n = denoising_match_indices(out["dn_meta"]), num_boxes * out["dn_meta"].num_groups
    dn_layers = [*out["dn_outputs"]["aux_outputs"], out["dn_outputs"]]
    for i, x in enumerate(dn_layers):
        suffix = "_dn" if i == len(dn_layers) - 1 else f"_dn_{i}"
        hf = {"logits": x["pred_logits"], "pred_boxes": x["pred_boxes"]}
        compared[f"loss_ce{suffix}"] = reference.loss_labels_mal(hf, labels, fixed, n)["loss_mal"]
        boxes = reference.loss_boxes(hf, labels, fixed, n)
        compared[f"loss_bbox{suffix}"], compared[f"loss_giou{suffix}"] = boxes["loss_bbox"], boxes["loss_giou"]
    ours = {k: v for k, v in terms.items() if re.fullmatch(r"loss_(ce|bbox|giou).*", k)}
    assert set(ours) == set(compared)
    worst = {k: abs(ours[k].item() - v.item()) for k, v in compared.items()}
    assert max(worst.values()) < 1e-5, worst
    assert min(abs(v.item()) for v in compared.values()) > 1e-4  # every term is alive


# ------------------------------------------------------------------------------------ the recipes
@pytest.mark.parametrize("size", sorted(RECIPES))
def test_recipes_follow_deims(size):
    length, epochs, lr_backbone, (start, mosaic_stop, stop), flat, no_aug = RECIPES[size]
    cfg = read_config(CONFIGS / f"deim_rtdetrv2_{size}_{length}_coco.yaml")
    trainer, args, data = cfg["trainer"], cfg["model"]["init_args"], cfg["data"]["init_args"]
    assert args["model_name"] == f"deim_rtdetrv2_{size}" and trainer["max_epochs"] == epochs
    assert trainer["devices"] * data["batch_size"] == 16 and trainer["gradient_clip_val"] == 0.1 and trainer["sync_batchnorm"]
    assert (args["lr"], args["lr_backbone"], args["weight_decay"], args["warmup_steps"]) == (2e-4, lr_backbone, 1e-4, 2000)
    assert args["schedule"] == "flat_cosine" and FlatCosine.of(args["flat_cosine"]) == FlatCosine(flat, no_aug, 0.5, "quadratic")
    assert (data["mosaic"], data["mosaic_epochs"], data["strong_aug_epochs"]) == (0.5, [start, mosaic_stop], [start, stop])
    assert data["mixup"] == {"prob": 0.5, "epochs": [start, mosaic_stop]}
    assert data["scales"] == [480, 512, 544, 576, 608, 640, 640, 640, 800, 768, 736, 704, 672]  # base 640, repeated 3 times
    ema = next(c for c in trainer["callbacks"] if c["class_path"].endswith("ModelEMA"))["init_args"]
    assert ema == {"decay": 0.9999, "warmup_steps": 2000, "restart_epoch": stop}


@pytest.mark.parametrize("size", ["r18vd", "r50vd"])
def test_recipe_groups_exempt_every_norm_and_the_task_trains_with_the_mal(size):
    """DEIM's groups: every norm without weight decay (``^(?=.*(?:norm|bn)).*$``) at the base lr, the rest of the backbone
    at the backbone lr; the task's criterion is the model's (MAL), and a step reaches every parameter."""
    length = RECIPES[size][0]
    args = read_config(CONFIGS / f"deim_rtdetrv2_{size}_{length}_coco.yaml")["model"]["init_args"]
    tiny = {"backbone": {"kwargs": {"stem_width": 4, "widths": (8, 8, 16, 16), "blocks": (1, 1, 1, 1)}},
            "encoder": {"hidden_dim": 16, "nhead": 2, "dim_feedforward": 32},
            "decoder": {"hidden_dim": 16, "nhead": 2, "dim_feedforward": 32, "num_queries": 10}, "denoising": {"num_denoising": 4}}
    task = DetectionTask(args["model_name"], num_classes=5, model_kwargs=tiny, lr=args["lr"], lr_backbone=args["lr_backbone"],
                         weight_decay=args["weight_decay"], param_groups=args["param_groups"])
    assert type(task.criterion) is SetCriterion and (task.criterion.class_loss, task.criterion.focal_gamma) == ("mal", 1.5)
    norms = {f"{prefix}.{n}" for prefix, m in task.model.named_modules() if isinstance(m, (torch.nn.BatchNorm2d, torch.nn.LayerNorm))
             for n, _ in m.named_parameters(recurse=False)}
    placed = {id(p): (g["lr"], g["weight_decay"]) for g in task.configure_optimizers()["optimizer"].param_groups for p in g["params"]}
    for name, p in task.model.named_parameters():
        lr, wd = placed[id(p)]
        assert wd == (0.0 if name in norms else 1e-4), name
        assert lr == (args["lr_backbone"] if name.startswith("backbone.") and name not in norms else 2e-4), name
    images, targets = _batch(2)
    task.train()
    loss = task.training_step((images, torch.zeros(3, 64, 64, dtype=torch.bool), targets), 0)
    assert torch.isfinite(loss)
    loss.backward()
    assert not [n for n, p in task.model.named_parameters() if p.requires_grad and p.grad is None]
