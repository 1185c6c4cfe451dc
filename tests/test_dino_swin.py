"""IDEA-Research/DINO's Swin layout (visiontf.models.backbones.dino_swin) against the reference in the original's layout.

``benchmarks/reference_dino_swin.py`` follows DINO's ``models/dino/swin_transformer.py`` step by step (checked
equal to the original code by ``benchmarks/dino_swin_parity.py``: docs/backbones.md). The full DINO-4scale
Swin model is compared with ``benchmarks/reference_dino.py`` (DINO's own inference code) built on that
reference Swin, from a checkpoint in DINO's layout (``backbone.0.*``).
"""
from __future__ import annotations

import argparse

import pytest
import torch
from deformable_helpers import max_diff, randomize

import benchmarks.reference_dino as reference_dino
from benchmarks.reference_dino import build_dino, dino_args
from benchmarks.reference_dino_layers import Joiner, NestedTensor, PositionEmbeddingSineHW
from benchmarks.reference_dino_swin import ReferenceSwin
from visiontf.models import create_model
from visiontf.models.backbones.build import build_backbone
from visiontf.models.backbones.dino_swin import DINO_SWIN_NAMES, SwinTransformer

TINY = dict(embed_dim=32, depths=(2, 2, 2, 2), num_heads=(1, 2, 4, 8))
SIZES = [(97, 130), (64, 64), (35, 61)]


def _random_reference(window: int, out_indices, seed: int = 0) -> ReferenceSwin:
    ref = ReferenceSwin(window_size=window, out_indices=out_indices, **TINY).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_(0.2 * torch.randn(p.shape, generator=g))
    return ref


@pytest.mark.parametrize("window,out_indices", [(7, (1, 2, 3)), (12, (0, 1, 2, 3))])
def test_swin_equals_the_reference_off_the_window_grid(window, out_indices):
    ref = _random_reference(window, out_indices)
    ours = SwinTransformer(window_size=window, out_indices=out_indices, **TINY).eval()
    ours.load_state_dict(ref.state_dict())
    for h, w in SIZES:
        x = torch.randn(2, 3, h, w)
        with torch.no_grad():
            expected, got = ref(x), ours(x)
        assert [tuple(t.shape) for t in got] == [tuple(t.shape) for t in expected]
        assert max(max_diff(a, b) for a, b in zip(got, expected)) < 1e-4


@pytest.mark.parametrize("name", sorted(DINO_SWIN_NAMES))
def test_full_layouts_equal_the_reference(name):
    embed_dim, depths, heads, window = DINO_SWIN_NAMES[name]
    with torch.device("meta"):
        ours = build_backbone(name, num_levels=3)
        ref = ReferenceSwin(embed_dim, depths, heads, window, out_indices=(1, 2, 3))
    assert {k: v.shape for k, v in ours.body.state_dict().items()} == {k: v.shape for k, v in ref.state_dict().items()}
    assert ours.channels == [2 * embed_dim, 4 * embed_dim, 8 * embed_dim] and ours.strides == [8, 16, 32]


def _reference_dino_with_swin(monkeypatch, Q: int):
    """DINO's inference code (benchmarks/reference_dino.py) with the reference Swin as its backbone, as DINO's
    build_backbone makes it for swin_* names: Joiner(swin, PositionEmbeddingSineHW), channels of stages 1-3."""

    class NestedSwin(ReferenceSwin):
        def forward(self, tensor_list):
            maps = super().forward(tensor_list.tensors)
            masks = [torch.nn.functional.interpolate(tensor_list.mask[None].float(), size=m.shape[-2:]).bool()[0] for m in maps]
            return {i: NestedTensor(m, k) for i, (m, k) in enumerate(zip(maps, masks))}

    def build_backbone(args):
        swin = NestedSwin(window_size=7, out_indices=(1, 2, 3), **TINY)
        joiner = Joiner(swin, PositionEmbeddingSineHW(args.hidden_dim // 2, temperatureH=20, temperatureW=20, normalize=True))
        joiner.num_channels = swin.dims[1:]
        return joiner

    monkeypatch.setattr(reference_dino, "build_backbone", build_backbone)
    ref, _ = build_dino(dino_args(4, num_queries=Q, backbone="swin_T_224_1k"))
    ref.eval()
    randomize(ref, 3)
    return ref


@pytest.mark.slow  # a DINO-4scale encoder and decoder at 96x128 twice
def test_dino_swin_checkpoint_gives_the_original_outputs(tmp_path, monkeypatch):
    Q = 20
    ref = _reference_dino_with_swin(monkeypatch, Q)
    path = tmp_path / "checkpoint0035_4scale_swin.pth"
    torch.save({"model": ref.state_dict(), "epoch": 35, "args": argparse.Namespace(backbone="swin_T_224_1k")}, path)
    assert any(k.startswith("backbone.0.layers.") for k in ref.state_dict())
    model = create_model("dino_swin_large_4scale", pretrained=path, num_queries=Q,
                         backbone_kwargs=dict(window_size=7, **TINY)).eval()
    images = torch.randn(1, 3, 96, 128, generator=torch.Generator().manual_seed(1))
    mask = torch.zeros(1, 96, 128, dtype=torch.bool)
    with torch.no_grad():
        feats = ref.backbone[0](NestedTensor(images, mask))
        ours = model.backbone.forward_maps(images)
        assert max(max_diff(a, feats[i].tensors) for i, a in enumerate(ours)) < 1e-4
        out, ref_out = model(images, mask), ref(NestedTensor(images, mask))
    assert ref_out["pred_boxes"].std() > 0.05
    assert max_diff(out["pred_logits"], ref_out["pred_logits"]) < 1e-4
    assert max_diff(out["pred_boxes"], ref_out["pred_boxes"]) < 1e-4


def test_release_weights_load_and_refusals(tmp_path):
    ref = _random_reference(7, (1, 2, 3))
    release = {k: v for k, v in ref.state_dict().items() if not k.startswith("norm")}
    release.update({"norm.weight": torch.ones(256), "head.weight": torch.zeros(5, 256), "layers.0.blocks.1.attn_mask": torch.zeros(1)})
    path = tmp_path / "swin_tiny_patch4_window7_224.pth"
    torch.save({"model": release}, path)
    bb = build_backbone("swin_T_224_1k", pretrained=path, num_levels=3, window_size=7, **TINY)
    torch.testing.assert_close(bb.body.layers[2].blocks[1].attn.qkv.weight, ref.layers[2].blocks[1].attn.qkv.weight)
    torch.save({"model": {k: v for k, v in release.items() if "layers.3" not in k}}, path)
    with pytest.raises(RuntimeError, match="missing"):
        build_backbone("swin_T_224_1k", pretrained=path, window_size=7, **TINY)
    with pytest.raises(ValueError, match=r"0 \(stride 4\), 1 \(stride 8\)"):
        build_backbone("swin_T_224_1k", out_indices=(2, 4), **TINY)
    with pytest.raises(ValueError, match="dilation"):
        build_backbone("swin_L_384_22k", dilation=True)
    frozen = build_backbone("swin_T_224_1k", frozen_stages=1, **TINY)
    assert not frozen.body.layers[1].blocks[0].attn.qkv.weight.requires_grad and frozen.body.layers[2].blocks[0].attn.qkv.weight.requires_grad
    assert all(p.requires_grad for p in build_backbone("swin_T_224_1k", freeze_stem=False, **TINY).parameters())
