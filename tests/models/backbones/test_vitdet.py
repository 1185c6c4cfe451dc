"""ViTDet's simple feature pyramid on plain ViTs (visiontf.models.backbones.vitdet) and layer-wise learning-rate decay."""
from __future__ import annotations

import math

import pytest
import timm
import torch

import visiontf
from visiontf.models.backbones.build import build_backbone
from visiontf.tasks.detection.detection_task import DetectionTask
from visiontf.tasks.optim import layer_decay_groups

OURS = dict(depth=4)  # visiontf's ViT-Ti/16, 4 blocks
DINOV2 = dict(depth=2, embed_dim=64, num_heads=2, img_size=56)  # timm's DINOv2 layout (patch 14), shrunk


def test_pyramid_levels_and_strides():
    bb = build_backbone("simplefpn:vit_tiny_patch16_224", scale_factors=(4, 2, 1, 0.5), top_block=True, **OURS).eval()
    assert bb.strides == [4, 8, 16, 32, 64] and bb.channels == [256] * 5
    with torch.no_grad():
        maps = bb.forward_maps(torch.randn(1, 3, 128, 160))
    assert [tuple(m.shape[1:]) for m in maps] == [(256, 32, 40), (256, 16, 20), (256, 8, 10), (256, 4, 5), (256, 2, 3)]
    # detectron2's layers: the x4 level's two deconvolutions, LayerNorm + GELU between; 1x1 and 3x3 convs without bias
    level = bb.pyramid[0]
    assert [type(m).__name__ for m in level] == ["ConvTranspose2d", "LayerNorm2d", "GELU", "ConvTranspose2d", "Conv2d",
                                                "LayerNorm2d", "Conv2d", "LayerNorm2d"]
    assert level[4].bias is None and level[6].kernel_size == (3, 3) and level[5].eps == 1e-6
    with torch.no_grad():
        torch.testing.assert_close(maps[-1], maps[-2][..., ::2, ::2])  # LastLevelMaxPool: kernel 1, stride 2


def test_dinov2_patch14_strides_are_declared_as_they_are():
    bb = build_backbone("simplefpn:timm:vit_small_patch14_dinov2", **DINOV2).eval()
    assert bb.strides == [7, 14, 28, 56]
    with torch.no_grad():
        maps = bb.forward_maps(torch.randn(1, 3, 100, 150))  # not multiples of 14: padded to 112 x 154
    assert [tuple(m.shape[-2:]) for m in maps] == [(16, 22), (8, 11), (4, 5), (2, 3)]


@pytest.mark.parametrize("spec,kwargs", [("timm:vit_small_patch14_dinov2", DINOV2), ("vit_tiny_patch16_224", OURS)])
def test_without_windows_the_vit_map_equals_timm_features_only(spec, kwargs):
    name = spec.removeprefix("timm:")
    bb = build_backbone(f"simplefpn:{spec}", **kwargs).eval()
    ref = timm.create_model(name, features_only=True, out_indices=(-1,), dynamic_img_size=True, dynamic_img_pad=True,
                            pretrained=False, **kwargs).eval()
    ref.model.load_state_dict(bb.net.state_dict(), strict=False)  # the pruned classifier and norm: absent here
    for size in [(112, 168), (75, 101)]:  # other sizes than the 224/518 tables: resampled per input
        x = torch.randn(1, 3, *size)
        with torch.no_grad():
            torch.testing.assert_close(bb.forward_vit(x), ref(x)[0], rtol=0, atol=1e-5)


@pytest.mark.parametrize("spec,kwargs", [("vit_tiny_patch16_224", OURS), ("timm:vit_small_patch14_dinov2", DINOV2)])
def test_window_attention_equals_attention_within_each_windows_valid_tokens(spec, kwargs):
    """A windowed block = the block run on each window's own tokens alone: padded tokens are masked, not attended."""
    bb = build_backbone(f"simplefpn:{spec}", window_size=3, global_blocks=(1,), **kwargs).eval()
    x = torch.randn(2, 7 * 5, bb.net.embed_dim)  # a 7 x 5 grid: windows of 3 pad it to 9 x 6
    block = bb.net.blocks[0]
    with torch.no_grad():
        got = bb._windowed(block, x, (7, 5)).view(2, 7, 5, -1)
        grid = x.view(2, 7, 5, -1)
        for r in range(0, 7, 3):
            for c in range(0, 5, 3):
                window = grid[:, r:r + 3, c:c + 3]
                alone = bb._block(block, window.reshape(2, -1, window.shape[-1])).view(window.shape)
                torch.testing.assert_close(got[:, r:r + 3, c:c + 3], alone, rtol=0, atol=1e-5)


def test_windows_drop_prefix_tokens_and_global_blocks_see_everything():
    bb = build_backbone("simplefpn:deit_tiny_distilled_patch16_224", window_size=2, global_blocks=(3,), depth=4).eval()
    x = torch.randn(1, 3, 64, 96)
    with torch.no_grad():
        tokens, grid, prefix = bb._tokens(x)
        y = tokens[:, prefix:]
        for i, block in enumerate(bb.net.blocks):
            y = block(y)[0] if i == 3 else bb._windowed(block, y, grid)
        torch.testing.assert_close(bb.forward_vit(x), y.transpose(1, 2).reshape(1, -1, *grid), rtol=0, atol=1e-5)
    assert prefix == 2 and grid == (4, 6)


def test_layer_depths_are_vitdets():
    """detectron2's get_vit_lr_decay_rate: pos_embed / patch_embed 0, blocks.i i + 1, everything else L + 1."""
    model = visiontf.create_model("dino_vit_small_simplefpn", num_classes=3, arch=dict(num_queries=20, enc_layers=1, dec_layers=1),
                                  backbone=dict(kwargs=dict(depth=4, embed_dim=64, num_heads=2, global_blocks=(1, 3))))

    def detectron2_rate(name: str, decay: float, layers: int) -> float:
        layer_id = layers + 1
        if name.startswith("backbone"):
            if ".pos_embed" in name or ".patch_embed" in name:
                layer_id = 0
            elif ".blocks." in name:
                layer_id = int(name[name.find(".blocks."):].split(".")[2]) + 1
        return decay ** (layers + 1 - layer_id)

    for name, _ in model.named_parameters():
        depth = model.layer_depth(name)
        ours = 1.0 if depth is None else 0.7 ** (depth[1] + 1 - depth[0])
        if not name.startswith("backbone.net.cls_token"):  # detectron2's ViT has no class token; timm's counts it as stem
            assert math.isclose(ours, detectron2_rate(name, 0.7, 4)), name
    assert model.param_group("backbone.pyramid.0.0.weight") == "default"
    assert model.param_group("backbone.net.blocks.0.attn.qkv.weight") == "backbone"
    groups = layer_decay_groups(model, {"default": 1e-4, "backbone": 1e-4, "offsets": 1e-5}, 0.7)
    by_scale = {round(g["lr_scale"], 6): len(g["params"]) for g in groups if g["lr"] <= 1e-4 and g["lr_scale"] < 1}
    assert sorted(by_scale) == [round(0.7 ** k, 6) for k in range(5, 0, -1)]
    assert sum(len(g["params"]) for g in groups) == sum(p.requires_grad for p in model.parameters())


def test_detection_task_layer_decay_option():
    kwargs = dict(arch=dict(num_queries=20, enc_layers=1, dec_layers=1), backbone=dict(kwargs=dict(depth=2, embed_dim=64, num_heads=2, global_blocks=(1,))))
    task = DetectionTask("dino_vit_small_simplefpn", num_classes=3, model_kwargs=kwargs, lr=2e-4, lr_backbone=1e-4,
                         layer_decay=0.5)
    task.total_steps = lambda: 10  # no trainer here
    opt = task.configure_optimizers()["optimizer"]
    lrs = sorted({round(g["lr"], 10) for g in opt.param_groups})
    # heads and pyramid 2e-4, offsets 2e-5; the 2-block ViT's stem, block 0, block 1 at 1e-4 x 0.5^3, 0.5^2, 0.5
    assert lrs == sorted([2e-5, 2e-4, 1.25e-5, 2.5e-5, 5e-5])
    with pytest.raises(Exception, match="layer_decay"):
        DetectionTask("dino_tiny", num_classes=3, layer_decay=1.5)


def test_refusals():
    with pytest.raises(ValueError, match=r"global_blocks \(4,\) do not fit a ViT of 4 blocks"):
        build_backbone("simplefpn:vit_tiny_patch16_224", window_size=2, global_blocks=(4,), **OURS)
    with pytest.raises(ValueError, match="not a ViT"):
        build_backbone("simplefpn:detr_tiny")
    with pytest.raises(ValueError, match="not a plain ViT"):
        build_backbone("simplefpn:timm:convnext_atto")
    with pytest.raises(ValueError, match="4, 2, 1, 0.5"):
        build_backbone("simplefpn:vit_tiny_patch16_224", scale_factors=(3, 1), **OURS)
    frozen = build_backbone("simplefpn:vit_tiny_patch16_224", frozen_stages=1, **OURS)
    assert not frozen.net.blocks[1].mlp.fc1.weight.requires_grad and frozen.net.blocks[2].mlp.fc1.weight.requires_grad
    assert not frozen.net.patch_embed.proj.weight.requires_grad and frozen.pyramid[0][0].weight.requires_grad
