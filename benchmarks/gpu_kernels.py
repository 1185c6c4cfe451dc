"""Section (a) of the GPU benchmark: the multi-scale deformable attention core, forward + backward.

Ours is the fused Triton core (:mod:`visiontf.nn.ms_deform_triton`, what ``MSDeformAttn`` runs on
CUDA). The references, each timed alternately with ours in the same process:

* the original's compiled CUDA op (``--ref-op``; :mod:`benchmarks.reference_cuda_op`), float32
  kernels (half-precision inputs cast to float32 and back, as detrex and DINO do);
* the original's pure-PyTorch core ``ms_deform_attn_core_pytorch`` (``grid_sample`` per level;
  :func:`reference.deformable_detr.original_core`);
* visiontf's gather core (:mod:`visiontf.nn.ms_deform_gather`, the CPU fast path, and what CUDA
  ran before the Triton kernels);
* ours under ``torch.use_deterministic_algorithms(True)`` (what ``Trainer(deterministic=True)`` runs): the
  value gradient summed by a stable sort and a segmented-sum kernel instead of atomics, at fixed block
  sizes instead of the autotuner's. The ratio is the cost of deterministic training in the core.

Shapes (8 heads, head dim 32, 4 levels, 4 points; ``tiny``: toy sizes, 2 heads of 8, 2 points): the encoder of an 800x1216
batch of 2 (levels 100x152, 50x76, 25x38, 13x19: every one of the 20197 positions queries, sampling
near its own position) and the decoder (900 queries at random reference points). The sampling
locations are reference + offsets of a few pixels, as trained models place them (the cache
behaviour of uniformly random locations would be unrealistic). ``bf16``: value in bfloat16 under
``torch.autocast``, locations and weights float32, as ``MSDeformAttn`` runs under ``bf16-mixed``.
"""
from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import torch

from benchmarks.gpu_common import Budget, gpu_row, time_alternating

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the own-words baselines: tests/reference/
from reference.deformable_detr import original_core

from visiontf.nn.ms_deform_core import ms_deform_attn_core
from visiontf.nn.ms_deform_gather import core_gather

SHAPES = {"real": [(100, 152), (50, 76), (25, 38), (13, 19)], "tiny": [(4, 6), (2, 3), (1, 2), (1, 1)]}
#: heads, head dim, points; tiny: small enough for Triton's interpreter on the CPU
HEADS = {"real": (8, 32, 4), "tiny": (2, 8, 2)}
DECODER_QUERIES = {"real": 900, "tiny": 6}
#: the reference that is ours again, run with deterministic algorithms on
DETERMINISTIC = "visiontf Triton core, deterministic backward"


def make_inputs(kind: str, size: str, dtype: torch.dtype, device: torch.device, batch: int = 2, seed: int = 0):
    """(value, shapes, locations, weights) of an encoder (every position queries) or decoder attention."""
    g = torch.Generator().manual_seed(seed)
    shapes = SHAPES[size]
    heads, head_dim, points = HEADS[size]
    L = len(shapes)
    S = sum(h * w for h, w in shapes)
    if kind == "encoder":
        # each query at its own pixel centre, normalised
        ref = torch.cat([torch.stack(torch.meshgrid((torch.arange(h) + 0.5) / h, (torch.arange(w) + 0.5) / w, indexing="ij")[::-1], -1)
                         .view(-1, 2) for h, w in shapes])
        ref = ref.expand(batch, S, 2)
    else:
        ref = torch.rand(batch, DECODER_QUERIES[size], 2, generator=g)
    Q = ref.shape[1]
    size_wh = torch.tensor([(w, h) for h, w in shapes], dtype=torch.float32)
    offsets = 2.0 * torch.randn(batch, Q, heads, L, points, 2, generator=g)  # pixels of each level
    loc = ref[:, :, None, None, None, :] + offsets / size_wh[None, None, None, :, None, :]
    weights = torch.randn(batch, Q, heads, L * points, generator=g).softmax(-1).view(batch, Q, heads, L, points)
    value = torch.randn(batch, S, heads, head_dim, generator=g)
    return value.to(device, dtype), shapes, loc.to(device), weights.to(device)


@contextlib.contextmanager
def _deterministic_algorithms():
    """``torch.use_deterministic_algorithms(True)`` inside the block (forward and backward), the setting restored after."""
    before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])


def _fwd_bwd(core, value, shapes, loc, weights, grad, amp: bool, deterministic: bool = False):
    leaves = [t.detach().requires_grad_() for t in (value, loc, weights)]

    def run():
        for t in leaves:
            t.grad = None
        with _deterministic_algorithms() if deterministic else contextlib.nullcontext():
            with torch.autocast(value.device.type, dtype=torch.bfloat16, enabled=amp):
                out = core(leaves[0], shapes, leaves[1], leaves[2])
            out.backward(grad.to(out.dtype))
        return out

    return run, leaves


def _agree(ours: list, theirs: list, out_ours, out_theirs, tol: float) -> tuple[bool, float]:
    """Output and the three gradients within ``tol`` of the largest magnitude; the worst relative error."""
    worst = 0.0
    for a, b in zip([out_ours] + [t.grad for t in ours], [out_theirs] + [t.grad for t in theirs]):
        a, b = a.detach().float(), b.detach().float()
        worst = max(worst, float((a - b).abs().max() / b.abs().max().clamp_min(1e-12)))
    return worst <= tol, worst


def run(device: torch.device, tiny: bool, budget: Budget, ref_core=None, ref_note: str = "") -> list[dict]:
    size = "tiny" if tiny else "real"
    warmup, repeats, inner = (1, 1, 1) if tiny else (3, 10, 5)
    triton = lambda *a: ms_deform_attn_core(*a, method="triton")  # noqa: E731
    cores = {"original CUDA op": ref_core, "original PyTorch core (grid_sample)": original_core, "visiontf gather core": core_gather,
             DETERMINISTIC: triton}
    rows = []
    for kind in ("encoder", "decoder"):
        for dtype in (torch.float32, torch.bfloat16):
            dname = "fp32" if dtype == torch.float32 else "bf16"
            label = f"ms_deform_attn core fwd+bwd {kind} {dname}"
            if not budget.allows(label, 20 if not tiny else 5):
                continue
            value, shapes, loc, weights = make_inputs(kind, size, dtype, device)
            amp = dtype == torch.bfloat16
            grad = torch.randn(value.shape[0], loc.shape[1], value.shape[2] * value.shape[3],
                               generator=torch.Generator().manual_seed(1)).to(device)
            ours, our_leaves = _fwd_bwd(triton, value, shapes, loc, weights, grad, amp)
            out_ours = ours()
            for ref_name, core in cores.items():
                if core is None:
                    rows.append(gpu_row("a", label, ref_name, None, None, None, notes=ref_note))
                    continue
                theirs, their_leaves = _fwd_bwd(core, value, shapes, loc, weights, grad, amp, deterministic=ref_name == DETERMINISTIC)
                out_theirs = theirs()
                ours()  # our leaves' gradients again, after the reference ran
                same, worst = _agree(our_leaves, their_leaves, out_ours, out_theirs, 1e-4 if dtype == torch.float32 else 3e-2)
                t = time_alternating({"ours": ours, "ref": theirs}, device, warmup, repeats, inner)
                rows.append(gpu_row("a", f"{label} ({value.shape[0]}x{loc.shape[1]} queries)", ref_name, t["ours"], t["ref"], same,
                                    notes=f"max rel. diff {worst:.1e}"))
    return rows
