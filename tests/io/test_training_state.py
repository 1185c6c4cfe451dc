"""A resumed checkpoint's optimizer, scheduler and loop states are compared with the run's own before Lightning
restores them (``visiontf.io.training_state``).

An audit found that torch's fused AdamW, stepping over an ``exp_avg`` smaller than its parameter, writes past the
tensor's memory (glibc aborts the process: ``free(): invalid next size``), and that other values of the wrong type end
in bare tracebacks at the first step. Each case here is one a file could hold.
"""
from __future__ import annotations

import copy

import pytest
import torch

from visiontf.io.training_state import TrainingStateError, check_optimizer_state, check_restored_state


def _stepped(fused: bool | None = True, momentum: bool = False):
    """Two parameter groups, stepped once, with a LambdaLR: what a run saves and what a resumed one rebuilds."""
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(4, 3)), torch.nn.Parameter(torch.randn(5)), torch.nn.Parameter(torch.randn(2))]
    groups = [{"params": params[:2], "name": "decay"}, {"params": params[2:], "weight_decay": 0.0, "name": "no_decay"}]
    if momentum:
        optimizer = torch.optim.SGD(groups, lr=0.1, momentum=0.9)
    else:
        optimizer = torch.optim.AdamW(groups, lr=1e-3, weight_decay=1e-4, fused=fused)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, [lambda s: 1.0, lambda s: 0.5])
    for p in params:
        p.grad = torch.randn_like(p)
    optimizer.step()
    scheduler.step()
    return params, optimizer, scheduler


def _saved(**kwargs):
    _, optimizer, scheduler = _stepped(**kwargs)
    return {"optimizer_states": [copy.deepcopy(optimizer.state_dict())], "lr_schedulers": [scheduler.state_dict()],
            "loops": {"fit_loop": {"epoch_progress": {"total": {"ready": 1, "completed": 1}}, "state_dict": {}}}}


def _check(saved, **kwargs):
    _, optimizer, scheduler = _stepped(**kwargs)
    loops = {"fit_loop": {"epoch_progress": {"total": {"ready": 0, "completed": 0}}, "state_dict": {}}}
    check_restored_state(saved, "run/last.ckpt", [optimizer], [scheduler], loops, None)
    return optimizer, scheduler


@pytest.mark.parametrize("kwargs", [{"fused": True}, {"fused": None}, {"momentum": True}])
def test_a_state_the_same_optimizer_saved_is_accepted_and_loads(kwargs):
    saved = _saved(**kwargs)
    optimizer, scheduler = _check(saved, **kwargs)
    optimizer.load_state_dict(saved["optimizer_states"][0])
    scheduler.load_state_dict(saved["lr_schedulers"][0])
    assert optimizer.state_dict()["state"].keys() == saved["optimizer_states"][0]["state"].keys()


@pytest.mark.parametrize("value, expected", [
    (torch.zeros(2), r"a floating tensor of shape \(2,\), where this run needs a floating tensor of its parameter's "
                     r"shape \(4, 3\)"),
    (torch.zeros(()), r"a floating tensor of shape \(\), where this run needs a floating tensor of its parameter's shape \(4, 3\)"),
    (torch.zeros(3, 4), r"a floating tensor of shape \(3, 4\), where"),
    (torch.zeros(4, 3, dtype=torch.int64), r"an integer tensor of shape \(4, 3\), where this run needs a floating"),
    (torch.full((4, 3), float("nan")), r"a floating tensor of shape \(4, 3\), where this run needs finite values"),
    ("x", r"'x', where this run needs a tensor or a finite number"),
])
def test_a_parameter_state_of_another_shape_or_type_is_refused_naming_it(value, expected):
    """The smaller tensors are the ones the fused step writes past (run on the real optimizer, they abort the process)."""
    saved = _saved()
    saved["optimizer_states"][0]["state"][0]["exp_avg"] = value
    with pytest.raises(TrainingStateError, match=r"^run/last\.ckpt: optimizer_states\[0\]\['state'\]\[0\]\['exp_avg'\] "
                                                 "is " + expected):
        _check(saved)


@pytest.mark.parametrize("edit, expected", [
    (lambda s: s["optimizer_states"][0]["param_groups"].pop(), r"optimizer_states\[0\]\['param_groups'\] is .*, where "
                                                                r"this run needs a list of 2 groups"),
    (lambda s: s["optimizer_states"][0]["param_groups"][0]["params"].pop(), r"\['param_groups'\]\[0\]\['params'\] is "
                                                                            r"\[0\], where this run needs a list of 2"),
    (lambda s: s["optimizer_states"][0]["param_groups"][0].update(lr="1e-3"), r"\['param_groups'\]\[0\]\['lr'\] is "
                                                                              r"'1e-3', where this run needs a number"),
    (lambda s: s["optimizer_states"][0]["param_groups"][0].update(betas=(0.9,)), r"\['betas'\] is \(0\.9,\), where this "
                                                                                 r"run needs a list of 2"),
    (lambda s: s["optimizer_states"][0]["param_groups"][1].update(fused=False), r"\[1\]\['fused'\] is False, where "
                                                                                r"this run needs True, this run's"),
    (lambda s: s["optimizer_states"][0]["param_groups"][1].update(extra=torch.ones(3)), r"\[1\]\['extra'\] is a floating "
                                                                                        r"tensor .* needs plain data"),
    (lambda s: s["optimizer_states"][0]["state"].update({7: {}}), r"\['state'\]\[7\] is \{\}, where this run needs "
                                                                  r"absent \(no parameter"),
    (lambda s: s["optimizer_states"].append({}), r": optimizer_states is .*, where this run needs a list of 1 states "
                                                 r"\(one for each of this run's optimizers\)"),
])
def test_optimizer_groups_that_do_not_fit_are_refused(edit, expected):
    saved = _saved()
    edit(saved)
    with pytest.raises(TrainingStateError, match=expected):
        _check(saved)


def test_keys_of_another_torch_version_are_taken_when_plain():
    """A group key the running torch does not know (an older or newer version's flag) is ignored by its step."""
    saved = _saved()
    saved["optimizer_states"][0]["param_groups"][0]["decoupled_from_the_future"] = True
    saved["lr_schedulers"][0]["verbose"] = False
    _check(saved)


@pytest.mark.parametrize("edit, expected", [
    # LambdaLR.load_state_dict copies each key onto the scheduler: its optimizer, or a method, replaced by a string
    (lambda s: s.update(optimizer="sgd"), r"lr_schedulers\[0\]\['optimizer'\] is 'sgd', where this run needs absent"),
    (lambda s: s.update(step=1), r"\['step'\] is 1, where this run needs absent"),
    (lambda s: s.update(extra={"a": 1}), r"\['extra'\] is \{'a': 1\}, where this run needs absent"),
    # and each lr_lambdas mapping onto the run's own function
    (lambda s: s.update(lr_lambdas=[None, {"__code__": 1}]), r"\['lr_lambdas'\]\[1\] is \{'__code__': 1\}, where this "
                                                             r"run needs None"),
    (lambda s: s.update(base_lrs=[1e-3]), r"\['base_lrs'\] is \[0\.001\], where this run needs a list of 2"),
    (lambda s: s.update(last_epoch="3"), r"\['last_epoch'\] is '3', where this run needs a number"),
])
def test_scheduler_states_that_do_not_fit_are_refused(edit, expected):
    saved = _saved()
    edit(saved["lr_schedulers"][0])
    with pytest.raises(TrainingStateError, match=r"^run/last\.ckpt: lr_schedulers\[0\]" + expected.removeprefix(
            r"lr_schedulers\[0\]")):
        _check(saved)


@pytest.mark.parametrize("edit, expected", [
    (lambda s: s["fit_loop"]["epoch_progress"]["total"].update(ready="1"),
     r"loops\['fit_loop'\]\['epoch_progress'\]\['total'\]\['ready'\] is '1', where this run needs a number"),
    (lambda s: s["fit_loop"]["epoch_progress"]["total"].pop("ready"),
     r"loops\['fit_loop'\]\['epoch_progress'\]\['total'\]\['ready'\] is None, where this run needs present \(a number\)"),
    (lambda s: s.pop("fit_loop"), r"loops\['fit_loop'\] is None, where this run needs a mapping"),
])
def test_loop_states_that_do_not_fit_are_refused(edit, expected):
    """Lightning's loops read their counters by key (a bare KeyError or TypeError later)."""
    saved = _saved()
    edit(saved["loops"])
    with pytest.raises(TrainingStateError, match=r"^run/last\.ckpt: " + expected):
        _check(saved)


def test_a_parameter_state_is_checked_against_its_own_parameter():
    """The indices map saved states to the run's parameters group by group, as torch's load does: a state of the
    right size for another parameter is still refused."""
    params, optimizer, _ = _stepped()
    saved = copy.deepcopy(optimizer.state_dict())
    saved["state"][0], saved["state"][1] = saved["state"][1], saved["state"][0]
    with pytest.raises(TrainingStateError, match=r"\['state'\]\[0\]\['exp_avg'\] is a floating tensor of shape \(5,\)"):
        check_optimizer_state(saved, optimizer, "f.ckpt", "optimizer_states[0]")


def test_a_strategy_layout_is_checked_for_kinds_of_values_only():
    """FSDP saves whole, unflattened parameters' states and converts them to its flat parameters when it loads them:
    other shapes are its layout, but a value that is not a tensor of numbers is still refused."""
    saved = _saved()
    state = saved["optimizer_states"][0]
    state["state"][0]["exp_avg"] = torch.zeros(12)
    state["param_groups"][0]["params"] = [0]
    _, optimizer, scheduler = _stepped()
    check_restored_state(saved, "run/last.ckpt", [optimizer], [scheduler], {}, None, own_layout=False)
    state["state"][0]["exp_avg"] = "x"
    with pytest.raises(TrainingStateError, match=r"\['state'\]\[0\]\['exp_avg'\] is 'x', where this run needs a tensor"):
        check_restored_state(saved, "run/last.ckpt", [optimizer], [scheduler], {}, None, own_layout=False)
    state["state"][0]["exp_avg"] = torch.zeros(12)
    state["param_groups"][0]["lr"] = "fast"
    with pytest.raises(TrainingStateError, match=r"\['param_groups'\]\[0\]\['lr'\] is 'fast', where this run needs a "):
        check_restored_state(saved, "run/last.ckpt", [optimizer], [scheduler], {}, None, own_layout=False)


def test_a_moment_of_one_repeated_value_is_refused_however_the_file_was_read():
    """A plain Trainer reads the file with Lightning's own torch.load, not visiontf's reader, which refuses it first."""
    saved = _saved()
    saved["optimizer_states"][0]["state"][0]["exp_avg"] = torch.zeros(1).expand(4, 3)
    with pytest.raises(TrainingStateError, match=r"\['exp_avg'\] is a floating tensor of shape \(4, 3\), where this run "
                                                 r"needs a tensor with memory for each of its values \(it holds 4 bytes\)"):
        _check(saved)
