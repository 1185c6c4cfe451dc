"""build_deformable_detr reads typed sections by field name; old flat keywords and checkpoints migrate with one warning."""
import dataclasses
import warnings

import lightning as L
import pytest
import torch

import visiontf
from visiontf.models.backbones.spec import FLAT_BACKBONE_KEYWORDS, BackboneSpec
from visiontf.models.deformable_detr.arch_options import DeformableArchOptions
from visiontf.models.deformable_detr.build import SECTIONS, build_deformable_detr, nest_flat_keywords
from visiontf.models.deformable_detr.deformable_detr import DeformableDETR
from visiontf.models.deformable_detr.dino_options import DinoOptions
from visiontf.models.postprocess_options import PostprocessOptions

#: a dino_tiny-like model, spelt the old flat way (as configs and checkpoints before the sections)
FLAT = dict(backbone="resnet18", frozen_bn=False, backbone_stages=(2, 3, 4), num_feature_levels=3, hidden_dim=32, nheads=2,
            enc_layers=1, dec_layers=2, dim_feedforward=32, num_queries=6, with_box_refine=True, two_stage=True,
            mixed_query_selection=True, num_denoising=4, num_select=5, nms_iou_threshold=0.7)
NESTED = dict(backbone={"name": "resnet18", "frozen_bn": False, "stages": [2, 3, 4]},
              arch={"num_feature_levels": 3, "hidden_dim": 32, "nheads": 2, "enc_layers": 1, "dec_layers": 2,
                    "dim_feedforward": 32, "num_queries": 6, "with_box_refine": True, "two_stage": True},
              dino={"mixed_query_selection": True, "num_denoising": 4}, postprocess={"num_top": 5, "nms_iou_threshold": 0.7})


def _future_warnings(fn):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        out = fn()
    return out, [w for w in seen if issubclass(w.category, FutureWarning)]


def _same(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb) and all(torch.equal(sa[k], sb[k]) for k in sa)
    assert (a.arch_options, a.dino_options, a.postprocess_options) == (b.arch_options, b.dino_options, b.postprocess_options)


def test_flat_keywords_build_the_nested_model_with_one_warning_naming_the_sections():
    torch.manual_seed(0)
    nested, quiet = _future_warnings(lambda: build_deformable_detr(DeformableDETR, num_classes=3, **NESTED))
    torch.manual_seed(0)
    flat, said = _future_warnings(lambda: build_deformable_detr(DeformableDETR, num_classes=3, **FLAT))
    assert not quiet and len(said) == 1
    message = str(said[0].message)
    assert "backbone_stages" in message and "num_select" in message and "postprocess: {num_top: 5" in message
    _same(nested, flat)
    assert nested.postprocess_options == PostprocessOptions(num_top=5, nms_iou_threshold=0.7)


def test_every_field_is_read_by_its_name_never_by_position():
    """Each flat keyword lands in the field of its name, whatever the dataclass's field order."""
    for section in ("arch", "dino", "postprocess"):
        for f in dataclasses.fields(SECTIONS[section]):
            flat = "num_select" if (section, f.name) == ("postprocess", "num_top") else f.name
            nested, rest = nest_flat_keywords({flat: "marker"})
            assert nested == {section: {f.name: "marker"}} and not rest, (section, f.name)
    for flat, name in FLAT_BACKBONE_KEYWORDS.items():
        assert nest_flat_keywords({flat: "marker"})[0] == {"backbone": {name: "marker"}}
    assert nest_flat_keywords({"thing_classes": [1]}) == ({}, {"thing_classes": [1]})


def test_sections_as_dataclasses_equal_their_mappings_and_unknown_keys_are_named():
    torch.manual_seed(0)
    typed = build_deformable_detr(
        DeformableDETR, num_classes=3, backbone=BackboneSpec("resnet18", frozen_bn=False, stages=(2, 3, 4)),
        arch=DeformableArchOptions(**NESTED["arch"]), dino=DinoOptions(**NESTED["dino"]),
        postprocess=PostprocessOptions(**NESTED["postprocess"]))
    torch.manual_seed(0)
    _same(typed, build_deformable_detr(DeformableDETR, num_classes=3, **NESTED))
    with pytest.raises(ValueError, match=r"^arch: unknown key\(s\) \['hiden_dim'\]; the arch section \(DeformableArchOptions\)"):
        build_deformable_detr(DeformableDETR, arch={"hiden_dim": 32})
    with pytest.raises(ValueError, match=r"^backbone: unknown key\(s\) \['pretrain'\]; a backbone section takes name, "):
        build_deformable_detr(DeformableDETR, backbone={"pretrain": True})


def test_a_variant_config_overrides_only_what_differs():
    model, said = _future_warnings(lambda: visiontf.create_model("dino_tiny", num_classes=3, arch={"num_queries": 7},
                                                             postprocess={"num_top": 7}, backbone={"frozen_bn": True}))
    assert not said
    base = visiontf.create_model("dino_tiny", num_classes=3)
    assert model.arch_options == dataclasses.replace(base.arch_options, num_queries=7)
    assert model.dino_options == base.dino_options and model.postprocess_options.num_top == 7
    assert model.backbone.name == base.backbone.name == "timm:regnetx_002"
    with torch.device("meta"):
        vit = visiontf.create_model("dino_vit_small_simplefpn", backbone={"kwargs": {"window_size": 7}})
        swapped = visiontf.create_model("dino_vit_small_simplefpn", backbone="timm:convnext_atto")
    assert (vit.backbone.window_size, vit.backbone.global_blocks) == (7, (2, 5, 8, 11))  # the variant's other kwargs kept
    assert swapped.backbone.name == "timm:convnext_atto"  # the pyramid's keywords left with its backbone


def test_a_checkpoint_saved_with_flat_hyper_parameters_loads_with_one_warning(tmp_path):
    from visiontf.tasks.checkpoints import load_checkpoint_model
    from visiontf.tasks.detection.detection_task import DetectionTask

    old = dict(frozen_bn=False, hidden_dim=32, nheads=2, enc_layers=1, dec_layers=2, dim_feedforward=32, num_queries=6,
               num_denoising=4, num_select=5)
    nested = dict(backbone={"frozen_bn": False}, arch=dict(hidden_dim=32, nheads=2, enc_layers=1, dec_layers=2,
                                                           dim_feedforward=32, num_queries=6),
                  dino={"num_denoising": 4}, postprocess={"num_top": 5})
    torch.manual_seed(0)
    task = DetectionTask(model_name="dino_tiny", num_classes=3, model_kwargs=nested)
    hp = dict(task.hparams, model_kwargs=old)  # what a checkpoint of before the sections saved
    path = tmp_path / "old.ckpt"
    torch.save({"epoch": 0, "global_step": 0, "pytorch-lightning_version": L.__version__, "state_dict": task.state_dict(),
                "hyper_parameters": hp}, path)
    (model, info), said = _future_warnings(lambda: load_checkpoint_model(path))
    assert len(said) == 1 and "num_select" in str(said[0].message) and info["hyper_parameters"]["model_kwargs"] == old
    _same(model, task.model)
    loaded, said = _future_warnings(lambda: DetectionTask.load_from_checkpoint(path, weights_only=False))
    assert len(said) == 1
    _same(loaded.model, task.model)
    # a checkpoint of now: the sections saved as plain data, loaded without a warning
    torch.save({"epoch": 0, "global_step": 0, "pytorch-lightning_version": L.__version__, "state_dict": task.state_dict(),
                "hyper_parameters": dict(task.hparams)}, path)
    (model, info), said = _future_warnings(lambda: load_checkpoint_model(path))
    assert not said and info["hyper_parameters"]["model_kwargs"]["arch"]["hidden_dim"] == 32
    _same(model, task.model)
