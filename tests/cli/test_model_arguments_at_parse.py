"""A config's ``model_kwargs`` is checked against the model it names when the config is parsed: ``--print_config``
refuses what the run would, and a run refuses it before its data is read (``VisionArgumentParser``,
``BaseTask.check_model_arguments``, ``visiontf.models.check_model_arguments``)."""
import pytest
import torch
import yaml

from visiontf.models import ModelArgumentError, check_model_arguments, create_model

DINO = "configs/deformable_detr/deformable_detr_tiny_shapes.yaml"
SETR = "configs/setr/setr_tiny_synthetic.yaml"


def test_the_check_builds_on_the_meta_device_and_reads_no_weights(tmp_path):
    missing = tmp_path / "nowhere.safetensors"
    model = check_model_arguments("rtdetr_tiny", num_classes=3, backbone={"name": "resnet18vd", "pretrained": str(missing)})
    assert {p.device.type for p in model.parameters()} == {"meta"}
    assert model.num_classes == 3
    assert torch.empty(1).device.type == "cpu"  # the meta device stays inside the check
    with pytest.raises(Exception, match="nowhere.safetensors"):  # the real build does read it
        create_model("rtdetr_tiny", num_classes=3, backbone={"name": "resnet18vd", "pretrained": str(missing)})


def test_the_check_refuses_what_the_constructor_refuses():
    with pytest.raises(ModelArgumentError) as checked:
        check_model_arguments("dino_tiny", arhc={"hidden_dim": 64})
    with pytest.raises(ModelArgumentError) as built:
        create_model("dino_tiny", arhc={"hidden_dim": 64})
    assert str(checked.value) == str(built.value)
    assert "did you mean the section 'arch'" in str(checked.value)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, dict]:
    from cli_runner import run_tools

    tmp = tmp_path_factory.mktemp("model_args")
    overrides = {
        "misspelt": {"model_kwargs": {"arhc": {"hidden_dim": 64}}},
        "mistyped": {"model_kwargs": {"arch": {"hidden_dim": "wide"}}},
        "unknown_name": {"model_name": "dino_tny"},
    }
    cases, names = [], []
    for name, init_args in overrides.items():
        path = tmp / f"{name}.yaml"
        path.write_text(yaml.safe_dump({"model": {"init_args": init_args}}))
        cases.append({"argv": ["tools/train.py", "fit", "--config", DINO, "--config", str(path), "--print_config"]})
        names.append(name)
    # a run (no --print_config) with the same mistake: refused before the data root, which does not exist, is read
    cases.append({"argv": ["tools/train.py", "fit", "--config", DINO, "--config", str(tmp / "misspelt.yaml"),
                           "--data.init_args.root", str(tmp / "no_data"), "--trainer.max_steps", "1"]})
    names.append("misspelt_run")
    kind = tmp / "kind.yaml"
    kind.write_text(yaml.safe_dump({"model": {"init_args": {"model_name": "dino_tiny", "model_kwargs": None}}}))
    cases.append({"argv": ["tools/train.py", "fit", "--config", SETR, "--config", str(kind), "--print_config"]})
    names.append("detector_for_segmentation")
    cases.append({"argv": ["tools/train.py", "fit", "--config", DINO, "--print_config"]})
    names.append("valid")
    return dict(zip(names, run_tools(cases, tmp)))


@pytest.mark.parametrize("case, words", [
    ("misspelt", ["dino_tiny: 'arhc' is not a keyword argument of this model; did you mean the section 'arch'?",
                  "model.init_args.model_kwargs"]),
    ("mistyped", ["dino_tiny: arch.hidden_dim: 'wide' is not int", "model.init_args.model_kwargs"]),
    ("unknown_name", ["unknown model 'dino_tny'. Did you mean: dino_tiny"]),
    ("misspelt_run", ["did you mean the section 'arch'?"]),
    ("detector_for_segmentation", ["SegmentationTask: model.init_args.model_name='dino_tiny' is a DeformableDETR, "
                                   "not a Segmenter"]),
])
def test_a_config_mistake_in_the_model_is_refused_at_parse_time(runs, case, words):
    out = runs[case]
    assert out["code"] == 2, out["stderr"][-2000:]
    last = out["stderr"].strip().splitlines()[-1]
    for w in words:
        assert w in last, last
    assert "Traceback" not in out["stderr"]
    assert out["stdout"] == ""  # nothing printed as a config
    if case == "misspelt_run":
        assert "no_data" not in out["stderr"]  # the model's mistake came first


def test_a_valid_config_still_prints(runs):
    out = runs["valid"]
    assert out["code"] == 0, out["stderr"][-2000:]
    assert yaml.safe_load(out["stdout"])["model"]["init_args"]["model_name"] == "dino_tiny"



def test_the_generation_tasks_check_their_model_as_they_build_it():
    """The tokenizer and the transformer build their model without ``num_classes`` (the transformer takes the data's
    class count as ``n_classes``): a config giving one is not refused for it."""
    from visiontf.core.errors import UserError
    from visiontf.models import ModelNameError
    from visiontf.tasks.generation.gpt_task import TransformerTask
    from visiontf.tasks.generation.tokenizer_task import TokenizerTask

    with pytest.raises(ModelArgumentError, match="num_classes"):  # what the generic check would have said
        check_model_arguments("vqgan_transformer_tiny", num_classes=3)
    TransformerTask.check_model_arguments({"model_name": "vqgan_transformer_tiny", "num_classes": 3, "model_kwargs": None})
    TokenizerTask.check_model_arguments({"model_name": "vqgan_tiny", "num_classes": 5, "model_kwargs": {}})
    with pytest.raises(UserError, match="model_kwargs.n_classes 4 but the data has 3 classes"):  # as the build refuses it
        TransformerTask.check_model_arguments({"model_name": "vqgan_transformer_tiny", "num_classes": 3,
                                               "model_kwargs": {"n_classes": 4}})
    with pytest.raises(ModelArgumentError, match="'n_clases'"):
        TransformerTask.check_model_arguments({"model_name": "vqgan_transformer_tiny", "model_kwargs": {"n_clases": 3}})
    # with a tokenizer file the architecture comes from it when the task is built: only the name is checked here
    TransformerTask.check_model_arguments({"model_name": "vqgan_transformer_tiny", "first_stage_ckpt": "tok.ckpt",
                                           "model_kwargs": {"first_stage_kwargs": {"n_embed": 7}}})
    with pytest.raises(ModelNameError):
        TransformerTask.check_model_arguments({"model_name": "vqgan_transformer_tny", "first_stage_ckpt": "tok.ckpt"})


def test_with_a_checkpoint_the_config_model_arguments_are_not_checked():
    """With ``--ckpt_path`` the checkpoint's own hyper-parameters build the model (the config's ``model_kwargs`` may be
    another model's: evaluating a detr_tiny checkpoint with dino_tiny's config and ``model_name=detr_tiny``)."""
    from jsonargparse import Namespace

    from visiontf.cli.train import VisionArgumentParser

    parser = VisionArgumentParser()
    detection = "visiontf.tasks.detection.detection_task.DetectionTask"
    misfit = Namespace(class_path=detection, init_args=Namespace(model_name="detr_tiny", model_kwargs={"dino": {}}))
    parser._check_model(Namespace(model=misfit, ckpt_path="run/last.ckpt"))
    with pytest.raises(ModelArgumentError, match="'dino' is not a keyword argument"):
        parser._check_model(Namespace(model=misfit, ckpt_path=None))
