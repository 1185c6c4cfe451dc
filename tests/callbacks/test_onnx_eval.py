"""``tools/eval.py --onnx``'s callback: the exported graph, run by onnxruntime, stands in for the task's model during
evaluation and gives what the model gives; the model comes back afterwards."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import visiontf
from visiontf.callbacks.onnx_eval import OnnxRuntimeEvaluation, OnnxRuntimeModel
from visiontf.inference.export import example_inputs, export_onnx
from visiontf.models import get_entry


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    kwargs = dict(get_entry("rtdetr_tiny").test_kwargs)
    torch.manual_seed(0)
    model = visiontf.create_model("rtdetr_tiny", **kwargs).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.2 * torch.randn(p.shape))
    return model, export_onnx(model, tmp_path_factory.mktemp("onnx") / "m.onnx", image_size=(64, 64))


def test_the_graph_answers_as_the_model_at_another_size(exported):
    model, path = exported
    runner = OnnxRuntimeModel(path, model, threads=1)
    inputs = example_inputs(model, image_size=(96, 128), batch_size=1)
    with torch.no_grad():
        ref = model(inputs["images"], inputs["mask"])
    got = runner(inputs["images"], inputs["mask"])
    assert set(got) == {"pred_logits", "pred_boxes"}
    for k in got:
        torch.testing.assert_close(got[k], ref[k], rtol=0, atol=1e-4)
    # no mask (nothing padded) as the model takes it
    torch.testing.assert_close(runner(inputs["images"])["pred_boxes"], ref["pred_boxes"], rtol=0, atol=1e-4)
    # what the task reads of its model is the model's; the runner has no parameters of its own
    assert runner.class_head == model.class_head == "sigmoid" and runner.postprocess_options is model.postprocess_options
    assert not list(runner.parameters())


def test_the_callback_swaps_the_graph_in_for_validation_only(exported):
    model, path = exported
    module = torch.nn.Module()
    module.model = model
    trainer = SimpleNamespace(sanity_checking=True)
    callback = OnnxRuntimeEvaluation(str(path), threads=1)
    callback.on_validation_start(trainer, module)
    assert module.model is model  # Lightning's sanity check runs the PyTorch model
    trainer.sanity_checking = False
    callback.on_validation_start(trainer, module)
    assert isinstance(module.model, OnnxRuntimeModel)
    callback.on_validation_end(trainer, module)
    assert module.model is model


def test_a_missing_graph_is_named_with_the_fix(exported, tmp_path):
    model, _ = exported
    with pytest.raises(FileNotFoundError, match=r"--onnx .*nothing\.onnx: no such file \(write one with tools/export\.py --onnx"):
        OnnxRuntimeModel(tmp_path / "nothing.onnx", model)


def test_a_file_onnxruntime_cannot_load_is_named_in_one_line(exported, tmp_path):
    """Not a graph (a pickle named .onnx, an empty file): one line naming the file and onnx's or onnxruntime's reason,
    where tools/eval.py --onnx printed onnxruntime's traceback."""
    from visiontf.io.weights import WeightsError

    model, _ = exported
    (tmp_path / "pickle.onnx").write_bytes(b"\x80\x04K\x01.")
    (tmp_path / "empty.onnx").write_bytes(b"")
    for name in ("pickle.onnx", "empty.onnx"):
        with pytest.raises(WeightsError, match=rf"^--onnx .*{name}: onnx(runtime)? cannot (load|read) it as a graph \(.*\); write it again"
                           ) as e:
            OnnxRuntimeModel(tmp_path / name, model)
        assert "\n" not in str(e.value)


def test_a_graph_of_other_weights_is_refused_and_one_without_a_fingerprint_is_warned_about(exported, tmp_path, caplog):
    import copy

    import onnx

    from visiontf.io.weights import ONNX_WEIGHTS_KEY, WeightsError, weights_fingerprint

    model, path = exported
    # the export names the weights of the model as given (before the fused copy it traces)
    meta = {p.key: p.value for p in onnx.load(str(path)).metadata_props}
    assert meta[ONNX_WEIGHTS_KEY] == weights_fingerprint(model)
    other = copy.deepcopy(model)
    with torch.no_grad():
        other.decoder.bbox_heads[0].layers[-1].bias[0] += 1e-3  # one weight of one head
    assert weights_fingerprint(other) != weights_fingerprint(model)
    with pytest.raises(WeightsError, match=r"--onnx .*m\.onnx: the graph was exported from other weights than the model "
                                         r"it stands in for .*export this checkpoint with tools/export\.py"):
        OnnxRuntimeModel(path, other, threads=1)
    # a graph that names no weights (written by another tool) runs, with a warning
    graph = onnx.load(str(path))
    del graph.metadata_props[:]
    bare = tmp_path / "bare.onnx"
    onnx.save(graph, str(bare))
    with caplog.at_level("WARNING", logger="visiontf.callbacks.onnx_eval"):
        runner = OnnxRuntimeModel(bare, other, threads=1)
    assert "names no weights" in caplog.text
    assert set(runner(example_inputs(model, image_size=(64, 64), batch_size=1)["images"])) == {"pred_logits", "pred_boxes"}


def test_a_graph_that_fails_while_running_is_named_in_one_line(exported, monkeypatch):
    """A graph whose run fails (an audit's 270-byte graph with a ConstantOfShape node asked for a 6.4 GB buffer, and a
    capped memory refused it) ended in onnxruntime's raw error; it is now one line naming the file and the fix."""
    from onnxruntime.capi.onnxruntime_pybind11_state import Fail

    from visiontf.io.weights import WeightsError

    model, path = exported
    runner = OnnxRuntimeModel(path, model, threads=1)

    def fail(*args, **kwargs):  # onnxruntime's own failure, without taking the memory here
        raise Fail("[ONNXRuntimeError] : 1 : FAIL : Failed to allocate memory for requested buffer of size 6400000000")

    monkeypatch.setattr(runner, "session", SimpleNamespace(get_inputs=runner.session.get_inputs, run=fail))
    with pytest.raises(WeightsError, match=r"^--onnx .*m\.onnx: onnxruntime could not run the graph on a batch of "
                                           r"\(1, 3, 64, 64\) \(Fail: .*6400000000\); export the checkpoint again") as e:
        runner(torch.zeros(1, 3, 64, 64))
    assert "\n" not in str(e.value)


def _looping_graph(where: str):
    """A 1-input graph whose ``Loop`` (trip count 2**62, a condition that stays true) would run for ever: at the top,
    inside an ``If``'s branch, or inside a local function."""
    from onnx import TensorProto, helper

    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Identity", ["x_in"], ["x_out"])],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []), helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                 helper.make_tensor_value_info("x_in", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []), helper.make_tensor_value_info("x_out", TensorProto.FLOAT, None)])
    consts = [helper.make_node("Constant", [], ["n"], value=helper.make_tensor("n", TensorProto.INT64, [], [2**62])),
              helper.make_node("Constant", [], ["c"], value=helper.make_tensor("c", TensorProto.BOOL, [], [True]))]
    loop = helper.make_node("Loop", ["n", "c", "images"], ["pred"], name="forever", body=body)
    inputs = [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, 64, 64])]
    outputs = [helper.make_tensor_value_info("pred", TensorProto.FLOAT, None)]
    functions = []
    if where == "top":
        nodes = [*consts, loop]
    elif where == "if":
        branch = helper.make_graph([*consts, loop], "branch", [], outputs)
        nodes = [helper.make_node("Constant", [], ["t"], value=helper.make_tensor("t", TensorProto.BOOL, [], [True])),
                 helper.make_node("If", ["t"], ["pred"], then_branch=branch, else_branch=branch)]
    else:
        functions = [helper.make_function("local", "spin", ["images"], ["pred"], [*consts, loop], [helper.make_opsetid("", 17)])]
        nodes = [helper.make_node("spin", ["images"], ["pred"], domain="local")]
    graph = helper.make_graph(nodes, "g", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("local", 1)], functions=functions)


@pytest.mark.parametrize("where", ["top", "if", "function"])
def test_a_graph_that_loops_is_refused_before_it_runs(exported, tmp_path, where):
    """A few hundred bytes of ONNX with a ``Loop`` whose condition stays true would keep onnxruntime busy for ever;
    visiontf's exports hold no loop (the exported fixture is checked too), so such a graph is refused before
    onnxruntime loads it, naming the node, wherever it sits."""
    import onnx

    from visiontf.io.onnx_graph import loop_nodes
    from visiontf.io.weights import WeightsError

    model, ours = exported
    assert loop_nodes(ours) == []
    path = tmp_path / "spin.onnx"
    onnx.save(_looping_graph(where), str(path))
    assert path.stat().st_size < 1000
    with pytest.raises(WeightsError, match=r"^--onnx .*spin\.onnx: the graph holds Loop 'forever': a node that repeats a "
                                           r"subgraph for as long as the file says, which no visiontf export has; export") as e:
        OnnxRuntimeModel(path, model)
    assert "\n" not in str(e.value)
