"""Benchmark: VQGAN first and second stage, visiontf vs the original design (parity and time).

Rows (ratio = reference time / ours, > 1: ours faster; identical random weights in both):

* ``<name> reconstruct HxW``: ``model(x)`` (encode, quantise, decode) of a registered full-size
  first stage vs :class:`reference.vqgan.OriginalVQModel` (attention by ``bmm`` and
  softmax). ``same_result``: the same code indices and reconstructions within 1e-4; the rows carry
  ``max_abs_diff`` and ``params_m``.
* ``gpt sample N tokens``: batched top-k sampling with our KV cache vs taming's ``sample_with_past``
  (its cache grows by ``torch.cat`` every step), same seed; ``same_result``: the same tokens.
* ``gpt sample N tokens ... vs uncached``: the same, against taming's uncached
  ``Net2NetTransformer.sample`` (every step reruns the transformer over the whole sequence so far).
* ``gpt sample, no cache``: ours without the cache (every step reruns the whole sequence) vs ours
  with it (the ``ref_s`` column is the cached run), a quarter of the tokens.

    .venv/bin/python benchmarks/vqgan.py [--quick] [--device cuda]
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the own-words baselines: tests/reference/
from reference import vqgan as ref  # noqa: E402

from benchmarks.common import cli, max_abs_diff, pick_device, row, time_interleaved  # noqa: E402
from visiontf.models import create_model  # noqa: E402
from visiontf.models.vqgan.gpt import GPT  # noqa: E402
from visiontf.models.vqgan.vqgan import DEFAULT_CFGS  # noqa: E402

_DD = ("ch", "ch_mult", "num_res_blocks", "attn_resolutions", "resolution", "z_channels")


def _first_stage_pair(name: str, device: torch.device):
    s = DEFAULT_CFGS[name].kwargs
    dd = dict(double_z=False, in_channels=3, out_ch=3, **{k: s[k] for k in _DD})
    torch.manual_seed(0)
    theirs = ref.OriginalVQModel(dd, s["n_embed"], s["embed_dim"], with_loss=False).eval()
    with torch.no_grad():
        for pname, p in theirs.named_parameters():
            if p.dim() == 1 and "norm" in pname:
                p.add_(0.1 * torch.randn_like(p))
        z = theirs.quant_conv(theirs.encoder(torch.rand(1, 3, 128, 128) * 2 - 1))
        z = z.permute(0, 2, 3, 1).reshape(-1, s["embed_dim"])
        book = z[torch.randint(0, len(z), (s["n_embed"],))]
        theirs.quantize.embedding.weight.copy_(book + 0.05 * z.std() * torch.randn_like(book))
    ours = create_model(name).eval()
    ours.load_state_dict(theirs.state_dict())
    return ours.to(device), theirs.to(device)


def _first_stage_rows(quick: bool, device: torch.device) -> list[dict]:
    rows = []
    size = 128 if quick else 256
    for name in ("vqgan_imagenet_f16_16384", "vq_f8"):
        ours, theirs = _first_stage_pair(name, device)
        x = torch.rand(1, 3, size, size, device=device) * 2 - 1
        with torch.no_grad():
            rec, rec_ref = ours(x), theirs(x)[0]
            idx, idx_ref = ours.tokenize(x).flatten(), theirs.encode(x)[2][2]
            diff = max_abs_diff(rec, rec_ref)
            fns = {"ours": lambda m=ours, x=x: m(x), "ref": lambda m=theirs, x=x: m(x)}
            t = time_interleaved(fns, device, warmup=1, repeats=2 if quick else 3)
        rows.append(row(f"{name} reconstruct {size}x{size}", t["ours"], t["ref"], bool(torch.equal(idx, idx_ref)) and diff < 1e-4,
                        "taming (bmm attention)", max_abs_diff=diff, codes_equal=bool(torch.equal(idx, idx_ref)),
                        params_m=round(sum(p.numel() for p in ours.parameters()) / 1e6, 2)))
    return rows


def _gpt_rows(quick: bool, device: torch.device) -> list[dict]:
    cfg = dict(vocab_size=1024, block_size=257, n_layer=4, n_head=8, n_embd=256) if quick else \
        dict(vocab_size=1024, block_size=257, n_layer=8, n_head=8, n_embd=512)
    steps = 64 if quick else 256
    torch.manual_seed(0)
    theirs = ref.GPT(**cfg).eval().to(device)
    with torch.no_grad():
        for p in theirs.parameters():
            p.normal_(0, 0.05)
    ours = GPT(**cfg).eval().to(device)
    ours.load_state_dict({k: v for k, v in theirs.state_dict().items() if not k.endswith("attn.mask")})
    cond = torch.arange(4, device=device)[:, None]

    def run_ours(use_cache=True, n=steps):
        torch.manual_seed(1)
        return ours.generate(cond, n, top_k=100, use_cache=use_cache)

    def run_ref():
        torch.manual_seed(1)
        return ref.sample_with_past(cond, theirs, steps, top_k=100, top_p=1.0)

    same = bool(torch.equal(run_ours(), run_ref()))
    t = time_interleaved({"ours": run_ours, "ref": run_ref}, device, warmup=1, repeats=2 if quick else 3)
    rows = [row(f"gpt sample {steps} tokens x4 ({cfg['n_layer']}L {cfg['n_embd']}d)", t["ours"], t["ref"], same,
                "taming sample_with_past")]
    def run_ref_uncached():
        torch.manual_seed(1)
        return ref.sample(cond[:, :0], cond, steps, theirs, sample=True, top_k=100)

    # the KV cache against taming's own uncached Net2NetTransformer.sample
    same = bool(torch.equal(run_ours(), run_ref_uncached()))
    t = time_interleaved({"ours": run_ours, "ref": run_ref_uncached}, device, warmup=1 if quick else 0,
                         repeats=2 if quick else 1)  # the uncached full run takes long
    rows.append(row(f"gpt sample {steps} tokens x4 ({cfg['n_layer']}L {cfg['n_embd']}d) vs uncached", t["ours"], t["ref"],
                    same, "taming sample (no cache)"))
    short = steps // 4  # without the cache the cost grows with the square of the length
    same = bool(torch.equal(run_ours(False, short), run_ours(True, short)))
    t = time_interleaved({"nocache": lambda: run_ours(False, short), "cache": lambda: run_ours(True, short)}, device,
                         warmup=0, repeats=1)
    rows.append(row(f"gpt sample {short} tokens x4, no cache", t["nocache"], t["cache"], same, "ours with the KV cache"))
    return rows


def run(quick: bool = False, device: str = "cpu") -> list[dict]:
    dev = pick_device(device)
    return _first_stage_rows(quick, dev) + _gpt_rows(quick, dev)


def _run_and_print_details(quick: bool = False, device: str = "cpu") -> list[dict]:
    rows = run(quick, device)
    for r in rows:
        extra = {k: v for k, v in r.items() if k in ("max_abs_diff", "codes_equal", "params_m")}
        if extra:
            print(r["benchmark"], extra)
    return rows


if __name__ == "__main__":
    raise SystemExit(cli(_run_and_print_details, __doc__))
