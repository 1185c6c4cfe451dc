"""An export's side files (``<stem>.labels.json``, the saved config) are checked when read: a file of another shape, a
value of another type or an unknown key is refused in one line naming the file and the key, where a probe met raw
``AttributeError``/``JSONDecodeError``/``TypeError`` tracebacks from ``tools/predict.py --weights``."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from visiontf.io.weights import WeightsError, labels_path, read_labels_file, save_model
from visiontf.models import create_model, load_model
from visiontf.tasks.detection.detection_inference import DetectionSettings
from visiontf.tasks.eval_settings import SettingsError


@pytest.mark.parametrize("text, refusal", [
    ("[1, 2, 3]", "a JSON list, not a mapping"),
    ("{class_names: [a]}", "not a readable JSON file"),
    ('{"class_names": "abc"}', "class_names is 'abc', not list"),
    ('{"label_to_cat_id": {"a": 1}}', "label_to_cat_id's keys are the model's labels as integers"),
    ('{"label_to_cat_id": {"0": "b"}}', "label_to_cat_id.0 is 'b', not int"),
    # every detection of four labels written as category 1, without a word
    ('{"label_to_cat_id": {"0": 1, "1": 1, "2": 1, "3": 1}}', "maps labels 0 and 1 both to category id 1"),
    ('{"label_to_cat_id": {"0": 3, "1": -7}}', "maps label 1 to category id -7; labels and category ids are never negative"),
    ('{"label_to_cat_id": {"-1": 3}}', "maps label -1 to category id 3"),
    ('{"preprocess": {"mean": "{class_path: os.system}"}}', "preprocess.mean .* a class specification"),
    ('{"classes": ["a"]}', r"unknown key\(s\) \['classes'\]"),
])
def test_a_labels_file_of_another_shape_is_refused_naming_it(tmp_path, text, refusal):
    weights = tmp_path / "m.safetensors"
    labels_path(weights).write_text(text)
    with pytest.raises(WeightsError, match=rf"^{labels_path(weights)}: .*{refusal}"):
        read_labels_file(weights)


def test_a_labels_file_as_written_reads_back(tmp_path):
    weights = tmp_path / "m.safetensors"
    labels_path(weights).write_text(json.dumps({"class_names": ["a", "b"], "label_to_cat_id": {"0": 3, "1": 7},
                                                "preprocess": {"min_size": 320, "mean": [0.5, 0.5, 0.5]}}))
    assert read_labels_file(weights) == {"class_names": ["a", "b"], "label_to_cat_id": {0: 3, 1: 7},
                                         "preprocess": {"min_size": 320, "mean": [0.5, 0.5, 0.5]}}


def test_settings_values_are_of_their_declared_types():
    with pytest.raises(SettingsError, match=r"^f\.labels\.json: its preprocess: mean is 'abc', not tuple\[float, ...\]"):
        DetectionSettings().updated({"mean": "abc"}, "f.labels.json: its preprocess")
    with pytest.raises(SettingsError, match="min_size is 'x', not int"):
        DetectionSettings().updated({"min_size": "x"})
    # numbers of any library, integral floats as ints, arrays and tensors as their numbers
    s = DetectionSettings().updated({"min_size": 640.0, "max_size": np.int64(900), "mean": np.array([0.5, 0.5, 0.5]),
                                     "std": torch.tensor([1.0, 2.0, 3.0])})
    assert (s.min_size, s.max_size, s.mean, s.std) == (640, 900, (0.5, 0.5, 0.5), (1.0, 2.0, 3.0))


def test_a_saved_config_that_does_not_build_names_the_file(tmp_path):
    from safetensors.torch import load_file, save_file

    path = save_model(create_model("rtdetr_tiny", num_classes=3), tmp_path / "m.safetensors")
    for kwargs, refusal in (({"num_classes": "x"}, r"its saved config \(rtdetr_tiny, model_kwargs .*\) does not build a model"),
                            ({"no_such_option": 1}, "its saved config: ")):
        config = {"model_name": "rtdetr_tiny", "model_kwargs": kwargs}
        save_file(load_file(str(path)), str(path), metadata={"visiontf_config": json.dumps(config)})
        with pytest.raises(Exception, match=rf"^{path}: {refusal}") as e:
            load_model(path)
        assert "\n" not in str(e.value).strip()
