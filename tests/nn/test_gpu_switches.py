"""Switches prepared for the GPU, off by default until measured: compiling the transformer alone,
and the host-side bookkeeping that keeps the training step from waiting on the GPU."""
from __future__ import annotations

import pytest
import torch

from visiontf.models.deformable_detr.queries import self_attn_mask
from visiontf.set_prediction import HungarianMatcher, SetCriterion
from visiontf.tasks.detection.detection_task import DetectionTask

TINY = dict(arch=dict(hidden_dim=32, nheads=2, enc_layers=1, dec_layers=1, dim_feedforward=32, num_queries=5))


def test_compile_transformer_compiles_only_the_encoder_decoder():
    task = DetectionTask(model_name="detr_tiny", num_classes=3, model_kwargs=TINY, compile="transformer")
    keys = set(task.model.state_dict())
    task.configure_model()
    assert task.model.transformer._compiled_call_impl is not None
    assert task.model._compiled_call_impl is None and task.model.backbone._compiled_call_impl is None
    assert set(task.model.state_dict()) == keys  # checkpoints keep their keys
    task.configure_model()  # Lightning may call it again
    assert task.model.transformer._compiled_call_impl is not None


def test_compile_transformer_of_a_realtime_detr_compiles_its_encoder_and_decoder():
    """RT-DETR and D-FINE have no ``transformer`` module: their encoder and decoder are what is compiled (before:
    an AttributeError from configure_model)."""
    task = DetectionTask(model_name="rtdetr_tiny", num_classes=3, compile="transformer")
    keys = set(task.model.state_dict())
    task.configure_model()
    assert task.model.encoder._compiled_call_impl is not None and task.model.decoder._compiled_call_impl is not None
    assert task.model._compiled_call_impl is None and task.model.backbone._compiled_call_impl is None
    assert set(task.model.state_dict()) == keys


def test_compile_refuses_other_values():
    with pytest.raises(ValueError, match="compile"):
        DetectionTask(model_name="detr_tiny", num_classes=3, model_kwargs=TINY, compile="backbone")


@pytest.mark.parametrize("P, group, matching, groups", [(0, 0, 6, 2), (6, 3, 6, 2), (5, 2, 4, 1), (1, 4, 3, 3)])
def test_self_attn_mask_counts_denoising_groups_on_the_host(P, group, matching, groups):
    """The mask equals the one that read the number of denoising groups off the device tensor."""
    mask = self_attn_mask(P, group, matching, groups)
    dn_group = torch.arange(P) // max(group, 1)
    match = torch.arange(matching) // (matching // groups) + (int(dn_group.max()) + 1 if P else 0)
    g = torch.cat([dn_group, match])
    expected = g[:, None] == g[None, :]
    expected[:P, P:] = True
    assert torch.equal(mask, expected)


def test_num_boxes_single_process():
    criterion = SetCriterion(3, HungarianMatcher())
    targets = [{"labels": torch.tensor([0, 1]), "boxes": torch.rand(2, 4)}, {"labels": torch.tensor([], dtype=torch.long),
                                                                           "boxes": torch.zeros(0, 4)}]
    assert criterion.num_boxes(targets, torch.device("cpu")) == 2.0
    assert criterion.num_boxes(targets[1:], torch.device("cpu")) == 1.0  # at least 1
