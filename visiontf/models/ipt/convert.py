"""Map the released IPT state dicts (huawei-noah/Pretrained-IPT) onto :class:`visiontf.models.ipt.ipt.IPT`.

The released files (``IPT_sr2.pt``, ``IPT_sr3.pt``, ``IPT_sr4.pt``, ``IPT_denoise30.pt``,
``IPT_denoise50.pt``, ``IPT_derain.pt``, ``IPT_pretrain.pt``) are raw ``state_dict()``\\ s of the
original ``ipt`` module. Heads, tails, the mean shifts and the body's own tables have the same names
in visiontf; the transformer layers are visiontf's shared blocks, so ``nn.MultiheadAttention``'s
``in_proj_weight`` / ``out_proj.weight`` become ``qkv.weight`` / ``proj.weight``, ``linear1`` /
``linear2`` become ``mlp.fc1`` / ``mlp.fc2``, the decoder's ``multihead_attn`` is ``cross_attn``
and the encoder's ``self_attn`` is ``attn``; ``body.position_encoding.position_ids`` (an
``arange``) is dropped. :func:`to_original_state_dict` is the inverse.

A single-task model takes its task's head, tail and query out of ``IPT_pretrain.pt`` (tasks in the
order :data:`visiontf.models.ipt.ipt.PRETRAIN_TASKS`); weights of another task or size are refused
with the registered model they fit.
"""
from __future__ import annotations

import logging
import math
import re

import torch
from torch import Tensor, nn

from visiontf.models._registry import WeightsLayoutError
from visiontf.models.convert import rename_state, strip_prefix
from visiontf.models.ipt.task_names import PRETRAIN_TASKS, task_scale

log = logging.getLogger(__name__)

_L = r"^body\.(encoder|decoder)\.layers\.(\d+)\."

#: original name -> visiontf name
_TO_VISIONTF = [
    (r"^body\.encoder\.layers\.(\d+)\.self_attn\.in_proj_weight$", r"body.encoder.layers.\1.attn.qkv.weight"),
    (r"^body\.encoder\.layers\.(\d+)\.self_attn\.out_proj\.weight$", r"body.encoder.layers.\1.attn.proj.weight"),
    (r"^body\.decoder\.layers\.(\d+)\.self_attn\.in_proj_weight$", r"body.decoder.layers.\1.self_attn.qkv.weight"),
    (r"^body\.decoder\.layers\.(\d+)\.self_attn\.out_proj\.weight$", r"body.decoder.layers.\1.self_attn.proj.weight"),
    (r"^body\.decoder\.layers\.(\d+)\.multihead_attn\.in_proj_weight$", r"body.decoder.layers.\1.cross_attn.qkv.weight"),
    (r"^body\.decoder\.layers\.(\d+)\.multihead_attn\.out_proj\.weight$", r"body.decoder.layers.\1.cross_attn.proj.weight"),
    (_L + r"linear([12])\.(weight|bias)$", r"body.\1.layers.\2.mlp.fc\3.\4"),
]

#: visiontf name -> original name
_TO_ORIGINAL = [
    (r"^body\.encoder\.layers\.(\d+)\.attn\.qkv\.weight$", r"body.encoder.layers.\1.self_attn.in_proj_weight"),
    (r"^body\.encoder\.layers\.(\d+)\.attn\.proj\.weight$", r"body.encoder.layers.\1.self_attn.out_proj.weight"),
    (r"^body\.decoder\.layers\.(\d+)\.self_attn\.qkv\.weight$", r"body.decoder.layers.\1.self_attn.in_proj_weight"),
    (r"^body\.decoder\.layers\.(\d+)\.self_attn\.proj\.weight$", r"body.decoder.layers.\1.self_attn.out_proj.weight"),
    (r"^body\.decoder\.layers\.(\d+)\.cross_attn\.qkv\.weight$", r"body.decoder.layers.\1.multihead_attn.in_proj_weight"),
    (r"^body\.decoder\.layers\.(\d+)\.cross_attn\.proj\.weight$", r"body.decoder.layers.\1.multihead_attn.out_proj.weight"),
    (_L + r"mlp\.fc([12])\.(weight|bias)$", r"body.\1.layers.\2.linear\3.\4"),
]

_POSITION_IDS = "body.position_encoding.position_ids"


def detect_format(state: dict[str, Tensor]) -> str:
    """``"original"`` (the released files' names) or ``"visiontf"``."""
    original = (".in_proj_weight", ".multihead_attn.", ".linear1.", _POSITION_IDS)
    return "original" if any(any(m in k for m in original) for k in state) else "visiontf"


def to_original_state_dict(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """visiontf IPT names -> the original's (with ``position_ids``), e.g. to load into the original code."""
    out, _ = rename_state(dict(state), _TO_ORIGINAL, keep_unmatched=True)
    n = out["body.position_encoding.pe.weight"].shape[0]
    out[_POSITION_IDS] = torch.arange(n).expand((1, -1))
    return out


def structure(state: dict[str, Tensor]) -> dict:
    """What an IPT state dict (visiontf names) describes: ``n_feats``, token ``dim``, ``tokens``,
    ``num_layers``, ``num_queries`` and the ``scales`` of its tails, in order."""
    tails = sorted({int(m.group(1)) for k in state if (m := re.match(r"^tail\.(\d+)\.", k))})
    scales = []
    for i in tails:
        s = 1
        for key, w in state.items():
            if re.match(rf"^tail\.{i}\.0\.\d+\.weight$", key):  # upsampler convs: out = r*r*in
                s *= math.isqrt(w.shape[0] // w.shape[1])
        scales.append(s)
    layers = {int(m.group(1)) for k in state if (m := re.match(r"^body\.encoder\.layers\.(\d+)\.", k))}
    dim = state["body.linear_encoding.weight"].shape[0]
    query = state["body.query_embed.weight"]
    return {"n_feats": state["head.0.0.weight"].shape[0], "dim": dim, "tokens": query.shape[1] // dim,
            "num_layers": len(layers), "num_queries": query.shape[0], "scales": tuple(scales)}


def _describe(s: dict) -> str:
    body = f"{s['n_feats']} features, {s['dim']}-dim tokens x {s['tokens']}, {s['num_layers']}+{s['num_layers']} layers"
    return f"scales {list(s['scales'])} ({s['num_queries']} quer{'y' if s['num_queries'] == 1 else 'ies'}), {body}"


def fitting_models(s: dict) -> list[str]:
    """Registered IPT names (with the arguments needed) whose structure is ``s``."""
    from visiontf.models._registry import create_model, list_models

    fits = []
    for name in list_models("ipt_*"):
        with torch.device("meta"):
            ref = structure(create_model(name).state_dict())
        if ref == s:
            fits.append(name)
        elif name == "ipt_tiny" and len(s["scales"]) == 1 and {**ref, "scales": s["scales"]} == s:
            fits.append(f"ipt_tiny(scale={s['scales'][0]})")
    return fits


def extract_task(state: dict[str, Tensor], index: int) -> dict[str, Tensor]:
    """A single-task state dict from a multi-task one (visiontf names): head, tail and query ``index``."""
    out = {}
    for key, value in state.items():
        m = re.match(r"^(head|tail)\.(\d+)\.(.*)$", key)
        if m is None:
            out[key] = value
        elif int(m.group(2)) == index:
            out[f"{m.group(1)}.0.{m.group(3)}"] = value
    out["body.query_embed.weight"] = state["body.query_embed.weight"][index:index + 1].clone()
    return out


def convert_state_dict(state: dict[str, Tensor], model: nn.Module) -> dict[str, Tensor]:
    """The registry's ``filter_fn`` of every IPT: ``state`` (original or visiontf names) fitted to ``model``.

    Raises:
        ValueError: not an IPT state dict.
        WeightsLayoutError: an IPT of another task, scale or size (the message names the model it fits).
    """
    state = dict(state)
    state = strip_prefix(dict(state))
    fmt = detect_format(state)
    if fmt == "original":
        state, _ = rename_state(state, _TO_VISIONTF, keep_unmatched=True)
        ids = state.pop(_POSITION_IDS, None)
        if ids is not None and not ids.is_meta and not torch.equal(ids.reshape(-1).cpu(), torch.arange(ids.numel())):
            raise ValueError(f"{_POSITION_IDS} is not 0..N-1: a position layout visiontf's IPT does not have")
    needed = ("head.0.0.weight", "body.linear_encoding.weight", "body.query_embed.weight")
    if not all(k in state for k in needed):
        missing = [k for k in needed if k not in state]
        raise ValueError(f"not an IPT state dict (no {missing}); keys look like {list(state)[:6]}")
    theirs, own = structure(state), structure(model.state_dict())
    name = model.model_name or "this IPT"
    if theirs == own:
        return state
    tasks = model.tasks
    pretrain = {**own, "scales": tuple(task_scale(t) for t in PRETRAIN_TASKS), "num_queries": len(PRETRAIN_TASKS)}
    if len(tasks) == 1 and tasks[0] in PRETRAIN_TASKS and own["num_queries"] == 1 and theirs == pretrain:
        index = PRETRAIN_TASKS.index(tasks[0])
        log.info("%s: head, tail and query %d (%s) of the pre-trained multi-task IPT", name, index, tasks[0])
        return extract_task(state, index)
    fits = fitting_models(theirs)
    if fits:
        use = fits[0].split("(")[0]
        fix = f"these weights fit {' / '.join(fits)}: create_model({use!r}, pretrained=...)"
        if use == "ipt_tiny" and "(" in fits[0]:
            fix = f"these weights fit {fits[0]}: create_model('ipt_tiny', scale={theirs['scales'][0]}, pretrained=...)"
    elif {**theirs, "scales": own["scales"]} == own:
        # only the scale differs: each scale has its own head and upsampling tail, so nothing maps across
        scale = theirs["scales"][0] if len(theirs["scales"]) == 1 else list(theirs["scales"])
        fix = (f"the weights restore x{'/x'.join(map(str, theirs['scales']))} and {name} is built for "
               f"x{'/x'.join(map(str, own['scales']))}; build it with scale={scale} (a config's "
               f"model_kwargs: {{scale: {scale}}} and data tasks [sr_x{scale}]), or train the other scale from scratch")
    else:
        fix = "no registered IPT has this structure; build IPT(...) with it"
    raise WeightsLayoutError(
        f"IPT weights with {_describe(theirs)} do not fit {name} ({_describe(own)}); {fix}"
    )
