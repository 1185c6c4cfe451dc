"""A checkpoint's own fields beside its hyper-parameters (the class table, the eval preprocessing, the Lightning
version) are checked when read: a value of another type is refused in one line naming the file and the key, where a
probe met raw ``ValueError``/``TypeError``/``InvalidVersion`` tracebacks from ``tools/eval.py`` and the loaders."""
from __future__ import annotations

import pytest
import torch

from visiontf.callbacks.checkpoint_io import AtomicCheckpointIO
from visiontf.io.weights import WeightsError
from visiontf.models import create_model
from visiontf.tasks.checkpoints import CheckpointError, load_checkpoint_model, saved_class_table


def test_the_class_table_is_read_as_written():
    assert saved_class_table({"class_names": ["a", "b"], "label_to_cat_id": {"0": 3, 1: 7}}, "f") == (["a", "b"], {0: 3, 1: 7})
    assert saved_class_table({}, "f") == (None, None)
    for ckpt, refusal in (({"label_to_cat_id": {"a": "b"}}, "label_to_cat_id.a is 'b', not int"),
                          ({"label_to_cat_id": {"a": 1}}, "label_to_cat_id's keys are the model's labels as integers"),
                          ({"label_to_cat_id": {0: 2, 1: 2}}, "label_to_cat_id maps labels 0 and 1 both to category id 2"),
                          ({"label_to_cat_id": {0: -2}}, "label_to_cat_id maps label 0 to category id -2"),
                          ({"class_names": "abc"}, "class_names is 'abc', not list"),
                          ({"class_names": [{"class_path": "os.system"}]}, r"class_names is \[\{.class_path")):
        with pytest.raises(CheckpointError, match=rf"^f\.ckpt: {refusal}"):
            saved_class_table(ckpt, "f.ckpt")


def test_a_checkpoint_with_preprocess_of_another_shape_is_refused(tmp_path):
    model = create_model("rtdetr_tiny", num_classes=3)
    base = {"state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
            "hyper_parameters": {"model_name": "rtdetr_tiny", "num_classes": 3}}
    torch.save({**base, "preprocess": [1, 2]}, tmp_path / "list.ckpt")
    with pytest.raises(CheckpointError, match=r"list\.ckpt: preprocess is \[1, 2\], not dict"):
        load_checkpoint_model(tmp_path / "list.ckpt")
    torch.save({**base, "preprocess": {"min_size": 320}}, tmp_path / "ok.ckpt")
    assert load_checkpoint_model(tmp_path / "ok.ckpt")[1]["preprocess"] == {"min_size": 320}


def test_a_lightning_version_that_is_not_one_is_named(tmp_path):
    torch.save({"pytorch-lightning_version": "garbage", "state_dict": {}}, tmp_path / "v.ckpt")
    with pytest.raises(WeightsError, match=r"v\.ckpt: pytorch-lightning_version is 'garbage', not a version"):
        AtomicCheckpointIO().load_checkpoint(tmp_path / "v.ckpt")
    # a value that expands (one list referenced twice at each of 30 levels: 2^30 leaves) is named without walking it
    bomb = ["x"]
    for _ in range(30):
        bomb = [bomb, bomb]
    torch.save({"pytorch-lightning_version": bomb, "state_dict": {}}, tmp_path / "bomb.ckpt")
    with pytest.raises(WeightsError, match=r"bomb\.ckpt: pytorch-lightning_version is \[\[\[\[.*not a version"):
        AtomicCheckpointIO().load_checkpoint(tmp_path / "bomb.ckpt")
    torch.save({"pytorch-lightning_version": "2.6.6", "state_dict": {}}, tmp_path / "ok.ckpt")
    assert AtomicCheckpointIO().load_checkpoint(tmp_path / "ok.ckpt")["pytorch-lightning_version"] == "2.6.6"
