"""Loading original facebookresearch/detr and HuggingFace DETR weights gives their exact outputs.

The original repository cannot be imported here, so ``_OriginalDETR`` re-implements its
architecture from the paper's code structure: sequence-first tensors, ``nn.MultiheadAttention``,
``nn.Sequential(backbone, position_embedding)`` and the original parameter names, so its
``state_dict()`` has the published checkpoints' key layout (458 keys for R50 with sine PE).
"""
from __future__ import annotations

import logging
import math
import re

import pytest
import torch
import torch.nn.functional as F
import torchvision
from safetensors.torch import save_file
from torch import nn
from torchvision.models._utils import IntermediateLayerGetter
from torchvision.ops import FrozenBatchNorm2d

from visiontf.models.detr_convert import convert_state_dict, detect_format
from visiontf.registry import create_model

TOL = 1e-4


# --------------------------------------------------------------------------- reference (original layout)
class _Body(nn.Module):
    def __init__(self, name: str, dilation: bool) -> None:
        super().__init__()
        net = getattr(torchvision.models, name)(weights=None, replace_stride_with_dilation=[False, False, dilation], norm_layer=FrozenBatchNorm2d)
        self.body = IntermediateLayerGetter(net, {"layer4": "0"})


class _SinePE(nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n

    def forward(self, mask):
        valid = (~mask).float()
        ys = valid.cumsum(1)
        xs = valid.cumsum(2)
        ys = ys / (ys[:, -1:, :] + 1e-6) * 2 * math.pi
        xs = xs / (xs[:, :, -1:] + 1e-6) * 2 * math.pi
        freq = 10000 ** (2 * (torch.arange(self.n) // 2).float() / self.n)

        def enc(v):
            a = v[..., None] / freq
            return torch.stack((a[..., 0::2].sin(), a[..., 1::2].cos()), dim=-1).flatten(-2)

        return torch.cat((enc(ys), enc(xs)), dim=-1).permute(0, 3, 1, 2)


class _LearnedPE(nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.row_embed = nn.Embedding(50, n)
        self.col_embed = nn.Embedding(50, n)

    def forward(self, mask):
        B, h, w = mask.shape
        col = self.col_embed.weight[:w][None].repeat(h, 1, 1)
        row = self.row_embed.weight[:h][:, None].repeat(1, w, 1)
        return torch.cat((col, row), -1).permute(2, 0, 1)[None].repeat(B, 1, 1, 1)


class _EncLayer(nn.Module):
    def __init__(self, d, h, ff):
        super().__init__()
        self.self_attn = nn.MultiheadAttention(d, h)
        self.linear1, self.linear2 = nn.Linear(d, ff), nn.Linear(ff, d)
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)

    def forward(self, src, pad, pos):
        q = src + pos
        src = self.norm1(src + self.self_attn(q, q, src, key_padding_mask=pad)[0])
        return self.norm2(src + self.linear2(F.relu(self.linear1(src))))


class _DecLayer(nn.Module):
    def __init__(self, d, h, ff):
        super().__init__()
        self.self_attn = nn.MultiheadAttention(d, h)
        self.multihead_attn = nn.MultiheadAttention(d, h)
        self.linear1, self.linear2 = nn.Linear(d, ff), nn.Linear(ff, d)
        self.norm1, self.norm2, self.norm3 = nn.LayerNorm(d), nn.LayerNorm(d), nn.LayerNorm(d)

    def forward(self, tgt, memory, pad, pos, qpos):
        q = tgt + qpos
        tgt = self.norm1(tgt + self.self_attn(q, q, tgt)[0])
        tgt = self.norm2(tgt + self.multihead_attn(tgt + qpos, memory + pos, memory, key_padding_mask=pad)[0])
        return self.norm3(tgt + self.linear2(F.relu(self.linear1(tgt))))


class _Stack(nn.Module):
    def __init__(self, layers, norm=None):
        super().__init__()
        self.layers = nn.ModuleList(layers)
        if norm is not None:
            self.norm = norm


class _Transformer(nn.Module):
    def __init__(self, d, h, ne, nd, ff):
        super().__init__()
        self.encoder = _Stack([_EncLayer(d, h, ff) for _ in range(ne)])
        self.decoder = _Stack([_DecLayer(d, h, ff) for _ in range(nd)], nn.LayerNorm(d))


class _OriginalDETR(nn.Module):
    """Sequence-first DETR with the original's module tree (eval-mode forward only)."""

    def __init__(self, num_classes=91, backbone="resnet50", dilation=False, d=256, h=8, ne=6, nd=6, ff=2048, nq=100, pe="sine"):
        super().__init__()
        channels = 512 if backbone in ("resnet18", "resnet34") else 2048
        self.backbone = nn.Sequential(_Body(backbone, dilation), _SinePE(d // 2) if pe == "sine" else _LearnedPE(d // 2))
        self.transformer = _Transformer(d, h, ne, nd, ff)
        self.class_embed = nn.Linear(d, num_classes + 1)
        self.bbox_embed = nn.Module()
        self.bbox_embed.layers = nn.ModuleList([nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, 4)])
        self.query_embed = nn.Embedding(nq, d)
        self.input_proj = nn.Conv2d(channels, d, 1)

    def forward(self, images, mask):
        feat = self.backbone[0].body(images)["0"]
        m = F.interpolate(mask[None].float(), size=feat.shape[-2:]).bool()[0]
        pos = self.backbone[1](m).flatten(2).permute(2, 0, 1)
        src = self.input_proj(feat).flatten(2).permute(2, 0, 1)
        pad = m.flatten(1)
        for layer in self.transformer.encoder.layers:
            src = layer(src, pad, pos)
        qpos = self.query_embed.weight[:, None].repeat(1, images.shape[0], 1)
        tgt, hs = torch.zeros_like(qpos), []
        for layer in self.transformer.decoder.layers:
            tgt = layer(tgt, src, pad, pos, qpos)
            hs.append(self.transformer.decoder.norm(tgt))
        hs = torch.stack(hs).transpose(1, 2)
        logits = self.class_embed(hs)
        x = hs
        for i, lin in enumerate(self.bbox_embed.layers):
            x = lin(x) if i == 2 else F.relu(lin(x))
        return logits, x.sigmoid()


# --------------------------------------------------------------------------- helpers
_TABLES = ("query_embed.weight", "row_embed.weight", "col_embed.weight", "query_position_embeddings.weight",
           "row_embeddings.weight", "column_embeddings.weight")


def _randomize(module: nn.Module) -> None:
    """Non-trivial values everywhere (LayerNorm/BN affine and BN statistics too), with moderate activations."""
    with torch.no_grad():
        for name, t in list(module.named_parameters()) + list(module.named_buffers()):
            if not t.is_floating_point():
                continue
            if name.endswith("running_var"):
                t.uniform_(0.5, 1.5)
            elif name.endswith("running_mean"):
                t.normal_(0, 0.1)
            elif t.dim() == 1 and ("norm" in name or "bn" in name or "downsample.1" in name or "normalization" in name):
                t.copy_((0.5 if name.endswith("weight") else 0.0) + 0.1 * torch.randn_like(t))
            elif name.endswith(_TABLES):
                t.normal_(0, 1)
            else:
                t.normal_(0, 1.0 / math.sqrt(max(1, t[0].numel() if t.dim() > 1 else 16)))


def _inputs(B=2, H=96, W=128):
    images = torch.randn(B, 3, H, W)
    mask = torch.zeros(B, H, W, dtype=torch.bool)
    mask[1, :, 3 * W // 4 :] = True  # the second image is padded on the right
    mask[1, 5 * H // 6 :, :] = True  # ... and at the bottom
    images[mask[:, None].expand_as(images)] = 0
    return images, mask


def _max_diff(a, b):
    return (a - b).abs().max().item()


# --------------------------------------------------------------------------- original checkpoints
@pytest.mark.slow
def test_original_r50_checkpoint_parity(tmp_path):
    ref = _OriginalDETR().eval()
    _randomize(ref)
    state = ref.state_dict()
    assert len(state) == 458  # the published R50 checkpoint's key count (REFERENCE.md)
    assert detect_format(state) == "original"
    path = tmp_path / "detr-r50-e632da11.pth"
    torch.save({"model": state}, path)

    model = create_model("detr_resnet50", pretrained=path).eval()
    images, mask = _inputs()
    with torch.no_grad():
        ref_logits, ref_boxes = ref(images, mask)
        out = model(images, mask)
    assert _max_diff(out["pred_logits"], ref_logits[-1]) < TOL
    assert _max_diff(out["pred_boxes"], ref_boxes[-1]) < TOL
    assert len(out["aux_outputs"]) == 5
    for i, aux in enumerate(out["aux_outputs"]):
        assert _max_diff(aux["pred_logits"], ref_logits[i]) < TOL
        assert _max_diff(aux["pred_boxes"], ref_boxes[i]) < TOL
    # the comparison is meaningful only if boxes are not saturated and logits vary
    assert 0.02 < ref_boxes.median() < 0.98 and ref_boxes.std() > 0.02 and ref_logits.std() > 0.1


@pytest.mark.slow
def test_original_dc5_learned_pe_checkpoint_parity(tmp_path):
    """Small original-layout model: DC5 dilation and the learned position embedding (``backbone.1.*``)."""
    kw = dict(num_classes=7, backbone="resnet50", dilation=True, d=64, h=4, ne=2, nd=2, ff=96, nq=10, pe="learned")
    ref = _OriginalDETR(**kw).eval()
    _randomize(ref)
    state = ref.state_dict()
    assert "backbone.1.row_embed.weight" in state
    path = tmp_path / "small.pth"
    torch.save({"model": state, "epoch": 3}, path)
    model = create_model(
        "detr_tiny", pretrained=path, num_classes=7, backbone="resnet50", dilation=True, hidden_dim=64, nheads=4, enc_layers=2,
        dec_layers=2, dim_feedforward=96, num_queries=10, position_embedding="learned",
    ).eval()
    images, mask = _inputs(H=64, W=64)
    with torch.no_grad():
        ref_logits, ref_boxes = ref(images, mask)
        out = model(images, mask)
    assert out["pred_logits"].shape == (2, 10, 8)
    assert _max_diff(out["pred_logits"], ref_logits[-1]) < TOL
    assert _max_diff(out["pred_boxes"], ref_boxes[-1]) < TOL
    assert _max_diff(out["aux_outputs"][0]["pred_boxes"], ref_boxes[0]) < TOL
    assert 0.02 < ref_boxes.median() < 0.98 and ref_boxes.std() > 0.02


# --------------------------------------------------------------------------- HuggingFace
def _hf_model(**cfg):
    transformers = pytest.importorskip("transformers")
    config = transformers.DetrConfig(use_pretrained_backbone=False, **cfg)
    hf = transformers.DetrForObjectDetection(config).eval()
    _randomize(hf)
    return hf


def _v5_to_v4(state: dict) -> dict:
    """Undo transformers v5's run-time renames, giving the names of checkpoints on the Hub."""
    out = {}
    for k, v in state.items():
        k = k.replace("model.backbone.model.", "model.backbone.conv_encoder.model.")
        k = k.replace("model.position_embedding.", "model.backbone.position_embedding.")
        k = k.replace(".o_proj.", ".out_proj.")
        k = re.sub(r"layers\.(\d+)\.mlp\.fc([12])\.", r"layers.\1.fc\2.", k)
        out[k] = v
    return out


_SMALL = dict(backbone="resnet18", num_labels=5, encoder_layers=2, decoder_layers=2, d_model=64, encoder_attention_heads=4,
              decoder_attention_heads=4, encoder_ffn_dim=96, decoder_ffn_dim=96, num_queries=12)
_OURS = dict(num_classes=5, hidden_dim=64, nheads=4, enc_layers=2, dec_layers=2, dim_feedforward=96, num_queries=12)


def _compare_hf(hf, model):
    images, mask = _inputs(H=64, W=96)
    with torch.no_grad():
        ref = hf(pixel_values=images, pixel_mask=(~mask).long())  # HF: 1 on valid pixels
        out = model(images, mask)
    d_logits = _max_diff(out["pred_logits"], ref.logits)
    d_boxes = _max_diff(out["pred_boxes"], ref.pred_boxes)
    assert d_logits < TOL and d_boxes < TOL, (d_logits, d_boxes)
    assert 0.02 < ref.pred_boxes.median() < 0.98 and ref.pred_boxes.std() > 0.02 and ref.logits.std() > 0.1


def test_hf_timm_backbone_parity(tmp_path):
    """The installed transformers' names and the v4 names of Hub checkpoints."""
    hf = _hf_model(**_SMALL)
    installed = hf.state_dict()
    v4 = _v5_to_v4(installed) if any(".o_proj." in k for k in installed) else installed
    assert any(k.startswith("model.backbone.conv_encoder.model.") for k in v4)
    for name, state in (("installed", installed), ("v4", v4)):
        path = tmp_path / f"hf_{name}.safetensors"
        save_file({k: v.contiguous() for k, v in state.items()}, str(path))
        model = create_model("detr_tiny", pretrained=path, **_OURS).eval()
        _compare_hf(hf, model)


def test_hf_learned_position_embedding_v4_names(tmp_path):
    hf = _hf_model(**_SMALL, position_embedding_type="learned")
    state = _v5_to_v4(hf.state_dict())
    assert "model.backbone.position_embedding.row_embeddings.weight" in state
    path = tmp_path / "hf.pth"
    torch.save(state, path)
    model = create_model("detr_tiny", pretrained=path, position_embedding="learned", **_OURS).eval()
    _compare_hf(hf, model)


def test_hf_resnet_backbone_parity(tmp_path):
    """``use_timm_backbone=False`` checkpoints (HF ResNet: ``embedder``/``encoder.stages`` names)."""
    transformers = pytest.importorskip("transformers")
    rc = transformers.ResNetConfig(layer_type="basic", depths=[2, 2, 2, 2], hidden_sizes=[64, 128, 256, 512], out_features=["stage4"])
    small = {k: v for k, v in _SMALL.items() if k != "backbone"}
    hf = _hf_model(**small, use_timm_backbone=False, backbone_config=rc)
    path = tmp_path / "hf.safetensors"
    save_file({k: v.contiguous() for k, v in hf.state_dict().items()}, str(path))
    model = create_model("detr_tiny", pretrained=path, **_OURS).eval()
    _compare_hf(hf, model)


@pytest.mark.slow
def test_hf_default_r50_key_mapping():
    """The default HF R50 (the layout of facebook/detr-resnet-50) maps onto every detr_resnet50 tensor."""
    transformers = pytest.importorskip("transformers")
    with torch.device("meta"):
        hf = transformers.DetrForObjectDetection(transformers.DetrConfig(use_pretrained_backbone=False, num_labels=91))
    model = create_model("detr_resnet50")
    own = model.state_dict()
    for state in (hf.state_dict(), _v5_to_v4(hf.state_dict())):
        converted = convert_state_dict(state, model)
        assert set(converted) == set(own)
        assert all(converted[k].shape == own[k].shape for k in own)


# --------------------------------------------------------------------------- fine-tuning and errors
def test_finetune_other_num_classes_drops_only_class_head(tmp_path, caplog):
    kw = dict(num_classes=7, backbone="resnet18", d=64, h=4, ne=1, nd=1, ff=96, nq=10)
    ref = _OriginalDETR(**kw)
    _randomize(ref)
    path = tmp_path / "small.pth"
    torch.save({"model": ref.state_dict()}, path)
    ours = dict(hidden_dim=64, nheads=4, enc_layers=1, dec_layers=1, dim_feedforward=96, num_queries=10)
    with caplog.at_level(logging.WARNING):
        model = create_model("detr_tiny", pretrained=path, num_classes=3, **ours)
    dropped = [r.getMessage() for r in caplog.records if "class head not loaded" in r.getMessage()]
    assert len(dropped) == 1 and "class_embed.weight" in dropped[0] and "class_embed.bias" in dropped[0]
    assert "bbox_embed" not in dropped[0]
    assert model.class_embed.out_features == 4
    assert torch.equal(model.bbox_embed.layers[2].weight, ref.bbox_embed.layers[2].weight)
    assert torch.equal(model.query_embed.weight, ref.query_embed.weight)


def test_unknown_layout_error_lists_keys():
    model = create_model("detr_tiny")
    with pytest.raises(ValueError, match="unrecognised DETR checkpoint layout.*'foo.weight'"):
        convert_state_dict({"foo.weight": torch.zeros(1), "bar.bias": torch.zeros(1)}, model)


def test_own_keys_pass_through_and_counters_dropped():
    model = create_model("detr_tiny")
    state = dict(model.state_dict())
    state["backbone.body.bn1.num_batches_tracked"] = torch.tensor(5)
    converted = convert_state_dict(state, model)
    assert set(converted) == set(model.state_dict())
