"""Deformable DETR's architecture as one checked object (visiontf/models/deformable_detr/arch_options.py):
built from the model's flat keyword arguments, kept as ``model.arch_options``, refusing values that
cannot build a working model with a message naming the argument.

Cost: the dataclass alone, and models on the meta device (no weights allocated); well under a second.
"""
from __future__ import annotations

import dataclasses
import inspect
import re

import pytest
import torch

from visiontf.models import create_model
from visiontf.models.deformable_detr.arch_options import DeformableArchOptions
from visiontf.models.deformable_detr.build import build_deformable_detr
from visiontf.models.deformable_detr.deformable_detr import DeformableDETR


def test_the_builder_takes_the_options_as_one_section_and_old_flat_keywords_by_name():
    """Configs' model_kwargs hold an ``arch`` section; old flat keywords (checkpoints' hyper-parameters) map by field name."""
    from visiontf.models.deformable_detr.build import SECTION_DEFAULTS, flat_keywords

    params = inspect.signature(build_deformable_detr).parameters
    assert "arch" in params and SECTION_DEFAULTS["arch"] == DeformableArchOptions()
    for field in dataclasses.fields(DeformableArchOptions):
        assert flat_keywords()[field.name] == ("arch", field.name)


def test_the_registered_variants_keep_their_architecture_in_one_frozen_object():
    with torch.device("meta"):
        tiny = create_model("deformable_detr_tiny", num_classes=3)
        dino = create_model("dino_resnet50_4scale")
    assert tiny.arch_options == DeformableArchOptions(
        hidden_dim=128, nheads=4, enc_layers=2, dec_layers=3, dim_feedforward=512, dropout=0.0, num_queries=100,
        num_feature_levels=3, enc_n_points=2, dec_n_points=4, with_box_refine=True)
    arch = dino.arch_options
    assert (arch.num_queries, arch.dim_feedforward, arch.pos_temperature, arch.decoder_norm, arch.two_stage) == (900, 2048, 20.0, True, True)
    # DINO's code, not Deformable DETR's, at inference (visiontf.models.deformable_detr.dino.ORIGINAL_CODE)
    assert (arch.pos_offset, arch.inverse_sigmoid_eps, arch.select_padded_proposals) == (0.0, 1e-3, True)
    assert dino.transformer.decoder.inverse_sigmoid_eps == 1e-3 and isinstance(dino.decoder_norm, torch.nn.LayerNorm)
    with pytest.raises(dataclasses.FrozenInstanceError):
        tiny.arch_options.num_queries = 5  # a copy elsewhere would silently disagree: replace the whole object


@pytest.mark.parametrize("kwargs, error, message", [
    ({"hidden_dim": 100}, ValueError, "hidden_dim must be a multiple of 32 (GroupNorm(32)) and of nheads=8, got 100"),
    ({"hidden_dim": 64, "nheads": 3}, ValueError, "hidden_dim must be a multiple of 32 (GroupNorm(32)) and of nheads=3, got 64"),
    ({"nheads": 0}, ValueError, "nheads must be >= 1, got 0"),
    ({"dec_layers": 0}, ValueError, "dec_layers must be >= 1, got 0"),
    ({"num_feature_levels": 0}, ValueError, "num_feature_levels must be >= 1, got 0"),
    ({"dropout": 1.0}, ValueError, "dropout must be in [0, 1), got 1.0"),
    ({"inverse_sigmoid_eps": 0.0}, ValueError, "inverse_sigmoid_eps must be in (0, 0.5)"),
    ({"pos_temperature": 0}, ValueError, "pos_temperature must be > 0"),
    ({"two_stage": True}, ValueError, "two_stage=True needs with_box_refine=True"),
    ({"decoder_norm": True}, ValueError, "decoder_norm=True (DINO) predicts refined boxes from normalised outputs: it needs with_box_refine=True"),
    ({"num_queries": 2.5}, TypeError, "num_queries must be an int, got 2.5"),
    ({"with_box_refine": "yes"}, TypeError, "with_box_refine must be a bool, got 'yes'"),
])
def test_impossible_architectures_are_refused_naming_the_argument(kwargs, error, message):
    with pytest.raises(error) as raised:
        DeformableArchOptions(**kwargs)
    assert str(raised.value).startswith(message), str(raised.value)
    # the model refuses them before it builds anything: a value of another type as the section reads it (the
    # section and field named: arch.num_queries), the others as the options do
    if error is TypeError:
        (key, value), = kwargs.items()
        error, message = ValueError, f"arch.{key}: {value!r} is not"
    with pytest.raises(error, match=re.escape(message)):
        build_deformable_detr(DeformableDETR, arch=kwargs)


def test_encoder_free_and_integral_floats_are_allowed():
    assert DeformableArchOptions(enc_layers=0, dropout=0, pos_temperature=20).enc_layers == 0
