"""How each image weighs in the logged evaluation stats of a detector.

``class_error`` over the set is wrong matches / all matches (DETR's own definition over a batch, so the
value does not depend on how images are batched or split over ranks); an image without boxes weighs
nothing, although DETR's convention gives it a ``class_error`` of 100. A sigmoid head's
``cardinality_error`` (queries whose top class is not the last one) is left out of the evaluation.
"""
from __future__ import annotations

import pytest
import torch

from visiontf.tasks.detection.detection_task import DetectionTask, eval_stat_weight

TINY_DETR = {"arch": {"hidden_dim": 32, "nheads": 2, "enc_layers": 1, "dec_layers": 1, "dim_feedforward": 32, "num_queries": 6}}
TINY_DINO = {**TINY_DETR, "dino": {"num_denoising": 0}}


def _target(labels: list[int], i: int) -> dict:
    n = len(labels)
    boxes = torch.tensor([[0.3 + 0.1 * k, 0.4, 0.2, 0.3] for k in range(n)]).reshape(n, 4)
    return {"labels": torch.tensor(labels, dtype=torch.int64), "boxes": boxes, "image_id": torch.tensor(i),
            "orig_size": torch.tensor([64, 80]), "size": torch.tensor([64, 80])}


class _NoMetric:
    def update(self, *args) -> None:
        pass


def _eval_means(model_name: str, kwargs: dict, targets: list[dict]) -> dict[str, list[float]]:
    torch.manual_seed(0)
    task = DetectionTask(model_name=model_name, num_classes=3, model_kwargs=kwargs).eval()
    task._metric = lambda stage: _NoMetric()
    images, mask = torch.rand(len(targets), 3, 64, 80), torch.zeros(len(targets), 64, 80, dtype=torch.bool)
    with torch.no_grad():
        task._eval_step((images, mask, targets), "val")
        # each image alone: its own class_error, as the criterion gives it
        alone = [task.criterion(task.model(images[i:i + 1], mask[i:i + 1]), [t], sync_num_boxes=False)
                 for i, t in enumerate(targets)]
    return task._eval_means, alone


def test_class_error_weighs_each_image_by_its_boxes_and_an_image_without_boxes_not_at_all():
    targets = [_target([0, 1, 2], 1), _target([], 2), _target([1], 3)]
    means, alone = _eval_means("detr_tiny", TINY_DETR, targets)
    errors = [float(a["class_error"]) for a in alone]
    assert errors[1] == 100.0  # DETR's convention for an image with nothing to match
    total, weight = means["val/class_error"]
    assert weight == 4
    assert total / weight == pytest.approx((3 * errors[0] + errors[2]) / 4, abs=1e-4)
    # the losses stay each image's own, one image one weight
    assert means["val/loss_ce"][1] == 3
    assert means["val/loss_ce"][0] / 3 == pytest.approx(sum(float(a["loss_ce"]) for a in alone) / 3, abs=1e-5)
    # a softmax head's cardinality error (predictions that are not "no object" against boxes) is an eval stat
    assert means["val/cardinality_error"][1] == 3


def test_a_sigmoid_heads_cardinality_error_is_not_an_eval_stat():
    means, alone = _eval_means("dino_tiny", TINY_DINO, [_target([0, 2], 1), _target([1], 2)])
    assert "cardinality_error" in alone[0]  # the criterion still computes it for the training logs
    assert not [k for k in means if "cardinality_error" in k], sorted(means)
    assert {"val/loss_ce_interm", "val/class_error"} <= set(means)
    assert eval_stat_weight("class_error", _target([0, 2], 1)) == 2 and eval_stat_weight("loss_ce", _target([], 1)) == 1


def test_a_set_without_boxes_logs_no_class_error_rather_than_a_nan():
    means, _ = _eval_means("detr_tiny", TINY_DETR, [_target([], 1), _target([], 2)])
    assert means["val/class_error"][1] == 0
    task = DetectionTask(model_name="detr_tiny", num_classes=3, model_kwargs=TINY_DETR)
    task._eval_means = {k: list(v) for k, v in means.items()}
    logged = {}
    task.log = lambda name, value, **kw: logged.__setitem__(name, float(value))
    task._log_eval_means("val")
    assert "val/class_error" not in logged and "val/loss_ce" in logged
    assert all(v == v for v in logged.values())  # no NaN
