"""The detection task's ``set_loss`` section: the typed matcher / criterion / weights settings that replace the
seven loss keywords and the two untyped dicts; old spellings (Python, YAML, checkpoints) migrate with one warning."""
from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

from visiontf.core.config_checks import ConfigError
from visiontf.set_prediction.set_loss_section import SetLoss, migrate_shortcuts
from visiontf.tasks.detection.detection_task import DetectionTask

TINY = {"arch": {"enc_layers": 1, "dec_layers": 1, "num_queries": 5}}
OLD = {"cost_class": 3.0, "cost_giou": 1.5, "loss_ce": 2.0, "loss_giou": 1.0, "eos_coef": 0.2,
       "matcher_kwargs": {"cost_bbox": 4.0}, "criterion_kwargs": {"weight_dict": {"loss_bbox": 6.0}}}
NEW = {"matcher": {"cost_class": 3.0, "cost_bbox": 4.0, "cost_giou": 1.5}, "criterion": {"eos_coef": 0.2},
       "weights": {"loss_ce": 2.0, "loss_bbox": 6.0, "loss_giou": 1.0}}


def _weights(task: DetectionTask) -> tuple:
    c = task.criterion
    return (c.matcher.cost_class, c.matcher.cost_bbox, c.matcher.cost_giou, c.eos_coef, dict(c.weight_dict))


def _future(record) -> list:
    return [w for w in record if issubclass(w.category, FutureWarning) and "set_loss" in str(w.message)]


def test_the_section_sets_the_criterion_and_is_saved_as_plain_data():
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        task = DetectionTask("detr_tiny", num_classes=3, model_kwargs=TINY, set_loss=NEW)
    assert _weights(task) == (3.0, 4.0, 1.5, 0.2, {"loss_ce": 2.0, "loss_bbox": 6.0, "loss_giou": 1.0})
    saved = task.hparams["set_loss"]
    assert saved == SetLoss.of(NEW).as_dict() and isinstance(saved, dict)
    assert not {"cost_class", "loss_ce", "eos_coef", "matcher_kwargs", "criterion_kwargs"} & set(task.hparams)
    # left out: the family's defaults, and nothing saved
    plain = DetectionTask("detr_tiny", num_classes=3, model_kwargs=TINY)
    assert _weights(plain) == (1.0, 5.0, 2.0, 0.1, {"loss_ce": 1.0, "loss_bbox": 5.0, "loss_giou": 2.0})
    assert plain.hparams["set_loss"] is None


def test_old_keywords_give_the_same_criterion_with_one_warning():
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        old = DetectionTask("detr_tiny", num_classes=3, model_kwargs=TINY, **OLD)
    new = DetectionTask("detr_tiny", num_classes=3, model_kwargs=TINY, set_loss=NEW)
    assert len(_future(record)) == 1
    message = str(_future(record)[0].message)
    assert "set_loss: {matcher: {cost_class: 3.0, cost_giou: 1.5, cost_bbox: 4.0}" in message and "\n" not in message
    assert _weights(old) == _weights(new)
    assert old.hparams["set_loss"] == new.hparams["set_loss"]


def test_family_options_pass_through_the_escape_hatch():
    with pytest.warns(FutureWarning, match=r"set_loss: \{criterion: \{class_loss: vfl, options: \{union_matching: false\}\}\}"):
        section = migrate_shortcuts({"criterion_kwargs": {"class_loss": "vfl", "union_matching": False}})
    assert section.criterion.class_loss == "vfl" and section.criterion.options == {"union_matching": False}
    assert section.criterion_kwargs() == {"class_loss": "vfl", "union_matching": False}
    task = DetectionTask("deformable_detr_tiny", num_classes=3,
                         model_kwargs={"arch": {"enc_layers": 1, "dec_layers": 1, "num_queries": 5}},
                         set_loss={"criterion": {"class_loss": "vfl", "focal_alpha": 0.3}})
    assert task.criterion.class_loss == "vfl" and task.criterion.focal_alpha == 0.3


@pytest.mark.parametrize("section, message", [
    ({"matcher": {"cost_clas": 3.0}}, r"^DetectionTask: model\.init_args\.set_loss\.matcher: unknown key\(s\) \['cost_clas'\]"),
    ({"weight": {"loss_ce": 1.0}}, r"^DetectionTask: model\.init_args\.set_loss: unknown key\(s\) \['weight'\]"),
    ({"criterion": {"eos_coef": 0}}, r"^DetectionTask: model\.init_args\.set_loss\.criterion\.eos_coef=0: must be a number in \(0, 1\]"),
    ({"weights": {"ce": 1.0}}, r"set_loss\.weights: 'ce' is not a loss term"),
    ({"criterion": {"options": {"eos_coef": 0.1}}}, r"set_loss\.criterion\.options: \['eos_coef'\] have their own place"),
])
def test_a_mistake_in_the_section_is_a_one_line_error(section, message):
    with pytest.raises(ConfigError, match=message) as e:
        DetectionTask("detr_tiny", num_classes=3, model_kwargs=TINY, set_loss=section)
    assert "\n" not in str(e.value)


def test_a_checkpoint_with_the_old_keywords_loads_with_one_warning(tmp_path):
    new = DetectionTask("detr_tiny", num_classes=3, model_kwargs=TINY, set_loss=NEW)
    hparams = {k: v for k, v in new.hparams.items() if k != "set_loss"}
    # the hyper-parameters as a checkpoint of before the section saved them: the shortcuts and both dicts
    hparams.update(OLD)
    path = tmp_path / "old.ckpt"
    torch.save({"state_dict": new.state_dict(), "hyper_parameters": hparams, "pytorch-lightning_version": "2.4.0"}, path)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        loaded = DetectionTask.load_from_checkpoint(path)
    assert len(_future(record)) == 1
    assert _weights(loaded) == _weights(new)
    assert loaded.hparams["set_loss"] == new.hparams["set_loss"] and "cost_class" not in loaded.hparams


def _cli(tmp_path, *extra: str, config: str = "configs/detr/detr_tiny_shapes.yaml"):
    from visiontf.cli.train import make_cli
    from visiontf.tasks.detection.detection_synthetic import make_detection_dataset

    root = tmp_path / "data"
    if not root.exists():
        make_detection_dataset(root, num_train=2, num_val=1, image_size=(48, 64), num_classes=2)
    return make_cli(["--config", config, f"--data.init_args.root={root}",
                     f"--trainer.default_root_dir={tmp_path / 'run'}", "--trainer.logger=false",
                     "--model.init_args.model_kwargs={arch: {num_queries: 5, enc_layers: 1, dec_layers: 1}}", *extra],
                    run=False, quiet=True)


def test_the_cli_reads_the_section_and_the_old_spelling_with_one_warning(tmp_path):
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        cli = _cli(tmp_path, "--model.init_args.set_loss.matcher.cost_class=3.0", "--model.init_args.set_loss.weights={loss_giou: 1.0}")
    assert not _future(record)
    assert cli.model.criterion.matcher.cost_class == 3.0 and cli.model.criterion.weight_dict["loss_giou"] == 1.0
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        old = _cli(tmp_path, "--model.init_args.cost_class=3.0", "--model.init_args.loss_giou=1.0",
                   "--model.init_args.criterion_kwargs={eos_coef: 0.2}")
    assert len(_future(record)) == 1
    assert _weights(old.model)[0] == 3.0 and old.model.criterion.eos_coef == 0.2
    assert old.model.criterion.weight_dict["loss_giou"] == 1.0


def test_an_old_style_yaml_config_parses_with_one_warning(tmp_path):
    text = Path("configs/detr/detr_tiny_shapes.yaml").read_text()
    anchor = "    model_name: detr_tiny\n"
    assert anchor in text
    old = tmp_path / "old.yaml"
    old.write_text(text.replace(anchor, anchor + "    cost_class: 3.0\n    eos_coef: 0.2\n    loss_giou: 1.0\n"
                                "    criterion_kwargs: {weight_dict: {loss_bbox: 6.0}}\n"))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        cli = _cli(tmp_path, config=str(old))
    assert len(_future(record)) == 1
    c = cli.model.criterion
    assert (c.matcher.cost_class, c.eos_coef, dict(c.weight_dict)) == (3.0, 0.2, {"loss_ce": 1.0, "loss_bbox": 6.0, "loss_giou": 1.0})
