"""SETR takes its parts; build_setr makes them from the encoder / decode_head / aux_heads sections read by field name;
the 25 flat keywords of before build the same model with one warning, in code, configs and saved checkpoints."""
import warnings

import lightning as L
import pytest
import torch

import visiontf
from visiontf.models.setr.build import FLAT_SETR_KEYWORDS, SetrHeadOptions, build_setr
from visiontf.models.setr.heads import UpHead, norm_layer
from visiontf.models.setr.setr import SETR

#: the same tiny SETR-PUP spelt flat (before the sections) and nested
FLAT = dict(encoder="vit_tiny_patch16_224", img_size=32, encoder_kwargs={"depth": 4, "embed_dim": 32, "num_heads": 2},
            decoder="pup", in_index=3, num_convs=2, up_scale=2, kernel_size=3, aux_in_index=(0, 2), aux_num_convs=1,
            aux_kernel_size=3, channels=8, aux_weight=0.3, drop_path_rate=0.1)
NESTED = dict(encoder={"name": "vit_tiny_patch16_224", "img_size": 32, "drop_path_rate": 0.1,
                       "kwargs": {"depth": 4, "embed_dim": 32, "num_heads": 2}},
              decode_head={"kind": "pup", "in_index": 3, "num_convs": 2, "up_scale": 2, "kernel_size": 3, "channels": 8},
              aux_heads={"in_index": [0, 2], "num_convs": 1, "kernel_size": 3, "weight": 0.3})


def _future_warnings(fn):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        out = fn()
    return out, [w for w in seen if issubclass(w.category, FutureWarning)]


def _seeded(fn):
    torch.manual_seed(0)
    return fn()


def _same(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb) and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_flat_keywords_build_the_nested_model_with_one_warning():
    nested, quiet = _future_warnings(lambda: _seeded(lambda: build_setr(SETR, num_classes=3, **NESTED)))
    flat, said = _future_warnings(lambda: _seeded(lambda: build_setr(SETR, num_classes=3, **FLAT)))
    assert not quiet and len(said) == 1
    message = str(said[0].message)
    assert "aux_in_index" in message and "decode_head: {kind: 'pup'" in message and "aux_heads: {in_index: (0, 2)" in message
    _same(nested, flat)
    assert nested.aux_in_index == flat.aux_in_index == (0, 2) and nested.aux_weight == flat.aux_weight == 0.3
    typed = _seeded(lambda: build_setr(SETR, num_classes=3, encoder=NESTED["encoder"], aux_heads=NESTED["aux_heads"],
                                       decode_head=SetrHeadOptions(**NESTED["decode_head"])))
    _same(typed, nested)
    # every one of SETR's former keywords but its own (num_classes, encoder, new_classifier, pretrained_cfg) has a field
    assert len(FLAT_SETR_KEYWORDS) == 21


def test_registered_variants_take_sections_and_flat_keywords_alike():
    nested = _seeded(lambda: visiontf.create_model("setr_mla_vit_tiny_patch16", num_classes=4,
                                                   encoder={"img_size": 32, "kwargs": {"depth": 4}},
                                                   decode_head={"mla_channels": 16}))
    flat, said = _future_warnings(lambda: _seeded(lambda: visiontf.create_model(
        "setr_mla_vit_tiny_patch16", num_classes=4, img_size=32, encoder_kwargs={"depth": 4}, mla_channels=16)))
    assert len(said) == 1
    _same(nested, flat)
    # the variant's other fields stay: 64-channel neck, no class token, an auxiliary classifier per MLA output
    assert nested.neck is not None and nested.with_cls_token is False and len(nested.aux_heads) == 4
    assert nested.decode_head.cls_seg.in_channels == 4 * 16 and nested.pretrained_cfg.crop_size == (32, 32)


def test_encoder_kwargs_merge_for_the_same_encoder_and_drop_for_another():
    with torch.device("meta"):
        same = visiontf.create_model("setr_pup_vit_large_patch16", encoder={"kwargs": {"depth": 4}})
        other = visiontf.create_model("setr_pup_vit_large_patch16", encoder={"name": "vit_tiny_patch16_224", "img_size": 64,
                                                                             "out_indices": (2, 5, 8, 11)})
    assert len(same.encoder.blocks) == 4 and same.encoder.patch_embed.proj.bias is None  # the variant's patch_bias=False kept
    assert other.encoder.patch_embed.proj.bias is not None and other.encoder.embed_dim == 192  # not ViT-L's kwargs
    assert other.out_indices == (2, 5, 8, 11) and len(other.aux_heads) == 3


def test_setr_takes_injected_parts():
    encoder = visiontf.create_model("vit_tiny_patch16_224", num_classes=0, img_size=32, depth=2, embed_dim=32, num_heads=2)
    bn = norm_layer("bn")
    head = UpHead(32, 8, 3, 1, 4, 1, bn, False)
    aux = [UpHead(32, 8, 3, 1, 4, 1, bn, False)]
    model = SETR(encoder, head, aux, num_classes=3, out_indices=(0, 1), in_index=1, aux_in_index=(0,)).train()
    out = model(torch.randn(2, 3, 32, 32))
    assert out["out"].shape == (2, 3, 32, 32) and len(out["aux"]) == 1 and model.decode_head is head
    assert model.pretrained_cfg.crop_size == (32, 32) and model.pretrained_cfg.stride == (21, 21)
    with pytest.raises(ValueError, match=r"2 auxiliary heads for aux_in_index=\(0,\)"):
        SETR(encoder, head, aux * 2, num_classes=3, out_indices=(0, 1), aux_in_index=(0,))
    with pytest.raises(ValueError, match="needs out_indices"):
        SETR(encoder, head, num_classes=3)


def test_unknown_keywords_and_fields_are_named():
    with pytest.raises(ValueError, match=r"^encoder: unknown key\(s\) \['depth'\]; the encoder section \(SetrEncoderOptions\)"):
        build_setr(SETR, encoder={"depth": 4})
    with pytest.raises(TypeError, match=r"unknown keyword\(s\) \['decoder_kind'\]"):
        build_setr(SETR, decoder_kind="pup")
    with pytest.raises(ValueError, match="num_classes=0"):
        build_setr(SETR, num_classes=0)


def test_a_checkpoint_saved_with_flat_hyper_parameters_loads_with_one_warning(tmp_path):
    from visiontf.tasks.checkpoints import load_checkpoint_model
    from visiontf.tasks.segmentation.segmentation_task import SegmentationTask

    old = dict(img_size=32, drop_path_rate=0.0, encoder_kwargs={"depth": 4}, channels=16, aux_num_convs=1)
    nested = dict(encoder={"img_size": 32, "kwargs": {"depth": 4}}, decode_head={"channels": 16}, aux_heads={"num_convs": 1})
    torch.manual_seed(0)
    task = SegmentationTask("setr_naive_vit_tiny_patch16", num_classes=3, model_kwargs=nested).eval()
    images = torch.randn(1, 3, 32, 48)
    with torch.no_grad():
        want = task.model(images)
    path = tmp_path / "old.ckpt"
    hp = dict(task.hparams, model_kwargs=old)  # what a checkpoint of before the sections saved
    torch.save({"epoch": 0, "global_step": 0, "pytorch-lightning_version": L.__version__, "state_dict": task.state_dict(),
                "hyper_parameters": hp}, path)
    (model, info), said = _future_warnings(lambda: load_checkpoint_model(path))
    assert len(said) == 1 and "encoder_kwargs" in str(said[0].message) and info["hyper_parameters"]["model_kwargs"] == old
    _same(model, task.model)
    loaded, said = _future_warnings(lambda: SegmentationTask.load_from_checkpoint(path, weights_only=False))
    assert len(said) == 1
    _same(loaded.model, task.model)
    with torch.no_grad():
        assert torch.equal(loaded.eval().model(images), want) and torch.equal(model.eval()(images), want)
    # a checkpoint of now: the sections saved as plain data, loaded without a warning
    torch.save({"epoch": 0, "global_step": 0, "pytorch-lightning_version": L.__version__, "state_dict": task.state_dict(),
                "hyper_parameters": dict(task.hparams)}, path)
    (model, info), said = _future_warnings(lambda: load_checkpoint_model(path))
    assert not said and info["hyper_parameters"]["model_kwargs"]["decode_head"] == {"channels": 16}
    _same(model, task.model)
