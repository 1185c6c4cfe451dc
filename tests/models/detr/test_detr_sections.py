"""build_detr reads its backbone and arch sections by field name; the old flat keywords build the same model with one
warning, and a variant config overrides only what differs."""
import warnings

import pytest
import torch

import visiontf
from visiontf.models.detr.build import build_detr
from visiontf.models.detr.detr import DETR
from visiontf.models.detr.detr_arch_options import DetrArchOptions

FLAT = dict(backbone="resnet18", frozen_bn=False, dilation=False, hidden_dim=32, nheads=2, enc_layers=1, dec_layers=1,
            dim_feedforward=32, num_queries=4, position_embedding="learned")
NESTED = dict(backbone={"name": "resnet18", "frozen_bn": False},
              arch={"hidden_dim": 32, "nheads": 2, "enc_layers": 1, "dec_layers": 1, "dim_feedforward": 32, "num_queries": 4,
                    "position_embedding": "learned"})


def _built(**kwargs):
    torch.manual_seed(0)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        model = build_detr(DETR, num_classes=3, **kwargs)
    return model, [w for w in seen if issubclass(w.category, FutureWarning)]


def test_flat_keywords_build_the_nested_model_with_one_warning():
    nested, quiet = _built(**NESTED)
    flat, said = _built(**FLAT)
    assert not quiet and len(said) == 1 and "arch: {hidden_dim: 32" in str(said[0].message)
    a, b = nested.state_dict(), flat.state_dict()
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)
    typed, _ = _built(backbone={"name": "resnet18", "frozen_bn": False}, arch=DetrArchOptions(**NESTED["arch"]))
    assert all(torch.equal(typed.state_dict()[k], a[k]) for k in a)


def test_a_variant_overrides_only_what_differs_and_impossible_values_are_named():
    with torch.device("meta"):
        dc5 = visiontf.create_model("detr_resnet50_dc5", arch={"num_queries": 7})
    assert dc5.num_queries == 7 and dc5.backbone.strides == [16] and dc5.hidden_dim == 256
    with pytest.raises(ValueError, match="hidden_dim must be even for the 2D position embedding, got 33"):
        build_detr(DETR, arch={"hidden_dim": 33})
    with pytest.raises(ValueError, match=r"^arch: unknown key\(s\) \['queries'\]; the arch section \(DetrArchOptions\)"):
        build_detr(DETR, arch={"queries": 3})
