"""visiontf's DINO R50 models against IDEA-Research/DINO's own code (a checkout of it), on the CPU.

    python benchmarks/dino_vs_original.py --dino-repo /path/to/DINO [--scales 4 5] [--per-layer] [--json out.json]

Without ``--dino-repo`` (or with a path that is not a DINO checkout) it says so and exits 0: nothing here
downloads the original, and CI compares against ``benchmarks/reference_dino*.py`` instead
(``tests/test_dino_checkpoints.py``). This script is what verifies that reference copy too: every case
runs three models, the original, ``create_model(name, pretrained=checkpoint)`` and the reference copy
loaded with the original's ``state_dict()``.

The original is built as ``shared/REFERENCE.md`` says: ``config/DINO/coco_transformer.py`` then
``DINO_{4,5}scale.py`` read with ``runpy`` into one ``Namespace``; a stub ``MultiScaleDeformableAttention``
module, its ``MSDeformAttnFunction.apply`` routed to the repository's own ``ms_deform_attn_core_pytorch``;
``is_main_process`` False (no ImageNet download); ``torch.manual_seed(0)``; ``build_dino(args)``; eval mode.
Its ``state_dict()`` is saved as ``{"model": ...}`` and loaded with ``create_model(name, num_classes=91, pretrained=path)``.

Cases, each at the published size (900 queries, 91 classes):

* images: ``one``, one 320x416 image, no padding; ``pad``, two images in a 320x416 batch, the second
  256x320 and padded (so padded proposals are ranked too).
* weights: ``init``, DINO's own initialisation at seed 0; ``bn``, the same with random FrozenBN statistics
  (running mean/var, weight, bias) and random last layers of the box heads (DINO zero-initialises
  them, which leaves every decoder layer's boxes equal to the proposals: the refinement untested).
* arithmetic: ``f64``, all models in float64, each selecting its own top 900 proposals; ``f32``, float32,
  each selecting its own; ``f32=`` (only where an own float32 ranking differs) float32 with the original's
  top-900 ranking given to the other two.

Why: DINO gives its 900 learned content queries to the top-900 proposals *in rank order*, and with
random weights two proposal scores a few 1e-7 apart are common. float32 rounding of the encoder (about
6e-6 between two correct implementations: a folded FrozenBN, channels-last convolutions, another
attention kernel) then swaps two ranks, the two queries trade content, and through self-attention every
query of every decoder layer moves (the 0.45 first reported). The original does the same against itself:
the ``f32`` rows compare its float32 run with its own float64 run. ``f64`` resolves those ties and shows
whether the models compute the same function; ``f32=`` shows the float32 path with the ranking's
tie-break taken out; the ranking columns say where two rankings differ and by how little the swapped
scores differ (in the scores of the second).

Fine-tuning (IDEA's issue #23, ``--finetune_ignore label_enc.weight class_embed``): the original is built with
``num_classes`` 3 and loads the 91-class checkpoint without those keys (``strict=False``);
``create_model(name, num_classes=3, pretrained=...)`` must keep every other tensor bit-equal and
re-initialise exactly the class heads and the label book; with those copied from the original, outputs are compared.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import re
import runpy
import sys
import tempfile
import types
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.reference_dino import build_dino as build_reference_copy  # noqa: E402
from benchmarks.reference_dino import dino_args  # noqa: E402
from benchmarks.reference_dino_layers import NestedTensor as CopyNestedTensor  # noqa: E402
from visiontf.models import create_model  # noqa: E402
from visiontf.models.deformable_detr.dino_convert import DINO_MODELS, convert_state_dict  # noqa: E402

TOL = 1e-4
FINETUNE_CLASSES = 3
#: the keywords of DINO's README for fine-tuning (``--finetune_ignore``)
FINETUNE_IGNORE = ("label_enc.weight", "class_embed")


# ------------------------------------------------------------------------------------ the original
def import_original(repo: Path) -> types.SimpleNamespace:
    """DINO's ``build_dino`` and ``NestedTensor``, importable on a CPU without its CUDA extension."""
    sys.path.insert(0, str(repo))
    sys.modules.setdefault("MultiScaleDeformableAttention", types.ModuleType("MultiScaleDeformableAttention"))
    from models.dino import backbone
    from models.dino.ops.functions.ms_deform_attn_func import ms_deform_attn_core_pytorch
    from models.dino.ops.modules import ms_deform_attn

    class CoreOnCpu:
        @staticmethod
        def apply(value, shapes, level_start_index, sampling_locations, attention_weights, im2col_step):
            return ms_deform_attn_core_pytorch(value, shapes, sampling_locations, attention_weights)

    ms_deform_attn.MSDeformAttnFunction = CoreOnCpu
    backbone.is_main_process = lambda: False  # no ImageNet download
    from models.dino.dino import build_dino
    from util.misc import NestedTensor

    return types.SimpleNamespace(build_dino=build_dino, NestedTensor=NestedTensor, repo=repo)


def original_args(repo: Path, scales: int, **overrides) -> argparse.Namespace:
    """``config/DINO/coco_transformer.py`` then ``DINO_{scales}scale.py`` (its ``_base_``), as DINO's SLConfig merges them."""
    values: dict = {}
    for name in ("coco_transformer.py", f"DINO_{scales}scale.py"):
        values.update({k: v for k, v in runpy.run_path(str(repo / "config" / "DINO" / name)).items() if not k.startswith("_")})
    values.update(device="cpu", masks=False, frozen_weights=None, use_checkpoint=False, **overrides)
    return argparse.Namespace(**values)


def build_original(orig, scales: int, perturb: bool, **overrides):
    torch.manual_seed(0)
    model = orig.build_dino(original_args(orig.repo, scales, **overrides))[0].eval()
    if perturb:
        perturb_weights(model)
    return model


def perturb_weights(model: torch.nn.Module, seed: int = 1) -> None:
    """Random FrozenBN statistics and affine values, and random last layers of the box heads."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if type(module).__name__ == "FrozenBatchNorm2d":
                module.running_mean.copy_(0.1 * torch.randn(module.running_mean.shape, generator=g))
                module.running_var.uniform_(0.5, 1.5, generator=g)
                module.weight.copy_(1 + 0.2 * torch.randn(module.weight.shape, generator=g))
                module.bias.copy_(0.1 * torch.randn(module.bias.shape, generator=g))
        last = [m.layers[-1] for name, m in model.named_modules() if name.endswith(("bbox_embed.0", "enc_out_bbox_embed"))]
        for layer in dict.fromkeys(last):  # the shared decoder head once
            layer.weight.copy_(torch.randn(layer.weight.shape, generator=g) / layer.weight.shape[1] ** 0.5)
            layer.bias.copy_(0.1 * torch.randn(layer.bias.shape, generator=g))


# ------------------------------------------------------------------------------------ running
def inputs(kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``one``: one 320x416 image; ``pad``: that and a 256x320 one padded to 320x416 (zeros, mask True).

    Drawn from the global generator right after ``build_dino`` at seed 0, as in the setup first reported.
    """
    first = torch.randn(1, 3, 320, 416)
    if kind == "one":
        return first, torch.zeros(1, 320, 416, dtype=torch.bool)
    images = torch.cat([first, torch.zeros(1, 3, 320, 416)])
    mask = torch.zeros(2, 320, 416, dtype=torch.bool)
    images[1, :, :256, :320] = torch.randn(3, 256, 320)
    mask[1, 256:] = True
    mask[1, :, 320:] = True
    return images, mask


@contextlib.contextmanager
def recorded_topk(k: int, record: list, replay: list | None = None):
    """Record the (scores, indices) of every ``torch.topk(scores, k)`` call; with ``replay``, return its indices instead.

    Both DINO and visiontf select the proposals with one ``torch.topk`` over (B, S) scores (the model's
    forward makes no other call with ``k`` = the number of queries).
    """
    own = torch.topk

    def topk(scores, kk, *args, **kwargs):
        out = own(scores, kk, *args, **kwargs)
        if kk != k or scores.dim() != 2:
            return out
        record.append((scores.detach(), out.indices))
        if replay is None:
            return out
        indices = replay[len(record) - 1][1]
        return torch.return_types.topk((scores.gather(1, indices), indices))

    torch.topk = topk
    try:
        yield
    finally:
        torch.topk = own


def run(model, kind: str, images: torch.Tensor, mask: torch.Tensor, nested, replay: list | None = None) -> dict:
    """Outputs and, from hooks, the encoder memory (B, S, C) and the proposal ranking of one forward."""
    captured: dict = {}
    encoder = model.transformer.encoder
    if kind == "ours":
        hook = encoder.register_forward_hook(lambda m, args, out: captured.update(memory=out, padding=args[4]))
    else:
        hook = encoder.register_forward_hook(lambda m, args, kwargs, out: captured.update(memory=out[0], padding=kwargs["key_padding_mask"]),
                                             with_kwargs=True)
    record: list = []
    dtype = next(model.parameters()).dtype
    try:
        with torch.no_grad(), recorded_topk(model_queries(model), record, replay):
            if kind == "ours":
                out = model(images.to(dtype), mask if mask.any() else None)
            else:
                out = model(nested(images.to(dtype), mask))
    finally:
        hook.remove()
    out["memory"], out["padding"], out["ranking"] = captured["memory"], captured["padding"], record
    return out


def model_queries(model) -> int:
    return model.arch_options.num_queries if hasattr(model, "arch_options") else model.num_queries


# ------------------------------------------------------------------------------------ comparing
def differences(ours: dict, theirs: dict) -> dict:
    """Max |difference| of the memory (valid positions: every reader zeroes padded ones), the selected
    proposals (``interm_outputs``), every decoder layer (``layer 1`` .. ``layer 6``, the last is the output)."""

    def d(a, b) -> float:
        return (a.double() - b.double()).abs().max().item()

    valid = ~theirs["padding"] if theirs["padding"] is not None else torch.ones(theirs["memory"].shape[:2], dtype=torch.bool)
    diffs = {"memory": d(ours["memory"][valid], theirs["memory"][valid])}
    for key, name in (("pred_logits", "logits"), ("pred_boxes", "boxes")):
        diffs[f"interm {name}"] = d(ours["interm_outputs"][key], theirs["interm_outputs"][key])
    layers_ours, layers_theirs = ours["aux_outputs"] + [ours], theirs["aux_outputs"] + [theirs]
    for i, (a, b) in enumerate(zip(layers_ours, layers_theirs, strict=True)):
        for key, name in (("pred_logits", "logits"), ("pred_boxes", "boxes")):
            diffs[f"layer {i + 1} {name}"] = d(a[key], b[key])
    scale = max(theirs["pred_logits"].std().item(), 1e-12), max(theirs["pred_boxes"].std().item(), 1e-12)
    diffs["_spread"] = scale  # the outputs are not degenerate (std of the original's logits, boxes)
    return diffs


def ranking(ours: dict, theirs: dict) -> str:
    """Whether the two top-K rankings agree; else how many ranks differ and the largest gap, in the original's
    own scores, between the proposals the two put at one rank (tiny: a near-tie decided by rounding)."""
    (scores, theirs_idx), (_, ours_idx) = theirs["ranking"][0], ours["ranking"][0]
    differ = theirs_idx != ours_idx
    if not differ.any():
        return "same"
    gap = (scores.gather(1, theirs_idx) - scores.gather(1, ours_idx)).abs()[differ].max().item()
    return f"{int(differ.sum())} ranks, gap {gap:.1e}"


# ------------------------------------------------------------------------------------ the cases
def compare_case(orig, scales: int, images_kind: str, weights: str) -> list[dict]:
    """One (scales, images, weights) case in float64, float32 and float32 with the original's ranking."""
    name = DINO_MODELS[scales]
    original = build_original(orig, scales, weights == "bn")
    images = inputs(images_kind)
    copy, _ = build_reference_copy(dino_args(scales))
    copy.load_state_dict(original.state_dict())
    copy.eval()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"checkpoint0011_{scales}scale.pth"
        torch.save({"model": original.state_dict()}, path)
        ours = create_model(name, num_classes=91, pretrained=path).eval()
    return _modes(original, ours, copy, orig, images, f"{scales}-scale {images_kind} {weights}")


def _modes(original, ours, copy, orig, inputs: tuple, label: str) -> list[dict]:
    """float64, float32, and (where a float32 ranking differs from the original's) float32 with the original's ranking.

    float32 rows also compare the original with itself in float64 (``self``): how far its own rounding moves it.
    """
    images, mask = inputs
    rows, exact = [], None
    for mode in ("f64", "f32", "f32="):
        dtype = torch.float64 if mode == "f64" else torch.float32
        for m in (original, ours, copy):
            m.to(dtype)
        theirs = run(original, "original", images, mask, orig.NestedTensor)
        replay = theirs["ranking"] if mode == "f32=" else None
        mine = run(ours, "ours", images, mask, None, replay)
        copied = run(copy, "copy", images, mask, CopyNestedTensor, replay)
        row = {"case": f"{label} {mode}", "ours": differences(mine, theirs), "copy": differences(copied, theirs),
               "ranking": ranking(mine, theirs) if replay is None else "the original's",
               "copy_ranking": ranking(copied, theirs) if replay is None else "the original's"}
        if mode == "f64":
            exact = theirs
        elif replay is None:
            row["self"], row["self_ranking"] = differences(theirs, exact), ranking(theirs, exact)
            row["ours_vs_exact_ranking"] = ranking(mine, exact)
        rows.append(row)
        print(_summary_line(row), flush=True)
        if mode == "f32" and row["ranking"] == row["copy_ranking"] == "same":
            break  # with the same rankings, f32= would repeat f32
    return rows


def compare_finetune(orig, scales: int) -> tuple[dict, list[dict]]:
    """IDEA's issue #23 against ``create_model(num_classes=3, pretrained=91-class checkpoint)``."""
    name = DINO_MODELS[scales]
    state = build_original(orig, scales, perturb=True).state_dict()
    finetuned = build_original(orig, scales, perturb=False, num_classes=FINETUNE_CLASSES, dn_labelbook_size=FINETUNE_CLASSES)
    images = inputs("pad")
    kept = {k: v for k, v in state.items() if not any(word in k for word in FINETUNE_IGNORE)}
    finetuned.load_state_dict(kept, strict=False)  # as DINO's main.py with --pretrain_model_path
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"checkpoint0011_{scales}scale.pth"
        torch.save({"model": state}, path)
        ours = create_model(name, num_classes=FINETUNE_CLASSES, pretrained=path).eval()
    expected = convert_state_dict(finetuned.state_dict(), ours)  # what the original holds after its fine-tuning load
    own = ours.state_dict()
    fresh = sorted(k for k in own if k.startswith(("class_embed.", "label_enc.")))
    equal = sum(torch.equal(own[k], expected[k]) for k in own if k not in fresh)
    report = {"original_ignored": _grouped(set(state) - set(kept)), "ours_reinitialised": _grouped(fresh),
              "kept_equal": equal, "kept": len(own) - len(fresh),
              "ok": equal == len(own) - len(fresh) and all(own[k].shape == expected[k].shape for k in fresh)}
    ours.load_state_dict(expected)  # the class heads the original drew, so that outputs compare
    copy, _ = build_reference_copy(dino_args(scales, num_classes=FINETUNE_CLASSES, dn_labelbook_size=FINETUNE_CLASSES))
    copy.load_state_dict(finetuned.state_dict())
    copy.eval()
    return report, _modes(finetuned, ours, copy, orig, images, f"{scales}-scale fine-tune ({FINETUNE_CLASSES} classes) pad bn")


def _grouped(keys) -> list[str]:
    """``class_embed.0.weight``, ``class_embed.1.bias``, ... as ``class_embed.N``."""
    return sorted({re.sub(r"\.\d+(?=\.|$)", ".N", k.removesuffix(".weight").removesuffix(".bias")) for k in keys})


# ------------------------------------------------------------------------------------ report
def _worst(diffs: dict, part: str) -> float:
    return max(v for k, v in diffs.items() if k.startswith("layer") and k.endswith(part))


def _summary_line(row: dict) -> str:
    o = row["ours"]
    return (f"{row['case']}: memory {o['memory']:.1e}, interm {o['interm logits']:.1e}/{o['interm boxes']:.1e}, "
            f"layers {_worst(o, 'logits'):.1e}/{_worst(o, 'boxes'):.1e}, ranking {row['ranking']}")


def table(rows: list[dict]) -> str:
    head = ("| case | memory | interm logits | interm boxes | layers 1-6 logits | layers 1-6 boxes | ranking vs the original | "
            "the original in f32 vs itself in f64: all outputs, ranking | ours in f32 vs the original in f64: ranking | "
            "reference copy vs the original: all outputs |")
    lines = [head, "|" + "---|" * 10]
    for r in rows:
        o = r["ours"]
        own = f"{_all(r['self']):.1e}, {r['self_ranking']}" if "self" in r else ""
        lines.append(f"| {r['case']} | {o['memory']:.1e} | {o['interm logits']:.1e} | {o['interm boxes']:.1e} | "
                     f"{_worst(o, 'logits'):.1e} | {_worst(o, 'boxes'):.1e} | {r['ranking']} | {own} | "
                     f"{r.get('ours_vs_exact_ranking', '')} | {_all(r['copy']):.1e} |")
    return "\n".join(lines)


def _all(diffs: dict) -> float:
    return max(v for k, v in diffs.items() if k != "memory" and not k.startswith("_"))


def per_layer_table(rows: list[dict]) -> str:
    keys = [k for k in rows[0]["ours"] if not k.startswith("_")]
    lines = ["| output | " + " | ".join(r["case"] for r in rows) + " |", "|" + "---|" * (len(rows) + 1)]
    lines += [f"| {k} | " + " | ".join(f"{r['ours'][k]:.1e}" for r in rows) + " |" for k in keys]
    return "\n".join(lines)


def passed(rows: list[dict]) -> bool:
    """Every output below TOL in ``f64``, and in float32 with the same ranking (``f32`` where the rankings agree,
    else ``f32=``; own float32 rankings may differ at near-ties), for ours and the copy."""
    checked = [r for r in rows if not r["case"].endswith(" f32") or r["ranking"] == r["copy_ranking"] == "same"]
    return all(v < TOL for r in checked for who in ("ours", "copy") for k, v in r[who].items() if not k.startswith("_"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dino-repo", type=Path, default=None, help="a checkout of IDEA-Research/DINO (nothing is downloaded)")
    p.add_argument("--scales", type=int, nargs="+", default=[4, 5], choices=[4, 5])
    p.add_argument("--images", nargs="+", default=["one", "pad"], choices=["one", "pad"])
    p.add_argument("--weights", nargs="+", default=["init", "bn"], choices=["init", "bn"])
    p.add_argument("--no-finetune", action="store_true", help="skip the fine-tuning comparison")
    p.add_argument("--per-layer", action="store_true", help="also print every output of every case")
    p.add_argument("--json", type=Path, default=None, help="write the rows here")
    args = p.parse_args(argv)
    if args.dino_repo is None or not (args.dino_repo / "models" / "dino" / "dino.py").is_file():
        print(f"skipped: no IDEA-Research/DINO checkout given (--dino-repo {args.dino_repo}); "
              "clone https://github.com/IDEA-Research/DINO and pass its path")
        return 0
    orig = import_original(args.dino_repo.resolve())
    rows, finetune = [], {}
    for scales in args.scales:
        for images_kind in args.images:
            for weights in args.weights:
                rows += compare_case(orig, scales, images_kind, weights)
        if not args.no_finetune:
            finetune[scales], ft_rows = compare_finetune(orig, scales)
            rows += ft_rows
    print(table(rows))
    if args.per_layer:
        print(per_layer_table(rows))
    for scales, report in finetune.items():
        print(f"fine-tuning {scales}-scale ({FINETUNE_CLASSES} classes): {report['kept_equal']} of the {report['kept']} kept tensors "
              f"bit-equal to the original's after its fine-tuning load; re-initialised: {', '.join(report['ours_reinitialised'])} "
              f"(the original ignores {', '.join(report['original_ignored'])}): {'PASS' if report['ok'] else 'FAIL'}")
    ok = passed(rows) and all(r["ok"] for r in finetune.values())
    print(f"{'PASS' if ok else 'FAIL'}: every output within {TOL:g} in f64 and f32= (ours and the reference copy)")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "finetune": finetune}, indent=1, default=str) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
