"""Shared by the IPT tests: random official-layout weights from the reference, small settings."""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ is not an installed package
from benchmarks.reference_ipt import OriginalIPT  # noqa: E402

#: a small model of the released layout: same module tree and maths, fewer features and layers
SMALL = dict(n_feats=8, num_heads=2, num_layers=1)
#: ipt_tiny's settings
TINY = dict(n_feats=8, patch_dim=4, num_heads=4, num_layers=2)


def randomized_reference(scales=(2,), num_queries=1, seed=0, n_feats=8, num_heads=2, num_layers=1,
                         patch_dim=3) -> OriginalIPT:
    """The original layout with non-trivial values everywhere (LayerNorm affine too), in eval mode."""
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


def save_reference(ref: OriginalIPT, path: Path) -> Path:
    torch.save(ref.state_dict(), path)
    return path
