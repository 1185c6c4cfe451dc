"""SETR: decoder shapes and gradients, taps, sliding-window inference, encoder initialisation from ViT checkpoints."""
import pytest
import torch
from safetensors.torch import save_file

from visiontf.io.weights import save_model
from visiontf.models import create_model
from visiontf.models.setr.convert import resize_pos_embed
from visiontf.models.setr.setr import SETR, default_out_indices

NUM_AUX = {"naive": 3, "pup": 4, "mla": 4}  # tiny/base: PUP keeps an auxiliary head on every tap


def _tiny(decoder: str, num_classes: int = 3, encoder: dict | None = None, **sections) -> SETR:
    encoder = {"img_size": 64, "drop_path_rate": 0.0, **(encoder or {})}
    return create_model(f"setr_{decoder}_vit_tiny_patch16", num_classes=num_classes, encoder=encoder, **sections)


@pytest.mark.parametrize("decoder", ["naive", "pup", "mla"])
def test_shapes_and_gradients(decoder):
    model = _tiny(decoder).train()
    x = torch.randn(2, 3, 64, 64)
    out = model(x)
    assert out["out"].shape == (2, 3, 64, 64)
    assert len(out["aux"]) == NUM_AUX[decoder]
    assert all(a.shape == (2, 3, 64, 64) for a in out["aux"])
    (out["out"].square().mean() + sum(a.square().mean() for a in out["aux"])).backward()
    assert model.encoder.patch_embed.proj.weight.grad.abs().sum() > 0
    assert model.encoder.blocks[0].attn.qkv.weight.grad.abs().sum() > 0
    assert model.decode_head.cls_seg.weight.grad.abs().sum() > 0
    for head in model.aux_heads:
        assert head.cls_seg.weight.grad.abs().sum() > 0
    model.eval()
    with torch.no_grad():
        # another size than the crop, not a multiple of the patch: padded to 112x80 inside, resized back
        y = model(torch.randn(1, 3, 100, 70))
    assert isinstance(y, torch.Tensor) and y.shape == (1, 3, 100, 70)


def test_default_taps_follow_mmseg():
    assert default_out_indices(24, "naive") == default_out_indices(24, "pup") == (9, 14, 19, 23)
    assert default_out_indices(24, "mla") == (5, 11, 17, 23)
    assert default_out_indices(12, "mla") == default_out_indices(12, "naive") == (2, 5, 8, 11)
    assert default_out_indices(4, "pup") == (0, 1, 2, 3)
    model = _tiny("pup")
    assert model.out_indices == (2, 5, 8, 11) and model.in_index == 3 and model.aux_in_index == (0, 1, 2, 3)
    assert _tiny("naive").aux_in_index == (0, 1, 2)
    assert _tiny("mla").with_cls_token is False and _tiny("naive").with_cls_token is True
    with pytest.raises(ValueError, match="out_indices"):
        _tiny("naive", encoder={"kwargs": {"depth": 6}})


def test_mla_drops_the_class_token_before_the_encoder():
    model = _tiny("mla").eval()
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        before = model.features(x)[0]
        model.encoder.cls_token.add_(5.0)  # with_cls_token=False: the class token never reaches attention
        assert torch.equal(model.features(x)[0], before)
        naive = _tiny("naive").eval()
        before = naive.features(x)[3]
        naive.encoder.cls_token.add_(5.0)
        assert not torch.allclose(naive.features(x)[3], before)


@pytest.mark.parametrize("decoder", ["naive", "mla"])
def test_slide_equals_whole_for_one_window(decoder):
    model = _tiny(decoder).eval()
    with torch.no_grad():
        for shape in [(2, 3, 64, 64), (1, 3, 50, 37)]:  # a window of the crop; a smaller image: one window of its size
            x = torch.randn(shape)
            whole = model.inference(x, "whole")
            slide = model.inference(x, "slide", crop=64, stride=43)
            assert slide.shape == whole.shape == (shape[0], 3, *shape[2:])
            assert torch.allclose(slide, whole, atol=1e-6)


def test_slide_windows_average_overlaps():
    # a stand-in decoder whose logits are the window's number reveals mmseg's window grid and averaging
    model = _tiny("naive").eval()
    seen = []

    def fake_whole(window):
        seen.append(tuple(window.shape[-2:]))
        return torch.ones(window.shape[0], 3, *window.shape[-2:]) * len(seen)

    model.whole_inference = fake_whole
    out = model.slide_inference(torch.zeros(1, 3, 64, 96), crop=64, stride=48)
    # mmseg grid: ceil((96 - 64) / 48) + 1 = 2 columns: x in [0, 64) and [32, 96)
    assert seen == [(64, 64), (64, 64)]
    assert torch.all(out[..., :32] == 1) and torch.all(out[..., 64:] == 2) and torch.all(out[..., 32:64] == 1.5)
    small = model.slide_inference(torch.zeros(1, 3, 40, 50), crop=64, stride=48)
    assert small.shape == (1, 3, 40, 50) and seen[-1] == (40, 50)  # no padding: one window of the image's size


def _check_encoder_loaded(model: SETR, source: dict, src_grid: tuple[int, int]) -> None:
    own = model.encoder.state_dict()
    for key in ("patch_embed.proj.weight", "blocks.0.attn.qkv.weight", "blocks.11.mlp.fc2.bias", "cls_token"):
        assert torch.equal(own[key], source[key]), key
    # resized as mmseg's init_weights does: bilinear, class-token row kept
    expected = resize_pos_embed(source["pos_embed"], src_grid, model.encoder.grid_size, "bilinear")
    assert own["pos_embed"].shape == (1, 1 + 16, 192)
    assert torch.allclose(own["pos_embed"], expected, atol=1e-6)


def test_encoder_from_visiontf_vit_checkpoint(tmp_path):
    vit = create_model("vit_tiny_patch16_224", num_classes=10)
    path = save_model(vit, tmp_path / "vit_tiny.safetensors")
    model = _tiny("naive", encoder={"pretrained": str(path)})
    _check_encoder_loaded(model, vit.state_dict(), (14, 14))


def test_encoder_from_timm_checkpoint(tmp_path):
    timm = pytest.importorskip("timm")
    ref = timm.create_model("vit_tiny_patch16_224", pretrained=False)
    state = {k: v.contiguous() for k, v in ref.state_dict().items()}
    path = tmp_path / "timm_vit_tiny.safetensors"
    save_file(state, str(path))
    model = _tiny("mla", encoder={"pretrained": str(path)})
    _check_encoder_loaded(model, state, (14, 14))
    # the registry path: create_model("setr_*", pretrained=<bare ViT file>) maps it onto the encoder
    via_registry = create_model("setr_mla_vit_tiny_patch16", num_classes=3, encoder={"img_size": 64}, pretrained=str(path))
    _check_encoder_loaded(via_registry, state, (14, 14))
    # same tokens as timm itself at timm's own size
    at224 = create_model("setr_naive_vit_tiny_patch16", num_classes=3, encoder={"img_size": 224, "pretrained": str(path)}).eval()
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        ours = at224.features(x, [1])[1]  # tap 1 = block 6
        theirs = ref.eval().forward_intermediates(x, indices=[5], norm=False, intermediates_only=True)[0]
    assert torch.allclose(ours, theirs, atol=1e-4)


def test_timm_patch_bias_is_folded_into_pos_embed(tmp_path):
    # ViT-L's mmseg encoder has no patch bias; timm's weights have one: the same tokens either way
    timm = pytest.importorskip("timm")
    ref = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=64).eval()
    with torch.no_grad():
        ref.patch_embed.proj.bias.normal_(0, 1.0)
    path = tmp_path / "timm_vit_tiny.safetensors"
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, str(path))
    model = _tiny("naive", encoder={"pretrained": str(path), "kwargs": {"patch_bias": False}}).eval()
    assert model.encoder.patch_embed.proj.bias is None
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        theirs = ref.forward_intermediates(x, indices=[11], norm=False, intermediates_only=True)[0]
        assert torch.allclose(model.features(x, [3])[3], theirs, atol=1e-4)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match=r"decode_head.kind: 'fpn' is not one of 'naive', 'pup', 'mla'"):
        _tiny("naive", decode_head={"kind": "fpn"})
    with pytest.raises(ValueError, match="norm"):
        _tiny("naive", decode_head={"norm": "gn"})
    with pytest.raises(ValueError, match="kernel_size"):
        _tiny("pup", decode_head={"kernel_size": 5})
    with pytest.raises(ValueError, match="MLA"):
        _tiny("mla", encoder={"out_indices": (11,)})
    with pytest.raises(ValueError, match=r"decode_head: unknown key\(s\) \['kernel'\]"):
        _tiny("pup", decode_head={"kernel": 5})
    with pytest.raises(ValueError, match="inference mode"):
        _tiny("naive").inference(torch.zeros(1, 3, 64, 64), "tiles")


def test_syncbn_option_builds_sync_batchnorm():
    model = _tiny("pup", decode_head={"norm": "syncbn"})
    assert any(isinstance(m, torch.nn.SyncBatchNorm) for m in model.decode_head.modules())
    assert model.pretrained_cfg.crop_size == (64, 64)
