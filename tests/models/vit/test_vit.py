"""ViT/DeiT: timm parity, pos-embed resampling, intermediates, registry and pretrained loading."""
import logging

import pytest
import timm
import torch
from safetensors.torch import save_file

import visiontf
from visiontf.io.weights import WeightsError


@pytest.mark.parametrize("name", ["vit_tiny_patch16_224", "deit_tiny_distilled_patch16_224"])
def test_logits_equal_timm_with_copied_weights(name):
    ref = timm.create_model(name, pretrained=False).eval()
    ours = visiontf.create_model(name).eval()
    assert sorted(ours.state_dict()) == sorted(ref.state_dict())
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        assert (ours(x) - ref(x)).abs().max() < 1e-4
        assert (ours.forward_features(x) - ref.forward_features(x)).abs().max() < 1e-4


def test_distilled_training_returns_both_heads():
    m = visiontf.create_model("deit_tiny_distilled_patch16_224", img_size=32, depth=1).train()
    out = m(torch.randn(2, 3, 32, 32))
    assert isinstance(out, tuple) and out[0].shape == out[1].shape == (2, 1000)


def test_load_at_other_image_size_resamples_pos_embed(tmp_path):
    ref = timm.create_model("vit_tiny_patch16_224", pretrained=False)
    path = tmp_path / "vit.safetensors"
    save_file(ref.state_dict(), str(path))
    big = visiontf.create_model("vit_tiny_patch16_384", pretrained=path).eval()
    assert big.pos_embed.shape == (1, 1 + 24 * 24, 192)
    expected = timm.layers.resample_abs_pos_embed(ref.pos_embed, [24, 24], [14, 14], num_prefix_tokens=1)
    torch.testing.assert_close(big.pos_embed.data, expected)
    torch.testing.assert_close(big.cls_token.data, ref.cls_token.data)
    # timm at 384 with the same resampled table gives the same logits
    ref384 = timm.create_model("vit_tiny_patch16_384", pretrained=False).eval()
    ref384.load_state_dict(big.state_dict())
    x = torch.randn(1, 3, 384, 384)
    with torch.no_grad():
        assert (big(x) - ref384(x)).abs().max() < 1e-4


def test_forward_intermediates_matches_timm():
    ref = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=64).eval()
    ours = visiontf.create_model("vit_tiny_patch16_224", img_size=64).eval()
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        feats = ours.forward_intermediates(x, [2, 5, 11], intermediates_only=True)
        ref_feats = ref.forward_intermediates(x, indices=[2, 5, 11], intermediates_only=True)
    assert [f.shape for f in feats] == [(2, 192, 4, 4)] * 3
    for a, b in zip(feats, ref_feats):
        assert (a - b).abs().max() < 1e-5


def test_finetune_with_other_num_classes_drops_head(tmp_path, caplog):
    src = visiontf.create_model("vit_tiny_patch16_224", img_size=32, depth=2)
    path = tmp_path / "w.pth"
    torch.save({"state_dict": src.state_dict()}, path)
    with caplog.at_level(logging.WARNING):
        m = visiontf.create_model("vit_tiny_patch16_224", img_size=32, depth=2, num_classes=7, pretrained=str(path))
    assert m.head.out_features == 7
    assert "class head not loaded" in caplog.text
    torch.testing.assert_close(m.blocks[1].mlp.fc2.weight, src.blocks[1].mlp.fc2.weight)


def test_save_and_load_model_round_trip(tmp_path):
    m = visiontf.create_model("vit_tiny_patch16_224", img_size=32, depth=2, num_classes=3).eval()
    path = visiontf.save_model(m, tmp_path / "export.safetensors")
    again = visiontf.load_model(path).eval()
    x = torch.randn(1, 3, 32, 32)
    torch.testing.assert_close(again(x), m(x))


def test_malicious_pickle_is_refused(tmp_path):
    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    path = tmp_path / "evil.pth"
    torch.save({"model": {"w": torch.zeros(1)}, "payload": Evil()}, path)
    with pytest.raises(WeightsError, match="weights_only") as e:
        visiontf.create_model("vit_tiny_patch16_224", pretrained=str(path))
    assert "GLOBAL print" in str(e.value)  # what was refused, not torch's advice to load with weights_only=False
    assert "set to `False`" not in str(e.value) and "add_safe_globals" not in str(e.value)


def test_unknown_model_lists_close_matches():
    with pytest.raises(ValueError, match="vit_tiny_patch16_224"):
        visiontf.create_model("vit_tiny_patch16_244")
    assert "vit_base_patch16_224" in visiontf.list_models("vit_base*")


def test_pretrained_true_without_network_names_local_alternative(monkeypatch):
    def offline(*a, **k):
        raise OSError("no network")

    monkeypatch.setattr(timm, "create_model", offline)
    with pytest.raises(RuntimeError, match="pretrained=PATH"):
        visiontf.create_model("vit_tiny_patch16_224", pretrained=True)


def test_checkpoint_with_argparse_namespace_loads(tmp_path):
    """Original DETR training checkpoints store {"model", "args": Namespace, ...}."""
    import argparse

    m = visiontf.create_model("vit_tiny_patch16_224", img_size=32, depth=1)
    path = tmp_path / "ckpt.pth"
    torch.save({"model": m.state_dict(), "args": argparse.Namespace(lr=1e-4, backbone="resnet50"), "epoch": 3}, path)
    again = visiontf.create_model("vit_tiny_patch16_224", img_size=32, depth=1, pretrained=str(path))
    torch.testing.assert_close(again.pos_embed, m.pos_embed)
