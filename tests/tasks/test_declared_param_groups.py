"""Declared optimizer groups (``model.init_args.param_groups``: :class:`visiontf.tasks.optim.ParamGroupRule`): each
parameter's kind, which rule takes it, and the weight-decay exemptions of the originals' RT-DETR, D-FINE and DEIM
recipes landing on the right parameters of tiny models of each family."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from visiontf.core.config_checks import ConfigError
from visiontf.core.config_files import read_config
from visiontf.tasks.checkpoints import CheckpointError
from visiontf.tasks.detection.detection_task import DetectionTask
from visiontf.tasks.optim import ParamGroupRule, param_kinds, rule_groups

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
HEADS = {"encoder": {"hidden_dim": 32, "nhead": 2, "dim_feedforward": 32},
         "decoder": {"hidden_dim": 32, "nhead": 2, "dim_feedforward": 32, "num_queries": 10, "num_layers": 2},
         "denoising": {"num_denoising": 4}}
RTDETR = {**HEADS, "backbone": {"kwargs": {"widths": (8, 16, 32, 64), "stem_width": 4, "blocks": (1, 1, 1, 1)}}}
DFINE = {**HEADS, "backbone": {"kwargs": {"stem": (4, 4), "stages": ((4, 4, 8, 1, False, False, 3, 1), (8, 4, 16, 1, True, False, 3, 1),
                                                                    (16, 8, 24, 1, True, True, 5, 1), (24, 8, 32, 1, True, True, 5, 1))}}}


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _norm(part, kind):
    return kind == "norm"


def _head_norm(part, kind):
    return part != "backbone" and kind == "norm"


def _head_norm_bias(part, kind):
    return part != "backbone" and kind in ("norm", "bias")


def _norm_or_head_bias(part, kind):
    return kind == "norm" or (part != "backbone" and kind == "bias")


#: config -> (tiny model, which parameters the original exempts from weight decay by (top-level part, kind),
#: whether the backbone's norms train at the base lr); read from the originals' optimizer sections
FACTS = {
    "rtdetr/rtdetr_r18vd_6x_coco": ("rtdetr_tiny", _norm_or_head_bias, False),
    "rtdetr/rtdetr_r34vd_6x_coco": ("rtdetr_tiny", _norm_or_head_bias, False),
    "rtdetr/rtdetr_r50vd_6x_coco": ("rtdetr_tiny", lambda part, kind: part == "encoder" and kind in ("norm", "bias"), False),
    "rtdetr/rtdetr_r101vd_6x_coco": ("rtdetr_tiny", lambda part, kind: False, False),
    "rtdetr/rtdetrv2_r18vd_120e_coco": ("rtdetr_tiny", _norm, False),
    "rtdetr/rtdetrv2_r34vd_120e_coco": ("rtdetr_tiny", _norm_or_head_bias, False),
    "rtdetr/rtdetrv2_r50vd_m_7x_coco": ("rtdetr_tiny", _head_norm, False),
    "rtdetr/rtdetrv2_r50vd_6x_coco": ("rtdetr_tiny", _head_norm, False),
    "rtdetr/rtdetrv2_r101vd_6x_coco": ("rtdetr_tiny", _head_norm, False),
    **{f"dfine/dfine_hgnetv2_{s}_coco": ("dfine_tiny", _head_norm_bias, False) for s in "nsm"},
    **{f"dfine/dfine_hgnetv2_{s}_coco": ("dfine_tiny", _head_norm, False) for s in "lx"},
    "deim/deim_dfine_hgnetv2_n_coco": ("deim_dfine_n", _head_norm_bias, False),
    **{f"deim/deim_dfine_hgnetv2_{s}_coco": ("deim_dfine_n", _norm, True) for s in "sm"},
    **{f"deim/deim_dfine_hgnetv2_{s}_coco": ("deim_dfine_n", _head_norm, False) for s in "lx"},
}


def _placement(task) -> dict[str, tuple[float, float]]:
    """Each trainable parameter's (lr, weight decay) in the task's optimizer."""
    opt = task.configure_optimizers()["optimizer"]
    where = {id(p): (g["lr"], g["weight_decay"]) for g in opt.param_groups for p in g["params"]}
    return {n: where[id(p)] for n, p in task.model.named_parameters() if p.requires_grad}


def _kind(model: nn.Module) -> dict[str, str]:
    """The test's own reading of a parameter's kind: held by a BatchNorm / LayerNorm, a bias, or another weight."""
    out = {}
    for prefix, m in model.named_modules():
        for n, _ in m.named_parameters(recurse=False):
            out[f"{prefix}.{n}"] = ("norm" if isinstance(m, (nn.BatchNorm2d, nn.LayerNorm)) else "bias" if n == "bias" else "weight")
    return out


def test_param_kinds_follow_the_module_not_the_name():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Linear(4, 4), nn.LayerNorm(4), nn.GroupNorm(2, 4))
    assert param_kinds(model) == {"0.weight": "weight", "0.bias": "bias", "1.weight": "norm", "1.bias": "norm",
                                  "2.weight": "weight", "2.bias": "bias", "3.weight": "norm", "3.bias": "norm",
                                  "4.weight": "norm", "4.bias": "norm"}


def test_first_rule_wins_and_keeps_the_lr_group_unless_it_sets_one():
    task = DetectionTask("rtdetr_tiny", num_classes=3, model_kwargs=RTDETR, lr=1e-3, lr_backbone=2e-4, weight_decay=1e-4,
                         param_groups=[{"pattern": r"^backbone\.", "kinds": ["norm"], "weight_decay": 0.0},
                                       {"pattern": r"^decoder\.", "lr": 5e-4}, {"kinds": ["norm", "bias"], "weight_decay": 0.0}])
    kinds, placed = _kind(task.model), _placement(task)
    for name, (lr, wd) in placed.items():
        part = name.split(".")[0]
        if part == "backbone":
            assert (lr, wd) == (2e-4, 0.0 if kinds[name] == "norm" else 1e-4), name
        elif part == "decoder":  # the second rule takes every decoder parameter first, norms included
            assert (lr, wd) == (5e-4, 1e-4), name
        else:
            assert (lr, wd) == (1e-3, 0.0 if kinds[name] in ("norm", "bias") else 1e-4), name
    assert {k for k in kinds.values()} == {"norm", "bias", "weight"}


def test_groups_cover_every_trainable_parameter_once():
    task = DetectionTask("rtdetr_tiny", num_classes=3, model_kwargs=RTDETR, param_groups=[{"kinds": ["norm"], "weight_decay": 0.0}])
    groups = rule_groups(task.model, {"default": 1e-3, "backbone": 1e-4, "offsets": 1e-4}, [ParamGroupRule(kinds=("norm",))],
                         always=("default", "backbone"))
    ids = [id(p) for g in groups for p in g["params"]]
    assert len(ids) == len(set(ids)) == sum(p.requires_grad for p in task.model.parameters())
    assert [g["rule"] for g in groups] == [None, 0, None, 0]  # default, its norms, backbone, its norms


@pytest.mark.parametrize("config", sorted(FACTS))
def test_recipes_exempt_what_the_originals_exempt(config):
    model_name, exempt, backbone_norms_at_base_lr = FACTS[config]
    args = read_config(CONFIGS / f"{config}.yaml")["model"]["init_args"]
    kwargs = DFINE if model_name != "rtdetr_tiny" else RTDETR
    task = DetectionTask(model_name, num_classes=3, model_kwargs=kwargs, lr=args["lr"], lr_backbone=args["lr_backbone"],
                         weight_decay=args["weight_decay"], param_groups=args.get("param_groups"))
    kinds, placed = _kind(task.model), _placement(task)
    counted = {"exempt": 0, "decayed": 0}
    for name, (lr, wd) in placed.items():
        part = name.split(".")[0]
        no_decay = exempt(part, kinds[name])
        counted["exempt" if no_decay else "decayed"] += 1
        assert wd == (0.0 if no_decay else args["weight_decay"]), (name, kinds[name])
        base = part != "backbone" or (backbone_norms_at_base_lr and kinds[name] == "norm")
        assert lr == (args["lr"] if base else args["lr_backbone"]), name
    assert counted["decayed"] and (counted["exempt"] or "r101vd_6x" in config and "v2" not in config)


def test_bad_rules_are_named_in_one_line():
    with pytest.raises(ConfigError, match="param_groups: kinds .*'norms'.* unknown"):
        DetectionTask("rtdetr_tiny", num_classes=3, model_kwargs=RTDETR, param_groups=[{"kinds": ["norms"]}])
    with pytest.raises(ConfigError, match="param_groups: unknown field"):
        DetectionTask("rtdetr_tiny", num_classes=3, model_kwargs=RTDETR, param_groups=[{"regex": "x"}])
    with pytest.raises(ConfigError, match="not a regular expression"):
        DetectionTask("rtdetr_tiny", num_classes=3, model_kwargs=RTDETR, param_groups=[{"pattern": "("}])
    with pytest.raises(ConfigError, match="layer_decay"):
        DetectionTask("rtdetr_tiny", num_classes=3, model_kwargs=RTDETR, param_groups=[{"kinds": ["norm"]}], layer_decay=0.7)


@pytest.mark.parametrize("pattern", ["(.*)*x", "(a+)+$", "(a|ab)+c", r"(\w+\.)*bias", r"(\w)\1", r"^(?=(a*)*b)"])
def test_a_pattern_that_can_backtrack_for_ever_is_refused_before_any_search(pattern, tmp_path):
    """A checkpoint carries its rules: ``(.*)*x`` searched in a 40-character parameter name would stall the run (the
    search time doubles with each character), so such a rule is refused when the task is built, from a config or
    from a checkpoint's hyper-parameters."""
    with pytest.raises(ConfigError, match="exponential time"):
        DetectionTask("rtdetr_tiny", num_classes=3, model_kwargs=RTDETR, param_groups=[{"pattern": pattern}])
    task = DetectionTask("rtdetr_tiny", num_classes=3, model_kwargs=RTDETR, param_groups=[{"pattern": "^encoder"}])
    path = tmp_path / "hostile.ckpt"
    torch.save({"state_dict": task.state_dict(), "pytorch-lightning_version": "2.6.0",
                "hyper_parameters": {**task.hparams, "param_groups": [{"pattern": pattern}]}}, path)
    with pytest.raises(CheckpointError, match=r"hostile\.ckpt: hyper_parameters\.param_groups\[0\].*exponential time"):
        DetectionTask.load_from_checkpoint(path)


def test_patterns_of_the_recipes_and_the_originals_are_taken():
    for pattern in (r"^(encoder|decoder)\.", r"^backbone\.", r"backbone\..*norm", r"^(?=.*backbone)(?=.*norm).*$",
                    r"(?:layers\.\d+\.)?norm", r"(ab){3}", r"(a|b){2}", ""):
        assert ParamGroupRule(pattern=pattern).pattern == pattern


def test_rules_are_kept_as_plain_mappings_in_the_hyperparameters():
    task = DetectionTask("rtdetr_tiny", num_classes=3, model_kwargs=RTDETR,
                         param_groups=[ParamGroupRule(pattern="^encoder", kinds=("bias",), weight_decay=0.0)])
    assert task.hparams.param_groups == [{"pattern": "^encoder", "kinds": ["bias"], "weight_decay": 0.0, "lr": None}]
