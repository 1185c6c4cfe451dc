"""What the families' weight conversions share; each family's converter keeps only its own name table.

* :data:`Rules` and :func:`rename` / :func:`rename_state`: a key renamed by the first matching regex rule;
* :func:`strip_prefix`: a wrapper's prefix (DDP's ``module.``) off every key, when every key has it;
* :func:`drop_batchnorm_counters`: BatchNorm's ``num_batches_tracked`` (frozen BatchNorm has none);
* :func:`fuse_qkv`: HF's separate ``q_proj``/``k_proj``/``v_proj`` into the fused ``qkv`` of visiontf's attention;
* :func:`hf_resnet_name`, :func:`hf_backbone_rules`: HF ``ResNetModel`` names to torchvision's;
* :func:`detr_family_format`: which of the DETR family's layouts (original, HF, visiontf) a state dict is in.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Iterable

import torch
from torch import Tensor

#: ``(pattern, replacement)`` pairs tried in order; a replacement is an ``re.sub`` template or a function of the match
Rules = list[tuple[str, str | Callable[[re.Match], str]]]


def rename(key: str, rules: Rules) -> str | None:
    """``key`` renamed by the first rule whose pattern matches it; None when none does."""
    for pattern, repl in rules:
        new, n = re.subn(pattern, repl, key)
        if n:
            return new
    return None


def rename_state(state: dict[str, Tensor], rules: Rules, keep_unmatched: bool = False) -> tuple[dict[str, Tensor], list[str]]:
    """Every key renamed by :func:`rename`: ``(renamed, unmatched keys)``; ``keep_unmatched`` keeps those
    under their own names instead of leaving them out."""
    out: dict[str, Tensor] = {}
    unmatched = []
    for key, value in state.items():
        new = rename(key, rules)
        if new is None:
            unmatched.append(key)
            if keep_unmatched:
                out[key] = value
        else:
            out[new] = value
    return out, unmatched


def strip_prefix(state: dict[str, Tensor], prefix: str = "module.", exempt: Iterable[str] = ()) -> dict[str, Tensor]:
    """``state`` without ``prefix`` when every key has it (keys starting with an ``exempt`` prefix aside, which
    keep their names), e.g. DDP's ``module.``; unchanged otherwise."""
    exempt = tuple(exempt)
    rest = [k for k in state if not (exempt and k.startswith(exempt))]
    if not rest or not all(k.startswith(prefix) for k in rest):
        return state
    return {k[len(prefix):] if k.startswith(prefix) else k: v for k, v in state.items()}


def drop_batchnorm_counters(state: dict[str, Tensor]) -> tuple[dict[str, Tensor], int]:
    """``state`` without BatchNorm's ``num_batches_tracked`` counters, and how many there were."""
    kept = {k: v for k, v in state.items() if not k.endswith("num_batches_tracked")}
    return kept, len(state) - len(kept)


def fuse_qkv(state: dict[str, Tensor], what: str = "HF checkpoint") -> dict[str, Tensor]:
    """Concatenate ``*.q_proj``, ``*.k_proj``, ``*.v_proj`` into the fused ``*.qkv`` (q, k, v order, as
    ``nn.MultiheadAttention``'s ``in_proj``)."""
    out: dict[str, Tensor] = {}
    groups: dict[str, dict[str, Tensor]] = {}
    for key, value in state.items():
        m = re.match(r"^(.*)\.([qkv])_proj\.(weight|bias)$", key)
        if m is None:
            out[key] = value
        else:
            groups.setdefault(f"{m.group(1)}.qkv.{m.group(3)}", {})[m.group(2)] = value
    for key, parts in groups.items():
        if set(parts) != {"q", "k", "v"}:
            raise ValueError(f"{what}: {key} needs q_proj, k_proj and v_proj, found only {sorted(parts)}")
        out[key] = torch.cat([parts["q"], parts["k"], parts["v"]], dim=0)
    return out


def hf_resnet_name(m: re.Match, prefix: str = "backbone.body.") -> str:
    """HF ``ResNetModel`` names -> torchvision's (``stages.S.layers.L.layer.K`` -> ``layer{S+1}.L.conv{K+1}``),
    for a rule matching ``stages.(S).layers.(L).(rest)``."""
    stage, block, rest = int(m.group(1)), m.group(2), m.group(3)
    rest = re.sub(r"^shortcut\.convolution\.", "downsample.0.", rest)
    rest = re.sub(r"^shortcut\.normalization\.", "downsample.1.", rest)
    rest = re.sub(r"^layer\.(\d+)\.convolution\.", lambda k: f"conv{int(k.group(1)) + 1}.", rest)
    rest = re.sub(r"^layer\.(\d+)\.normalization\.", lambda k: f"bn{int(k.group(1)) + 1}.", rest)
    return f"{prefix}layer{stage + 1}.{block}.{rest}"


#: an HF DETR-family checkpoint's backbone (``model.backbone.[conv_encoder.]model.``)
HF_BACKBONE = r"^model\.backbone\.(?:conv_encoder\.)?model\."


def hf_backbone_rules() -> Rules:
    """HF DETR-family backbone names -> visiontf's ``backbone.body.*``: an HF ``ResNetBackbone`` (``embedder``,
    ``encoder.stages``) or a timm ResNet (torchvision's names already)."""
    return [
        (HF_BACKBONE + r"embedder\.embedder\.convolution\.(.*)$", r"backbone.body.conv1.\1"),
        (HF_BACKBONE + r"embedder\.embedder\.normalization\.(.*)$", r"backbone.body.bn1.\1"),
        (HF_BACKBONE + r"encoder\.stages\.(\d+)\.layers\.(\d+)\.(.*)$", hf_resnet_name),
        (HF_BACKBONE + r"(.*)$", r"backbone.body.\1"),
    ]


def detr_family_format(state: dict[str, Tensor], hf_prefixes: tuple[str, ...]) -> str:
    """``"original"`` (the facebookresearch / fundamentalvision layouts: ``backbone.0.body.``, ``nn.MultiheadAttention``'s
    ``in_proj_weight``), ``"hf"`` (a key starts with one of the family's ``hf_prefixes``) or ``"visiontf"``
    (may be unrecognised; the caller checks the keys)."""
    if any(k.startswith("backbone.0.body.") for k in state) or any(".self_attn.in_proj_weight" in k for k in state):
        return "original"
    if any(k.startswith(hf_prefixes) for k in state):
        return "hf"
    return "visiontf"
