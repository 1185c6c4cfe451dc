"""SETR checkpoints and exports written by visiontf before SETR was rebuilt as mmsegmentation's still load:
with the former outputs where today's SETR has the former structure, refused with what differs and how to
go on where it has not. The former model is the former code (``tests/setr_legacy_model.py``)."""
from __future__ import annotations

import copy

import pytest
import torch
from setr_legacy_model import old_setr

from visiontf.checkpoints import load_checkpoint_model
from visiontf.registry import WeightsLayoutError, create_model, load_model
from visiontf.weights import save_model

NARROW = {"embed_dim": 64, "num_heads": 2}  # a narrow ViT: the tests build a dozen models
SMALL = dict(num_classes=5, img_size=64, encoder_kwargs={"depth": 4, **NARROW})


def _trained_looking(model: torch.nn.Module) -> torch.nn.Module:
    """Random BatchNorm statistics, conv biases and norms, so that folding and renaming are exercised."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, b in model.named_buffers():
            if name.endswith("running_mean"):
                b.copy_(torch.randn(b.shape, generator=g) * 0.5)
            elif name.endswith("running_var"):
                b.copy_(torch.rand(b.shape, generator=g) + 0.5)
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith(".0.bias") or name.endswith(".1.weight"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.5 + (1.0 if name.endswith("weight") else 0.0))
    return model.eval()


def _old(decoder: str, **kwargs) -> torch.nn.Module:
    torch.manual_seed(0)
    kw = {**SMALL, **kwargs}
    return _trained_looking(old_setr(decoder, drop_path_rate=0.0, **kw))


def _same_outputs(new: torch.nn.Module, old: torch.nn.Module, size: int = 64) -> None:
    x = torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(1))
    new.eval(), old.eval()
    with torch.no_grad():
        assert torch.allclose(new(x), old(x), atol=1e-5), (new(x) - old(x)).abs().max()
        # auxiliary heads too, in training mode (batch statistics: the folded conv bias cancels there), on
        # copies, since training-mode BatchNorm moves the running statistics
        a, b = copy.deepcopy(new).train()(x), copy.deepcopy(old).train()(x)
    assert torch.allclose(a["out"], b["out"], atol=1e-5) and len(a["aux"]) == len(b["aux"])
    for p, q in zip(a["aux"], b["aux"]):
        assert torch.allclose(p, q, atol=1e-5)


@pytest.mark.parametrize("decoder,extra,fits", [
    ("naive", {}, {"up_scale": 1, "aux_num_convs": 1, "aux_up_scale": 1}),
    ("pup", {}, {"aux_num_convs": 1}),
    # configs/setr/setr_tiny_synthetic.yaml's model: 8-px patches, so the former PUP had 3 convs
    ("pup", {"encoder_kwargs": {"depth": 4, "patch_size": 8, **NARROW}}, {"num_convs": 3, "aux_num_convs": 1}),
])
def test_former_checkpoint_is_refused_then_loads_exactly_with_the_named_arguments(tmp_path, decoder, extra, fits):
    old = _old(decoder, **extra)
    path = tmp_path / "old.pth"
    torch.save(old.state_dict(), path)
    name = f"setr_{decoder}_vit_tiny_patch16"
    kw = {**SMALL, **extra}
    with pytest.raises(WeightsLayoutError, match="before the mmseg layout.*auxiliary heads.*strict=False") as e:
        create_model(name, pretrained=path, **kw)
    assert e.value.fits_kwargs == fits
    assert ", ".join(f"{k}={v!r}" for k, v in fits.items()) in str(e.value)
    _same_outputs(create_model(name, pretrained=path, **kw, **fits), old)


def test_former_vit_large_pup_gets_its_fourth_auxiliary_head_and_folds_its_patch_bias(tmp_path):
    """ViT-L's layout in miniature (24 narrow blocks): the former PUP had 4 one-conv auxiliary heads on
    blocks 10/15/20/24 (mmseg: 3 two-conv heads on 10/15/20), and a patch-embedding bias, which mmseg's
    ViT-L has not: folded into pos_embed."""
    deep = {"encoder_kwargs": {"depth": 24, **NARROW}, "channels": 32}
    old = _old("pup", **deep)
    path = tmp_path / "old.pth"
    torch.save(old.state_dict(), path)
    kw = {**SMALL, **deep, "encoder": "vit_tiny_patch16_224"}
    name = "setr_pup_vit_large_patch16"
    with pytest.raises(WeightsLayoutError, match="former 4 were 1 x \\(3x3 conv, x4\\) on blocks 10/15/20/24") as e:
        create_model(name, pretrained=path, **kw)
    fits = {"aux_in_index": (0, 1, 2, 3), "aux_num_convs": 1}
    assert e.value.fits_kwargs == fits
    new = create_model(name, pretrained=path, **kw, **fits)
    assert new.encoder.patch_embed.proj.bias is None and old.encoder.patch_embed.proj.bias is not None
    _same_outputs(new, old)


def test_task_checkpoint_and_export_of_the_former_version_load_with_its_outputs(tmp_path):
    """visiontf.checkpoints and visiontf.load_model rebuild the structure the weights describe."""
    old = _old("naive")
    model_kwargs = {"img_size": 64, "encoder_kwargs": {"depth": 4, **NARROW}}
    ckpt = tmp_path / "old.ckpt"
    torch.save({"state_dict": {f"model.{k}": v for k, v in old.state_dict().items()},
                "hyper_parameters": {"model_name": "setr_naive_vit_tiny_patch16", "num_classes": 5,
                                     "model_kwargs": model_kwargs}}, ckpt)
    model, _ = load_checkpoint_model(ckpt)
    assert model.model_kwargs["up_scale"] == 1 and model.model_kwargs["aux_num_convs"] == 1
    _same_outputs(model, old)

    export = save_model(old, tmp_path / "old.safetensors", model_name="setr_naive_vit_tiny_patch16", num_classes=5,
                        **model_kwargs)
    _same_outputs(load_model(export), old)
    # re-saved, it records the arguments and loads as it is
    resaved = save_model(model, tmp_path / "new.safetensors")
    _same_outputs(load_model(resaved), old)


def test_strict_false_loads_what_fits(tmp_path):
    old = _old("pup")
    path = tmp_path / "old.pth"
    torch.save(old.state_dict(), path)
    new = create_model("setr_pup_vit_tiny_patch16", pretrained=path, strict=False, **SMALL).eval()
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():  # only the auxiliary heads differ: the eval logits are the former ones
        assert torch.allclose(new(x), old(x), atol=1e-5)
    ckpt = tmp_path / "old.ckpt"
    torch.save({"state_dict": {f"model.{k}": v for k, v in old.state_dict().items()},
                "hyper_parameters": {"model_name": "setr_pup_vit_tiny_patch16", "num_classes": 5,
                                     "model_kwargs": {"img_size": 64, "encoder_kwargs": {"depth": 4, **NARROW}}}}, ckpt)
    model, _ = load_checkpoint_model(ckpt, strict=False, aux_num_convs=2)  # the registered aux heads, kept
    assert len(model.aux_heads[0].up_convs) == 2
    with torch.no_grad():
        assert torch.allclose(model.eval()(x), old(x), atol=1e-5)


def test_former_mla_has_no_equivalent_decode_head(tmp_path):
    old = _old("mla")
    path = tmp_path / "old.pth"
    torch.save(old.state_dict(), path)
    with pytest.raises(WeightsLayoutError, match="3x3 classifier.*no equivalent.*strict=False with with_cls_token=True") as e:
        create_model("setr_mla_vit_tiny_patch16", pretrained=path, **SMALL)
    assert e.value.fits_kwargs is None
    ckpt = tmp_path / "old.ckpt"
    torch.save({"state_dict": {f"model.{k}": v for k, v in old.state_dict().items()},
                "hyper_parameters": {"model_name": "setr_mla_vit_tiny_patch16", "num_classes": 5,
                                     "model_kwargs": {"img_size": 64, "encoder_kwargs": {"depth": 4, **NARROW}}}}, ckpt)
    with pytest.raises(WeightsLayoutError, match="no exact equivalent"):
        load_checkpoint_model(ckpt)

    new = create_model("setr_mla_vit_tiny_patch16", pretrained=path, strict=False, with_cls_token=True, **SMALL)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        a, b = new.train()(x), old.train()(x)
    # encoder, neck and auxiliary classifiers are the former ones (levels now run deepest first) ...
    n = len(b["aux"])
    for j in range(n):
        assert torch.allclose(a["aux"][j], b["aux"][n - 1 - j], atol=1e-5)
    # ... the decode head's classifier is not (3x3 then; mmseg's is 1x1): it starts at init
    assert new.decode_head.cls_seg.weight.shape[-1] == 1 and not torch.allclose(a["out"], b["out"], atol=1e-3)


def test_other_decoder_and_class_count_are_named(tmp_path):
    old = _old("naive")
    path = tmp_path / "old.pth"
    torch.save(old.state_dict(), path)
    with pytest.raises(WeightsLayoutError, match="SETR-naive, the model SETR-pup.*setr_naive_"):
        create_model("setr_pup_vit_tiny_patch16", pretrained=path, **SMALL)
    with pytest.raises(WeightsLayoutError, match="5 classes but .* has 7: pass num_classes=5, or new_classifier=True"):
        create_model("setr_naive_vit_tiny_patch16", pretrained=path, **{**SMALL, "num_classes": 7})
