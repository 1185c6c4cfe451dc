"""Every registered model keeps the contract of its kind (visiontf.models.contract), and the layers above
read that contract as declared attributes, never through getattr defaults."""
from __future__ import annotations

import re
from importlib import import_module
from pathlib import Path

import pytest
import torch

from visiontf.models import create_model, get_entry, list_models
from visiontf.models.contract import (
    MODEL_KINDS,
    AttentionRollout,
    Classifier,
    Detector,
    Generator,
    ModelCfg,
    PretrainedCfg,
    Restorer,
    Segmenter,
    Tokenizer,
    VisionModel,
)
from visiontf.models.mask_options import MaskOptions
from visiontf.models.postprocess_options import PostprocessOptions
from visiontf.set_prediction.postprocess import POSTPROCESS_BY_CLASS_HEAD
from visiontf.tasks.detection.detection_inference import ATTENTION_PICTURES
from visiontf.tasks.task_table import TASK_TABLE, import_class

#: every family module: where each registered name's function is defined
FAMILIES = sorted({get_entry(name).fn.__module__ for name in list_models()})


def _meta(name: str) -> VisionModel:
    with torch.device("meta"):  # shapes and attributes only: the ViT-L and R101 models cost nothing
        return create_model(name)


def _kinds(name: str) -> tuple[type, ...]:
    task = next(tag for tag in get_entry(name).tags if tag in TASK_TABLE)
    return tuple(import_class(path) for path in TASK_TABLE[task].model_kinds)


def _check_kind(model: VisionModel) -> None:
    """The attributes each kind declares hold values the layers above can use."""
    if isinstance(model, Classifier):
        assert isinstance(model.num_classes, int) and isinstance(model.distilled, bool)
        assert model.num_prefix_tokens == 1 + int(model.distilled)
        assert isinstance(model, AttentionRollout)  # every registered classifier is a ViT
    if isinstance(model, Detector):
        assert model.class_head in POSTPROCESS_BY_CLASS_HEAD
        assert model.attention_picture in ATTENTION_PICTURES
        assert isinstance(model.postprocess_options, PostprocessOptions)
        assert isinstance(model.forward_takes_targets, bool) and model.num_classes >= 1
        assert model.mask_options is None or isinstance(model.mask_options, MaskOptions)
        cfg = model.pretrained_cfg
        assert cfg.min_size and cfg.max_size and cfg.mean and cfg.std
    if isinstance(model, Segmenter):
        assert model.num_classes >= 1 and model.aux_weight >= 0
        assert model.pretrained_cfg.test_mode in ("whole", "slide") and len(model.pretrained_cfg.crop_size) == 2
    if isinstance(model, Restorer):
        assert model.tasks and all(isinstance(t, str) for t in model.tasks) and len(model.scales) == len(model.tasks)
        assert model.tile_size > 0 and model.pretrained_cfg.tasks == model.tasks
    if isinstance(model, Tokenizer):
        assert model.num_codes > 1 and model.downsample_factor > 1
        assert model.pretrained_cfg.num_codes == model.num_codes
    if isinstance(model, Generator):
        assert isinstance(model.first_stage_model, Tokenizer)


@pytest.mark.parametrize("name", list_models())
def test_registered_model_keeps_its_kinds_contract(name):
    model = _meta(name)
    assert isinstance(model, _kinds(name)), f"{name} is a {type(model).__name__}, not one of {_kinds(name)}"
    assert isinstance(model.pretrained_cfg, PretrainedCfg), f"{name}.pretrained_cfg is a {type(model.pretrained_cfg)}"
    assert set(model.pretrained_cfg.to_dict()) <= set(PretrainedCfg.field_names())
    assert model.model_name == name
    params = dict(model.named_parameters())
    # what the registry's loader and the optimiser groups are told names real tensors
    keys = model.state_dict()
    # the class head (some prefixes name optional parts: DeiT's distillation head, DINO's denoising labels)
    assert not model.head_prefixes or any(k.startswith(model.head_prefixes) for k in keys), f"{name}: no head tensor"
    assert model.no_weight_decay() <= set(params)
    assert all(isinstance(model.param_group(n), str) for n in params)
    _check_kind(model)


def test_every_family_declares_default_cfgs_in_one_shape():
    seen: dict[str, str] = {}
    for family in FAMILIES:
        cfgs = import_module(family).DEFAULT_CFGS
        for name, cfg in cfgs.items():
            assert isinstance(cfg, ModelCfg) and isinstance(cfg.pretrained_cfg, PretrainedCfg), (family, name)
            assert name not in seen, f"{name} in both {seen.get(name)} and {family}"
            seen[name] = family
    assert sorted(seen) == list_models()  # every registered name is one entry, and every entry is registered


def test_published_weights_are_named_in_the_pretrained_cfg():
    assert _meta("vit_base_patch16_224").pretrained_cfg.hf_hub_id == "vit_base_patch16_224.augreg_in21k_ft_in1k"
    assert _meta("detr_resnet50").pretrained_cfg.url.endswith("detr-r50-e632da11.pth")
    assert _meta("vq_f8").pretrained_cfg.url.endswith("vq-f8.zip")
    deit = _meta("deit_tiny_patch16_224").pretrained_cfg
    assert (deit.crop_pct, deit.mean) == (0.875, (0.485, 0.456, 0.406)) and deit.input_size == (3, 224, 224)


def test_pretrained_cfg_from_a_config_mapping():
    """A config's model_kwargs.pretrained_cfg (lists, a mapping) lands typed, over the variant's settings."""
    model = create_model("vit_tiny_patch16_224", img_size=32, depth=1, pretrained_cfg={"crop_pct": 0.5, "mean": [0.1, 0.2, 0.3]})
    cfg = model.pretrained_cfg
    assert cfg.crop_pct == 0.5 and cfg.mean == (0.1, 0.2, 0.3) and cfg.input_size == (3, 32, 32)
    assert cfg.hf_hub_id == "vit_tiny_patch16_224.augreg_in21k_ft_in1k"  # the entry's, kept under the override
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['crop_fraction'\].*crop_pct"):
        create_model("vit_tiny_patch16_224", img_size=32, depth=1, pretrained_cfg={"crop_fraction": 0.5})


def test_merged_keeps_unset_fields_and_to_dict_drops_them():
    base = PretrainedCfg(mean=(0.5,), std=(0.5,), min_size=800)
    merged = base.merged({"min_size": 400, "max_size": None})
    assert merged.to_dict() == {"mean": (0.5,), "std": (0.5,), "min_size": 400}


def test_a_task_refuses_a_model_of_another_kind():
    from visiontf.tasks.segmentation.segmentation_task import SegmentationTask

    with pytest.raises(ValueError, match=r"'vit_tiny_patch16_224' is a VisionTransformer, not a Segmenter"):
        SegmentationTask(model_name="vit_tiny_patch16_224", num_classes=3, model_kwargs={"img_size": 32, "depth": 1})


#: the attributes a kind declares; reading them with a default elsewhere would hide a model that lacks them
CONTRACT_NAMES = sorted({name for kind in (VisionModel, *MODEL_KINDS) for name in vars(kind) if not name.startswith("_")}
                        - {"inference"})


def test_every_kind_is_one_a_task_trains():
    named = {import_class(path) for row in TASK_TABLE.values() for path in row.model_kinds}
    assert named == set(MODEL_KINDS), "a kind no task trains, or a task's kind missing from visiontf.models.contract"


def test_upper_layers_read_the_contract_without_getattr_defaults():
    root = Path(__file__).resolve().parents[2] / "visiontf"
    files = [p for sub in ("tasks", "inference", "cli", "set_prediction", "evaluation", "callbacks")
             for p in (root / sub).rglob("*.py")] + [root / "io" / "weights.py"]
    names = "|".join(CONTRACT_NAMES)
    pattern = re.compile(r"(getattr|hasattr)\([^,()]*model[^,()]*, \"(" + names + r")\"")
    found = [f"{p.relative_to(root)}: {m.group(0)}" for p in files for m in pattern.finditer(p.read_text())]
    assert not found, f"read these as declared attributes (visiontf.models.contract): {found}"
