"""Shared by the RT-DETR tests: small transformers models with random weights, the same model in visiontf, fixed
denoising queries for both, and the comparisons.

transformers' ``RTDetrForObjectDetection`` / ``RTDetrV2ForObjectDetection`` are built at toy widths (d 32, 4 heads,
2 decoder layers, 10 queries, a ResNet-vd of basic blocks at widths 16-48) and given random weights; visiontf's
``rtdetr_r18vd`` / ``rtdetrv2_r18vd`` are built at the same widths and load transformers' state dict through the
family's converter (``create_model(name, pretrained=file)``, as a user loads a transformers checkpoint).
"""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch import Tensor

from visiontf.models import create_model
from visiontf.models.deformable_detr.denoising import DenoisingQueries, build_contrastive_denoising
from visiontf.set_prediction import build_postprocess


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """The RT-DETR test modules run on one torch thread (restored afterwards): their models are tiny, and on a loaded
    2-core machine two OpenMP threads spin-wait on each small convolution (the files took 3 minutes instead of 20 s)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


NUM_CLASSES = 5
QUERIES = 10
#: the toy widths in visiontf's sections (RT-DETR R18-vd with a narrow ResNet, as the transformers config below)
TOY = dict(
    backbone=dict(kwargs=dict(stem_width=8, widths=(16, 24, 32, 48), blocks=(1, 1, 1, 1)), frozen_bn=True),
    encoder=dict(hidden_dim=32, nhead=4, dim_feedforward=64, expansion=1.0),
    decoder=dict(hidden_dim=32, nhead=4, dim_feedforward=64, num_layers=2, num_queries=QUERIES),
    denoising=dict(num_denoising=6),
)


def transformers_config(version: str = "v1", **extra):
    from transformers import RTDetrConfig, RTDetrResNetConfig, RTDetrV2Config

    backbone = RTDetrResNetConfig(embedding_size=16, hidden_sizes=[16, 24, 32, 48], depths=[1, 1, 1, 1], layer_type="basic",
                                  out_indices=[2, 3, 4])
    kwargs = dict(backbone_config=backbone, encoder_hidden_dim=32, encoder_in_channels=[24, 32, 48], encoder_ffn_dim=64,
                  encoder_attention_heads=4, d_model=32, decoder_in_channels=[32, 32, 32], decoder_ffn_dim=64, decoder_attention_heads=4,
                  decoder_layers=2, num_queries=QUERIES, num_labels=NUM_CLASSES, num_denoising=6, **extra)
    return (RTDetrConfig if version == "v1" else RTDetrV2Config)(**kwargs)


def randomize(model: torch.nn.Module, seed: int) -> None:
    """Random values on float16's grid: matrices N(0, 1/fan_in), biases N(0, 0.1), norms around identity,
    running variances in [0.5, 1.5]; tied tensors (transformers' heads) get one value."""
    g = torch.Generator().manual_seed(seed)
    done: set[int] = set()
    with torch.no_grad():
        for name, t in model.state_dict(keep_vars=True).items():
            if not t.is_floating_point() or id(t) in done or name.endswith("n_points_scale"):
                continue
            done.add(id(t))
            if name.endswith("running_var"):
                value = torch.rand(t.shape, generator=g) + 0.5
            elif t.dim() >= 2:
                value = torch.randn(t.shape, generator=g) / math.sqrt(t[0].numel())
            elif "norm" in name and name.endswith("weight"):
                value = 1 + 0.2 * torch.randn(t.shape, generator=g)
            else:
                value = 0.1 * torch.randn(t.shape, generator=g)
            t.copy_(value.half().float())


def transformers_model(version: str = "v1", seed: int = 0, **extra):
    from transformers import RTDetrForObjectDetection, RTDetrV2ForObjectDetection

    cls = RTDetrForObjectDetection if version == "v1" else RTDetrV2ForObjectDetection
    torch.manual_seed(seed)
    model = cls(transformers_config(version, **extra))
    randomize(model, seed)
    return model.eval()


def visiontf_model(version: str, path: Path, tables: str = "transformers", **sections) -> torch.nn.Module:
    """visiontf's model at the toy widths, loading ``path`` (a transformers or original state dict)."""
    name = "rtdetr_r18vd" if version == "v1" else "rtdetrv2_r18vd"
    kwargs = {k: {**v, **sections.get(k, {})} for k, v in TOY.items()}
    return create_model(name, pretrained=str(path), num_classes=NUM_CLASSES, input_norm="none", tables=tables, **kwargs).eval()


def recorded_settings(settings: dict, model_name: str) -> dict:
    """A fixture's recorded ``create_model`` settings with its backbone in the spelling of today's configs.

    The generators (``scripts/fixtures/make_*.py``) recorded the backbone in the former ``ResNetVdOptions`` /
    ``HGNetV2Options`` fields. Those fields are read once here over the variant's own backbone, as the builder reads
    them, and the :class:`~visiontf.models.backbones.spec.BackboneSpec` that comes out is written in their place, so the
    tests build the recorded network without the builder's migration warning (which is asserted here, once per read)."""
    import warnings

    from visiontf.models.dfine import dfine
    from visiontf.models.rtdetr import rtdetr
    from visiontf.models.rtdetr.backbone_section import backbone_section

    settings = dict(settings)
    family, default, former = ((rtdetr, rtdetr.RESNET_VD_DEFAULT, rtdetr.RESNET_VD_FORMER) if model_name in rtdetr.DEFAULT_CFGS
                               else (dfine, dfine.HGNETV2_DEFAULT, dfine.HGNETV2_FORMER))
    if former.describes(settings.get("backbone")):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            spec = backbone_section(settings["backbone"], family.DEFAULT_CFGS[model_name].kwargs.get("backbone"), default, former)
        assert [w.category for w in caught] == [FutureWarning], [str(w.message) for w in caught]
        settings["backbone"] = {"name": spec.name, **spec.to_dict()}
    return settings


def padded_batch(sizes: list[tuple[int, int]], seed: int = 1) -> tuple[Tensor, Tensor]:
    """Images in [0, 1] of ``sizes`` zero-padded into one batch, and the padding mask."""
    g = torch.Generator().manual_seed(seed)
    H, W = max(h for h, _ in sizes), max(w for _, w in sizes)
    images = torch.zeros(len(sizes), 3, H, W)
    mask = torch.ones(len(sizes), H, W, dtype=torch.bool)
    for i, (h, w) in enumerate(sizes):
        images[i, :, :h, :w] = torch.rand(3, h, w, generator=g).half().float()
        mask[i, :h, :w] = False
    return images, mask


def targets_for(batch: int, seed: int = 2) -> list[dict[str, Tensor]]:
    """2 and 3 boxes (normalised cxcywh) with labels below NUM_CLASSES."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for n in [2, 3, 1, 2][:batch]:
        centre = 0.3 + 0.4 * torch.rand(n, 2, generator=g)
        size = 0.1 + 0.3 * torch.rand(n, 2, generator=g)
        out.append({"labels": torch.randint(0, NUM_CLASSES, (n,), generator=g), "boxes": torch.cat([centre, size], 1)})
    return out


def fixed_denoising(targets, seed: int = 3, num_denoising: int = 6) -> DenoisingQueries:
    """RT-DETR's denoising groups (noise 1.0, clamp 1e-5, zero padding boxes), drawn once."""
    g = torch.Generator().manual_seed(seed)
    return build_contrastive_denoising(targets, NUM_CLASSES, QUERIES, num_denoising, 0.5, 1.0, generator=g, inverse_sigmoid_eps=1e-5,
                                       pad_box="zero")


def transformers_denoising(dn: DenoisingQueries):
    """A stand-in for transformers' ``get_contrastive_denoising_training_group`` that returns ``dn``'s queries."""

    def build(targets, num_classes, num_queries, class_embed, **kwargs):
        meta = dn.meta
        mask = torch.zeros(dn.attn_mask.shape, dtype=class_embed.weight.dtype).masked_fill(dn.attn_mask, -torch.inf)
        values = {"dn_positive_idx": list(meta.positive_idx), "dn_num_group": meta.num_groups,
                  "dn_num_split": [meta.pad_size, meta.num_queries]}
        return class_embed(dn.labels), dn.boxes_unact, mask, values

    return build


def max_diff(a: Tensor, b: Tensor) -> float:
    return (a.double() - b.double()).abs().max().item()


def assert_eval_outputs_match(model: torch.nn.Module, theirs: dict[str, Tensor], inputs: dict[str, Tensor], tol: float,
                              box_tol: float | None = None) -> None:
    """A recorded original's evaluation against ``model``'s, input by input (``inputs``: name -> images in the
    comparison's dtype; ``theirs``: the fixture's outputs in that dtype): the recorded outputs are not degenerate,
    logits and boxes agree within ``tol``; in float64 also the post-processing (labels equal, scores within 1e-6 and,
    with ``box_tol``, boxes in pixels within it)."""
    for name, images in inputs.items():
        with torch.no_grad():
            out = model(images)
        assert theirs[f"{name}.pred_logits"].std() > 0.1 and theirs[f"{name}.pred_boxes"].std() > 0.02  # not degenerate
        assert max_diff(out["pred_logits"], theirs[f"{name}.pred_logits"]) < tol, name
        assert max_diff(out["pred_boxes"], theirs[f"{name}.pred_boxes"]) < tol, name
        if images.dtype == torch.float64:
            H, W = images.shape[-2:]
            for b, found in enumerate(build_postprocess(model)(out, torch.tensor([[H, W]] * len(images)))):
                assert torch.equal(found["labels"], theirs[f"{name}.detections.labels"][b])
                assert max_diff(found["scores"], theirs[f"{name}.detections.scores"][b]) < 1e-6
                if box_tol is not None:
                    assert max_diff(found["boxes"], theirs[f"{name}.detections.boxes"][b]) < box_tol
