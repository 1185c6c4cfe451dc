"""Shared pieces of the Deformable DETR tests: the recorded fixtures of the original, toy configurations, weights, inputs.

``tests/fixtures/deformable_detr/`` holds what fundamentalvision/Deformable-DETR itself computed
(``scripts/fixtures/make_deformable_detr.py --repo PATH`` writes it): :func:`fixture` reads a case,
:func:`checkpoint` rebuilds the checkpoint a user of the original has, :func:`fixture_kwargs` gives the
``create_model`` keywords of the same architecture. No code of the original is needed here.

``original()`` (the own-words re-implementation in ``tests/reference/deformable_detr.py``) stays for the
tests that only need a state dict of the original layout at other sizes (``test_finetune.py``).
"""
from __future__ import annotations

import functools
import math
import re
import sys
from pathlib import Path

import pytest
import torch
from reference.fixtures import FIXTURES, Fixture, load_fixture
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ is not an installed package
from reference.deformable_detr import OriginalDeformableDETR  # noqa: E402

FAMILY = "deformable_detr"
#: the published variants' switches
VARIANTS = {
    "plain": {},
    "box_refine": {"with_box_refine": True},
    "two_stage": {"with_box_refine": True, "two_stage": True},
}
#: a toy model in the original layout (ResNet-18 trunk, d 64, 4 levels, 2+2 layers, 12 queries) ...
TOY_ORIGINAL = dict(num_classes=7, backbone="resnet18", num_feature_levels=4, d=64, nheads=4, enc_layers=2, dec_layers=2,
                    dim_feedforward=96, num_queries=12, dec_n_points=2, enc_n_points=3, dropout=0.0)
#: ... and the same in visiontf's sections
TOY = dict(num_classes=7, backbone="resnet18",
           arch=dict(num_feature_levels=4, hidden_dim=64, nheads=4, enc_layers=2, dec_layers=2, dim_feedforward=96, num_queries=12,
                     dec_n_points=2, enc_n_points=3, dropout=0.0))
#: the variants' switches in visiontf's sections (``VARIANTS`` spells them as the original and transformers do)
VARIANT_SECTIONS = {variant: {"arch": flags} if flags else {} for variant, flags in VARIANTS.items()}


def toy(variant: str = "plain", **sections) -> dict:
    """``create_model`` keywords of the toy model: ``TOY``, the variant's switches, then ``sections`` merged on top
    field by field (``toy("two_stage", arch={"num_queries": 100})`` keeps TOY's other ``arch`` fields)."""
    from visiontf.models.deformable_detr.build import merge_sections

    return merge_sections(merge_sections(TOY, VARIANT_SECTIONS[variant]), sections)

_TABLES = ("query_embed.weight", "level_embed", "query_position_embeddings.weight")


# ------------------------------------------------------------------------------------------ recorded fixtures
@functools.cache
def fixture(case: str) -> Fixture:
    """A recorded case: ``plain``, ``box_refine``, ``two_stage``, ``ms_deform_attn``, ``geometry``, ``criterion``.

    Read once per session and shared: never change its tensors in place (clone before ``requires_grad_``).
    """
    return load_fixture(FAMILY, case)


def checkpoint(fx: Fixture) -> dict[str, torch.Tensor]:
    """The original's state dict as its checkpoint file holds it: float32, every repeated head under each of its keys."""
    state = {k: v.float() if v.is_floating_point() else v for k, v in fx.weights.items()}
    for alias, source in fx.meta.get("aliases", {}).items():
        state[alias] = state[source]
    return state


def save_checkpoint(fx: Fixture, path: Path) -> Path:
    """The model-zoo file format, ``{"model": state_dict}``."""
    torch.save({"model": checkpoint(fx), "epoch": 49}, path)
    return path


def fixture_kwargs(fx: Fixture, **overrides) -> dict:
    """``create_model`` keywords of the recorded model: its sizes and the same reduced ResNet (timm's resnet18), as
    sections; ``overrides`` (sections, or ``num_classes``) merged on top field by field."""
    settings, backbone = fx.meta["settings"], dict(fx.meta["backbone"])
    timm_name = backbone.pop("timm")
    keys = ("hidden_dim", "nheads", "dim_feedforward", "enc_layers", "dec_layers", "num_queries", "enc_n_points", "dec_n_points",
            "dropout", "num_feature_levels", "with_box_refine", "two_stage", "aux_loss")
    from visiontf.models.deformable_detr.build import merge_sections

    recorded = {"num_classes": fx.meta["num_classes"],
                "backbone": {"name": f"timm:{timm_name}", "kwargs": {k: tuple(v) if isinstance(v, list) else v for k, v in backbone.items()}},
                "arch": {k: settings[k] for k in keys}}
    return merge_sections(recorded, overrides)


#: the registered model of each variant (the recorded keywords override its sizes)
VARIANT_NAMES = {"plain": "deformable_detr_resnet50", "box_refine": "deformable_detr_resnet50_box_refine",
                 "two_stage": "deformable_detr_resnet50_two_stage"}


def load_recorded(variant: str, path: Path, dtype: torch.dtype = torch.float32, **overrides) -> nn.Module:
    """``create_model(name, pretrained=path)`` with the recorded case's sizes, in eval mode and ``dtype``.

    In float32 the toy widths (d = 32) run contiguous maps: each GroupNorm group there is one channel of a few
    positions, where PyTorch's channels-last CPU GroupNorm (the registered default) loses about 1e-4 in float32.
    The two-stage case (d = 256, 8 channels a group, as published) and every float64 run keep the default.
    """
    from visiontf.models import create_model

    fx = fixture(variant)
    if dtype == torch.float32 and fx.meta["settings"]["hidden_dim"] < 256:
        overrides["backbone"] = {"channels_last": False, **overrides.get("backbone", {})}
    return create_model(VARIANT_NAMES[variant], pretrained=path, **fixture_kwargs(fx, **overrides)).eval().to(dtype)


def flatten(out: dict, prefix: str = "") -> dict[str, torch.Tensor]:
    """A model's output dict under the fixture's names (``aux_outputs.0.pred_boxes``, ``enc_outputs.pred_logits``)."""
    flat: dict[str, torch.Tensor] = {}
    for key, value in out.items():
        name = f"{prefix}{key}"
        if isinstance(value, torch.Tensor):
            flat[name] = value
        elif isinstance(value, dict):
            flat.update(flatten(value, name + "."))
        elif isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                flat.update(flatten(item, f"{name}.{i}."))
    return flat


def recorded_targets(fx: Fixture, dtype: torch.dtype = torch.float32) -> list[dict[str, torch.Tensor]]:
    count = 1 + max(int(k.split(".")[1]) for k in fx.inputs if k.startswith("targets."))
    return [{"labels": fx.inputs[f"targets.{b}.labels"], "boxes": fx.inputs[f"targets.{b}.boxes"].to(dtype)} for b in range(count)]


def recorded_matches(record: dict[str, torch.Tensor], name: str, batch: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(record[f"match.{name}.{b}.query"], record[f"match.{name}.{b}.target"]) for b in range(batch)]


def r50_layouts() -> dict[str, tuple[int, dict[str, tuple[int, ...]]]]:
    """``r50_layouts.txt``: per variant, the original's parameter count and {key: shape} (``N`` lines expanded)."""
    layouts: dict[str, tuple[int, dict[str, tuple[int, ...]]]] = {}
    variant, params, keys = None, 0, {}
    for line in (FIXTURES / FAMILY / "r50_layouts.txt").read_text().splitlines():
        head = re.match(r"^## (\w+): (\d+) parameters, (\d+) state-dict entries$", line)
        if head:
            variant, params, keys = head.group(1), int(head.group(2)), {}
            layouts[variant] = (params, keys)
            continue
        entry = re.match(r"^(\S+) \[([\d, ]*)\](?:  x(\d+))?$", line)
        if entry is None or variant is None:
            continue
        shape = tuple(int(s) for s in entry.group(2).split(",") if s.strip())
        copies = int(entry.group(3) or 0)
        names = [entry.group(1).replace(".N.", f".{i}.", 1) for i in range(copies)] if copies else [entry.group(1)]
        keys.update(dict.fromkeys(names, shape))
    return layouts


# ------------------------------------------------------------------------------------------ toy models, values, inputs
def randomize(module: nn.Module, seed: int = 0) -> None:
    """Non-trivial values everywhere (BN statistics, norms, offsets too) with moderate activations."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in list(module.named_parameters()) + list(module.named_buffers()):
            if not t.is_floating_point():
                continue
            if name.endswith("running_var"):
                t.copy_(torch.empty(t.shape).uniform_(0.5, 1.5, generator=g))
            elif name.endswith("running_mean"):
                t.copy_(0.1 * torch.randn(t.shape, generator=g))
            elif t.dim() == 1 and any(k in name for k in ("norm", "bn", "downsample.1", "normalization")) or (
                "input_proj" in name and ".1." in name
            ):
                t.copy_((0.5 if name.endswith("weight") else 0.0) + 0.1 * torch.randn(t.shape, generator=g))
            elif name.endswith(_TABLES):
                t.copy_(torch.randn(t.shape, generator=g))
            else:
                fan = t[0].numel() if t.dim() > 1 else 16
                t.copy_(torch.randn(t.shape, generator=g) / math.sqrt(max(1, fan)))


def original(variant: str, seed: int = 0, **overrides) -> OriginalDeformableDETR:
    """A toy model of the original's key layout from the benchmark re-implementation (layout only; values come from fixtures)."""
    model = OriginalDeformableDETR(**{**TOY_ORIGINAL, **VARIANTS[variant], **overrides}).eval()
    randomize(model, seed)
    return model


def inputs(B: int = 2, H: int = 96, W: int = 128, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Images and a padding mask: the second image padded on the right and at the bottom."""
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(B, 3, H, W, generator=g)
    mask = torch.zeros(B, H, W, dtype=torch.bool)
    if B > 1:
        mask[1, :, 3 * W // 4:] = True
        mask[1, 5 * H // 6:, :] = True
    images[mask[:, None].expand_as(images)] = 0
    return images, mask


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.detach().double() - b.detach().double()).abs().max().item()


def hf_deformable_detr(variant: str, **cfg):
    transformers = pytest.importorskip("transformers")
    config = transformers.DeformableDetrConfig(
        backbone="resnet18", num_labels=5, encoder_layers=2, decoder_layers=2, d_model=64, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=96, decoder_ffn_dim=96, num_queries=12, two_stage_num_proposals=12,
        num_feature_levels=4, encoder_n_points=3, decoder_n_points=2, dropout=0.0, **VARIANTS[variant], **cfg,
    )
    hf = transformers.DeformableDetrForObjectDetection(config).eval()
    randomize(hf)
    return hf
