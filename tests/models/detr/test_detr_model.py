"""DETR model: output contract, padding invariance, backbone freezing/loading, training step, autocast."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
import torchvision
from torch import nn

from visiontf.models import create_model
from visiontf.models.backbones.detr_backbone import DetrBackbone
from visiontf.models.detr.build import DETR_SECTIONS
from visiontf.models.detr.detr import DETR

SMALL = dict(num_classes=5, arch=dict(hidden_dim=32, nheads=4, enc_layers=2, dec_layers=3, dim_feedforward=64, num_queries=7))


def _tiny(**kw) -> DETR:
    return create_model("detr_tiny", **DETR_SECTIONS.merge(SMALL, kw))


def test_output_contract_and_attention_maps():
    model = _tiny().eval()
    images = torch.randn(2, 3, 96, 128)
    mask = torch.zeros(2, 96, 128, dtype=torch.bool)
    mask[1, :, 64:] = True
    with torch.no_grad():
        out = model(images, mask, need_weights=True)
    assert out["pred_logits"].shape == (2, 7, 6)  # num_classes + "no object"
    assert out["pred_boxes"].shape == (2, 7, 4)
    assert ((out["pred_boxes"] > 0) & (out["pred_boxes"] < 1)).all()
    assert len(out["aux_outputs"]) == 2
    assert all(a["pred_logits"].shape == (2, 7, 6) and a["pred_boxes"].shape == (2, 7, 4) for a in out["aux_outputs"])
    h, w = out["feature_size"]
    assert (h, w) == (3, 4)
    assert out["dec_attn"].shape == (2, 7, h * w) and out["enc_attn"].shape == (2, h * w, h * w)
    torch.testing.assert_close(out["dec_attn"].sum(-1), torch.ones(2, 7))
    # padded feature cells (right half of image 1) receive no attention from queries nor tokens
    padded = F.interpolate(mask[None].float(), size=(h, w)).bool()[0].flatten(1)
    assert padded[1].any()
    assert out["dec_attn"][1][:, padded[1]].abs().max() == 0
    assert out["enc_attn"][1][:, padded[1]].abs().max() == 0
    assert model.pretrained_cfg.min_size == 800 and model.pretrained_cfg.max_size == 1333
    assert model.head_prefixes == ("class_embed.",)


def test_aux_loss_off_gives_the_same_final_prediction():
    model = _tiny().eval()
    model_no_aux = _tiny(arch={"aux_loss": False}).eval()
    model_no_aux.load_state_dict(model.state_dict())
    images = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        a, b = model(images), model_no_aux(images)
    assert "aux_outputs" not in b
    torch.testing.assert_close(a["pred_logits"], b["pred_logits"])
    torch.testing.assert_close(a["pred_boxes"], b["pred_boxes"])


class _FixedFeatures(nn.Module):
    """Stands in for the CNN so the test controls the feature map and its padding mask exactly."""

    def __init__(self, features, mask, num_channels):
        super().__init__()
        self.features, self.mask, self.num_channels = features, mask, num_channels

    def forward(self, images, mask):
        return self.features, self.mask


@pytest.mark.parametrize("position_embedding", ["sine", "learned"])
def test_padding_is_invisible_to_the_transformer(position_embedding):
    """Batching pads images; DETR must give a padded feature map the unpadded map's predictions.

    Pixel-level padding cannot be exactly invisible (the CNN's receptive field mixes border zeros
    into valid cells), so the invariance is tested where DETR guarantees it: a feature map padded
    with arbitrary values and masked gives exactly the unpadded map's outputs. That needs the sine
    embedding normalised over valid cells only, and padded keys ignored by every attention.
    """
    model = _tiny(arch={"position_embedding": position_embedding}).eval()
    C = model.backbone.num_channels
    feats = torch.randn(1, C, 3, 4)
    padded = torch.randn(1, C, 5, 7) * 10  # garbage in the padding
    padded[:, :, :3, :4] = feats
    pad_mask = torch.ones(1, 5, 7, dtype=torch.bool)
    pad_mask[:, :3, :4] = False
    images = torch.zeros(1, 3, 96, 128)
    with torch.no_grad():
        model.backbone = _FixedFeatures(feats, torch.zeros(1, 3, 4, dtype=torch.bool), C)
        ref = model(images, torch.zeros(1, 96, 128, dtype=torch.bool))
        model.backbone = _FixedFeatures(padded, pad_mask, C)
        out = model(images, torch.zeros(1, 96, 128, dtype=torch.bool))
    torch.testing.assert_close(out["pred_logits"], ref["pred_logits"], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out["pred_boxes"], ref["pred_boxes"], atol=1e-5, rtol=1e-5)


def test_backbone_mask_is_nearest_resized_and_stage1_frozen():
    bb = DetrBackbone("resnet18")
    mask = torch.zeros(1, 64, 96, dtype=torch.bool)
    mask[:, :, 40:] = True
    feats, fmask = bb(torch.randn(1, 3, 64, 96), mask)
    assert feats.shape == (1, 512, 2, 3) and bb.num_channels == 512
    assert fmask.tolist() == [[[False, False, True], [False, False, True]]]
    frozen = {n.split(".")[0] for n, p in bb.body.named_parameters() if not p.requires_grad}
    trained = {n.split(".")[0] for n, p in bb.body.named_parameters() if p.requires_grad}
    assert frozen == {"conv1", "layer1"} and trained == {"layer2", "layer3", "layer4"}
    assert isinstance(bb.body.bn1, torchvision.ops.FrozenBatchNorm2d) and bb.body.bn1.eps == 1e-5
    assert not any(p.requires_grad for p in DetrBackbone("resnet18", train_backbone=False).parameters())
    with pytest.raises(ValueError, match="resnet50/resnet101"):
        DetrBackbone("resnet18", dilation=True)
    with pytest.raises(ValueError, match="timm:"):
        DetrBackbone("vgg16")


def test_timm_backbone_and_channels_last():
    bb = DetrBackbone("timm:resnet18", channels_last=True).eval()
    assert bb.num_channels == 512
    assert not bb.body.conv1.weight.requires_grad and bb.body.layer2[0].conv1.weight.requires_grad
    mask = torch.zeros(2, 64, 64, dtype=torch.bool)
    mask[0, 32:] = True
    images = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        feats, fmask = bb(images, mask)
        bb.channels_last = False
        plain, _ = bb(images.contiguous(), mask)
    assert feats.shape == (2, 512, 2, 2) and fmask[0].tolist() == [[False, False], [True, True]]
    torch.testing.assert_close(feats, plain, atol=1e-4, rtol=1e-4)
    model = _tiny(backbone={"name": "timm:resnet18", "channels_last": True}).eval()
    with torch.no_grad():
        assert model(images, mask)["pred_boxes"].shape == (2, 7, 4)


def test_backbone_imagenet_weights_from_file(tmp_path, caplog, monkeypatch):
    tv = torchvision.models.resnet18(weights=None)
    with torch.no_grad():
        for m in tv.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_var.uniform_(0.5, 2)
                m.weight.normal_()
    path = tmp_path / "resnet18.pth"
    torch.save(tv.state_dict(), path)  # holds fc.* and num_batches_tracked, both ignored
    bb = DetrBackbone("resnet18", pretrained=path).eval()
    torch.testing.assert_close(bb.body.layer3[1].bn2.running_var, tv.layer3[1].bn2.running_var)
    torch.testing.assert_close(bb.body.conv1.weight, tv.conv1.weight)
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        ref = nn.Sequential(*list(tv.eval().children())[:-2])(x)
        torch.testing.assert_close(bb(x, torch.zeros(1, 64, 64, dtype=torch.bool))[0], ref, atol=1e-4, rtol=1e-4)

    bad = tmp_path / "resnet34.pth"
    torch.save(torchvision.models.resnet34(weights=None).state_dict(), bad)
    with pytest.raises(RuntimeError, match="unexpected"):
        DetrBackbone("resnet18", pretrained=bad)

    def offline(*a, **k):
        raise OSError("network unreachable")

    monkeypatch.setattr(torchvision.models.ResNet18_Weights.IMAGENET1K_V1.__class__, "get_state_dict", offline)
    with pytest.raises(RuntimeError, match="backbone_pretrained='/path/to/resnet18-f37072fd.pth'"):
        DetrBackbone("resnet18", pretrained=True)


def test_detr_tiny_trains_on_cpu():
    model = create_model("detr_tiny", num_classes=3).train()
    images = torch.randn(2, 3, 128, 128)
    out = model(images, torch.zeros(2, 128, 128, dtype=torch.bool))
    loss = out["pred_logits"].logsumexp(-1).mean() + out["pred_boxes"].sum() + sum(a["pred_boxes"].sum() for a in out["aux_outputs"])
    loss.backward()
    assert model.class_embed.weight.grad.abs().sum() > 0
    assert model.query_embed.weight.grad.abs().sum() > 0
    assert model.transformer.encoder.layers[0].attn.qkv.weight.grad.abs().sum() > 0
    assert model.backbone.body.layer4[1].conv2.weight.grad.abs().sum() > 0
    assert model.backbone.body.conv1.weight.grad is None
    assert model.num_queries == 50 and model.hidden_dim == 128


def test_bf16_autocast_keeps_boxes_float32():
    model = _tiny().eval()
    images = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        ref = model(images)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(images, torch.zeros(1, 64, 64, dtype=torch.bool))
    assert out["pred_boxes"].dtype == torch.float32
    assert torch.isfinite(out["pred_logits"].float()).all()
    assert (out["pred_boxes"] - ref["pred_boxes"]).abs().max() < 0.05


def test_original_initialisation_and_size():
    model = _tiny()
    attn = model.transformer.decoder.layers[0].cross_attn
    bound = math.sqrt(6 / (attn.qkv.weight.shape[0] + attn.qkv.weight.shape[1]))  # xavier on the fused in_proj
    assert attn.qkv.weight.abs().max() <= bound and attn.qkv.weight.abs().max() > 0.9 * bound
    assert attn.qkv.bias.abs().max() == 0 and attn.proj.bias.abs().max() == 0
    with torch.device("meta"):
        r50 = create_model("detr_resnet50")
    assert sum(p.numel() for p in r50.parameters()) == 41_524_768  # the paper's 41.5 M (HF's count too)
    assert len(r50.state_dict()) == 458  # as the original checkpoint


def test_bad_arguments_are_explained():
    with pytest.raises(ValueError, match="position_embedding"):
        _tiny(arch={"position_embedding": "rope"})
    with pytest.raises(ValueError, match="num_classes"):
        _tiny(num_classes=0)
    model = _tiny().eval()
    with pytest.raises(ValueError, match=r"mask must have shape"):
        model(torch.randn(1, 3, 32, 32), torch.zeros(1, 16, 16, dtype=torch.bool))
