"""Shared by the IPT tests: the recorded fixtures of the original (``tests/fixtures/ipt``, written by
``scripts/fixtures/make_ipt.py``) as a user has the released files, and the published layouts.

``randomized_reference`` (random weights in the released layout from ``tests/reference/ipt.py``, the
project's own re-creation of the original) stays for ``benchmarks/ipt.py``'s speed baseline.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import torch
from reference.fixtures import FIXTURES, load_fixture

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ is not an installed package
from reference.ipt import OriginalIPT  # noqa: E402

#: the fixtures' toy width in visiontf's arguments (their meta holds the original's flags):
#: 4 features, 2x2 patches, windows of 8, 2 heads, 1 layer (2 for the six-task layout), 5 tiles per call
TOY = dict(n_feats=4, patch_dim=2, num_heads=2, num_layers=1, tile_size=8, crop_batch_size=5)
TOY_PRETRAIN = {**TOY, "num_layers": 2}
#: float32 / float64 tolerances on [0, 1] outputs
TOL = {"float32": 1e-4, "float64": 1e-8}
#: registered name -> the fixture of its released layout
CASE_OF = {"ipt_sr_x2": "sr_x2", "ipt_sr_x3": "sr_x3", "ipt_sr_x4": "sr_x4", "ipt_denoise_sigma30": "denoise",
           "ipt_denoise_sigma50": "denoise", "ipt_derain": "denoise", "ipt_pretrain": "pretrain"}


def fixture_weights(case: str) -> dict[str, torch.Tensor]:
    """The fixture's weights as the original held them (float16 on disk where exact; float32 here)."""
    return {k: v.float() if v.is_floating_point() else v for k, v in load_fixture("ipt", case).weights.items()}


def fixture_file(case: str, path: Path) -> Path:
    """The fixture's weights saved as the released files are: the raw state dict of the original ``ipt``."""
    torch.save(fixture_weights(case), path)
    return path


def parse_layouts() -> dict[str, dict]:
    """``tests/fixtures/ipt/ipt_layouts.txt``: ``{case: {"params", "trainable", "entries", "keys": {key: shape}}}``."""
    sections: dict[str, dict] = {}
    cur: dict | None = None
    for line in (FIXTURES / "ipt" / "ipt_layouts.txt").read_text().splitlines():
        head = re.match(r"^## (\S+) .*: (\d+) parameters, (\d+) trainable, (\d+) state-dict entries$", line)
        if head:
            cur = sections[head.group(1)] = {"params": int(head.group(2)), "trainable": int(head.group(3)),
                                             "entries": int(head.group(4)), "keys": {}}
            continue
        row = re.match(r"^(\S+) \[([\d, ]*)\](?:\s+x(\d+))?$", line)
        if cur is not None and row:
            shape = tuple(int(v) for v in row.group(2).split(",") if v.strip())
            for i in range(int(row.group(3) or 1)):
                cur["keys"][row.group(1).replace(".N.", f".{i}.")] = shape
    return sections


def listed_state(case: str) -> dict[str, torch.Tensor]:
    """A released layout as meta tensors (shapes only; ``position_ids`` int64 as in the files)."""
    return {k: torch.empty(shape, device="meta", dtype=torch.int64 if k.endswith("position_ids") else torch.float32)
            for k, shape in parse_layouts()[case]["keys"].items()}


def randomized_reference(scales=(2,), num_queries=1, seed=0, n_feats=8, num_heads=2, num_layers=1,
                         patch_dim=3) -> OriginalIPT:
    """The reference re-creation with non-trivial values everywhere (LayerNorm affine too), in eval mode."""
    torch.manual_seed(seed)
    ref = OriginalIPT(scales, n_feats=n_feats, patch_dim=patch_dim, num_heads=num_heads, num_layers=num_layers,
                      num_queries=num_queries)
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if ".norm" in name:
                p.copy_((1.0 if name.endswith("weight") else 0.0) + 0.1 * torch.randn_like(p))
            elif name.endswith("bias") and "mean" not in name:
                p.normal_(0, 0.05)
    return ref.eval()


#: the restoration recipe the CLI tests run at toy size
RECIPE = "configs/ipt/ipt_tiny_sr_x2.yaml"


def toy_overrides(root: Path, out: Path) -> list[str]:
    return [f"--data.init_args.root={root}", "--data.init_args.num_workers=0", "--data.init_args.batch_size=2",
            "--data.init_args.repeat=2", "--data.init_args.val_crop=64",
            "--model.init_args.model_kwargs={scale: 2, n_feats: 4, num_layers: 1, num_heads: 2}",
            "--trainer.num_sanity_val_steps=0", "--trainer.enable_progress_bar=false", f"--trainer.default_root_dir={out}"]
