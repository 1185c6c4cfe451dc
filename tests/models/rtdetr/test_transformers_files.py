"""transformers' files load: what ``save_pretrained`` writes (the hub's layout), not only ``state_dict()``.

transformers 5 renamed modules of RT-DETR and D-FINE (``fc1`` -> ``mlp.fc1`` or ``mlp.layers.0``, ``out_proj`` ->
``o_proj``, ``encoder.encoder`` -> ``encoder.aifi``) and renames a file's tensors as it loads it, so its files, the hub's
included, keep the earlier names and store the tied heads once. Each model here is saved both ways; the two files must
give visiontf the same tensors, and the model loaded from ``model.safetensors`` transformers' outputs.
"""
from __future__ import annotations

import dfine_helpers
import pytest
import rtdetr_helpers
import torch
from rtdetr_helpers import max_diff, one_thread, padded_batch  # noqa: F401 (one_thread: a module fixture)

pytest.importorskip("transformers")


def _pair(family: str):
    if family == "dfine":
        return dfine_helpers.transformers_model(seed=5), dfine_helpers.visiontf_model
    version = family
    return (rtdetr_helpers.transformers_model(version, seed=5),
            lambda path, **kw: rtdetr_helpers.visiontf_model(version, path, **kw))


@pytest.mark.parametrize("family", ["v1", "v2", "dfine"])
def test_a_save_pretrained_file_loads_as_the_state_dict_does(family, tmp_path):
    hf, ours_from = _pair(family)
    hf.save_pretrained(tmp_path / "hub")
    from safetensors import safe_open

    with safe_open(str(tmp_path / "hub" / "model.safetensors"), "pt") as f:
        on_disk = list(f.keys())
    assert any(".fc1." in k for k in on_disk)  # the file's names are the earlier ones: what this test is about
    torch.save(hf.state_dict(), tmp_path / "memory.pth")

    from_file = ours_from(tmp_path / "hub" / "model.safetensors").state_dict()
    from_memory = ours_from(tmp_path / "memory.pth").state_dict()
    assert from_file.keys() == from_memory.keys()
    assert all(torch.equal(from_file[k], from_memory[k]) for k in from_file)

    images, _ = padded_batch([(64, 96)])
    with torch.no_grad():
        theirs = hf(pixel_values=images)
        out = ours_from(tmp_path / "hub" / "model.safetensors")(images)
    assert max_diff(out["pred_logits"], theirs.logits) < 1e-4
    assert max_diff(out["pred_boxes"], theirs.pred_boxes) < 1e-4
