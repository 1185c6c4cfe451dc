"""The tasks' AdamW is torch's fused implementation where it applies (CPU and CUDA parameters): the
same update as the for-loop AdamW up to float rounding, and optimizer states saved by either load
into the other, so checkpoints written before the switch resume. Cost: well under a second."""
from __future__ import annotations

import copy

import torch
from torch import nn

from visiontf.tasks.optim import build_optimizer, can_fuse_adamw


def _groups(model: nn.Module) -> list[dict]:
    weights = [p for p in model.parameters() if p.ndim > 1]
    biases = [p for p in model.parameters() if p.ndim <= 1]
    return [{"params": weights, "weight_decay": 1e-4, "lr": 1e-3}, {"params": biases, "weight_decay": 0.0, "lr": 1e-4}]


def _steps(model: nn.Module, opt: torch.optim.Optimizer, n: int, seed: int = 0) -> None:
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        x = torch.randn(16, 8, generator=g)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 4))


def test_adamw_is_fused_on_cpu_and_matches_the_for_loop_update():
    fused_model, loop_model = _model(), _model()
    fused = build_optimizer("adamw", _groups(fused_model), lr=1e-3, weight_decay=1e-4)
    loop = torch.optim.AdamW(_groups(loop_model), lr=1e-3, weight_decay=1e-4, foreach=False)
    assert fused.defaults["fused"] is True
    _steps(fused_model, fused, 20)
    _steps(loop_model, loop, 20)
    moved = max((a - b).abs().max().item() for a, b in zip(fused_model.parameters(), _model().parameters()))
    assert moved > 1e-3  # the parameters did move, so the comparison below means something
    for a, b in zip(fused_model.parameters(), loop_model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_a_for_loop_adamw_state_resumes_in_the_fused_one_and_back():
    model = _model()
    loop = torch.optim.AdamW(_groups(model), lr=1e-3, weight_decay=1e-4, foreach=False)
    _steps(model, loop, 5)
    # a checkpoint written before the switch: the for-loop state continues in the fused optimizer
    resumed_model = copy.deepcopy(model)
    fused = build_optimizer("adamw", _groups(resumed_model), lr=1e-3, weight_decay=1e-4)
    fused.load_state_dict(copy.deepcopy(loop.state_dict()))  # as read from a file: no shared tensors
    _steps(model, loop, 5, seed=1)
    _steps(resumed_model, fused, 5, seed=1)
    for a, b in zip(model.parameters(), resumed_model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    back = torch.optim.AdamW(_groups(copy.deepcopy(resumed_model)), lr=1e-3, foreach=False)
    back.load_state_dict(copy.deepcopy(fused.state_dict()))
    assert back.state_dict()["state"][0]["step"].item() == 10


def test_fusing_is_refused_for_devices_and_dtypes_it_does_not_cover():
    assert can_fuse_adamw([{"params": [torch.zeros(2, requires_grad=True)]}])
    assert not can_fuse_adamw([{"params": [torch.zeros(2, device="meta", requires_grad=True)]}])
    assert not can_fuse_adamw([{"params": []}])
    meta = build_optimizer("adamw", [{"params": [nn.Parameter(torch.zeros(2, device="meta"))]}], lr=1e-3, weight_decay=0.0)
    assert not meta.defaults["fused"]
