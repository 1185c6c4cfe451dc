"""Small files that would take far more memory than they hold are refused before anything large is built.

Each case was found by an audit that measured the memory a small hostile file took (a 3.5 MB checkpoint
unpacking into 4 GB, a 589-byte YOLO file expanding past 3 GB, a 16-bit PNG decoded in float64)."""
from __future__ import annotations

import zipfile

import numpy as np
import pytest
import torch
from PIL import Image

from visiontf.io.weights import WeightsError, safe_torch_load


def test_a_checkpoint_with_a_compressed_record_is_refused_unread(tmp_path):
    """torch.load reads compressed zip records too; torch.save never writes them. A record of zeros deflates a
    thousandfold, so a small file could ask for gigabytes."""
    plain = tmp_path / "plain.ckpt"
    torch.save({"state_dict": {"w": torch.zeros(1 << 20)}}, plain)
    packed = tmp_path / "packed.ckpt"
    with zipfile.ZipFile(plain) as src, zipfile.ZipFile(packed, "w") as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info), compress_type=zipfile.ZIP_DEFLATED)
    assert packed.stat().st_size < plain.stat().st_size // 50
    assert torch.load(packed, weights_only=True)["state_dict"]["w"].numel() == 1 << 20  # torch itself reads it
    for mmap in (False, True):
        with pytest.raises(WeightsError, match=r"packed\.ckpt: record '.*' of the archive is compressed; torch\.save "
                                               "stores every record uncompressed"):
            safe_torch_load(packed, mmap=mmap)
    assert safe_torch_load(plain)["state_dict"]["w"].numel() == 1 << 20


def _yolo_bomb(levels: int = 9) -> str:
    lines = [f"a0: &a0 [{', '.join(['abcdefghij'] * 10)}]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, levels)]
    return "\n".join(lines) + f"\nnames: [*a{levels - 1}]\ntrain: images/train\nval: images/val\n"


@pytest.mark.parametrize("text, words", [
    (_yolo_bomb(), "its anchors and aliases expand into more values than a dataset file holds"),
    ("names: [[a, b], c]\ntrain: images\n", r"the class name \['a', 'b'\] is not a name"),
    ("names: [a, b]\nnc: two\ntrain: images\n", "nc is 'two', not a number of classes"),
])
def test_a_yolo_data_yaml_that_expands_or_holds_other_types_is_named(tmp_path, text, words):
    """A 600-byte data.yaml of nested aliases took 3.5 GB and minutes when its names were copied out; a nested list
    or a word for nc ended in raw tracebacks."""
    from visiontf.data.loading import DatasetLayoutError
    from visiontf.tasks.detection.yolo import read_data_yaml

    (tmp_path / "data.yaml").write_text(text)
    assert len(text) < 700
    with pytest.raises(DatasetLayoutError, match=rf"data\.yaml: {words}"):
        read_data_yaml(tmp_path / "data.yaml")


def test_16_bit_images_are_rounded_in_integers_to_the_same_pixels(tmp_path):
    """16-bit samples become 8 bits as floor(x / 257 + 0.5) (every value 0..65535 checked), now in 32-bit integers: a
    328 KB 16-bit PNG of 13,000 x 13,000 pixels, under the pixel limit, took 3.9 GB in float64 copies."""
    import cv2

    from visiontf.data.io import read_image

    values = np.arange(1 << 16, dtype=np.uint16).reshape(256, 256)
    expected = np.floor(values.astype(np.float64) / 257 + 0.5).astype(np.uint8)
    Image.fromarray(values).save(tmp_path / "gray16.png")
    assert Image.open(tmp_path / "gray16.png").mode.startswith("I")
    np.testing.assert_array_equal(read_image(tmp_path / "gray16.png"), np.repeat(expected[..., None], 3, axis=2))
    bgr = np.stack([values, values[::-1], values.T], axis=2)
    cv2.imwrite(str(tmp_path / "rgb16.png"), bgr)
    want = np.floor(bgr[..., ::-1].astype(np.float64) / 257 + 0.5).astype(np.uint8)
    np.testing.assert_array_equal(read_image(tmp_path / "rgb16.png"), want)


@pytest.mark.parametrize("edit", [
    {"python": "x"},
    {"torch": torch.zeros(3, dtype=torch.uint8)},
    {"numpy": {"name": "MT19937", "keys": torch.zeros(3, dtype=torch.int64), "pos": 0, "has_gauss": 0,
               "cached_gaussian": 0.0}},
])
def test_rng_states_of_other_types_or_sizes_are_named(edit):
    """A resumed checkpoint's RNGStateCheckpoint state of another shape ended in the RNGs' raw TypeError,
    RuntimeError or IndexError."""
    _refused_and_own_restores(edit)


def _numpy_state(**fields):
    from visiontf.callbacks import RNGStateCheckpoint

    return {"numpy": {**RNGStateCheckpoint().state_dict()["numpy"], **fields}}


@pytest.mark.parametrize("fields, why", [
    ({"pos": 2_000_000_000}, r"numpy position 2000000000 is not in 0\.\.624"),
    ({"pos": -1}, r"numpy position -1 is not in 0\.\.624"),
    ({"pos": 625}, r"numpy position 625 is not in 0\.\.624"),
    ({"keys": torch.full((624,), 1 << 33)}, r"numpy keys are not 32-bit words"),
    ({"keys": torch.zeros(624)}, r"numpy keys are not 624 integers"),
    ({"has_gauss": 2}, r"numpy's cached gaussian is not a flag and a finite number"),
    ({"cached_gaussian": float("nan")}, r"numpy's cached gaussian is not a flag"),
    ({"name": "PCG64"}, r"numpy generator 'PCG64', not 'MT19937'"),
])
def test_numpy_rng_states_outside_the_generator_are_refused_before_numpy_takes_them(fields, why):
    """NumPy's legacy set_state took a position of 100000 or 2e9 and its next draw read past the 624 state words:
    the resumed run (timm's Mixup draws from NumPy) died with a segfault."""
    _refused_and_own_restores(_numpy_state(**fields), why)


def _refused_and_own_restores(edit, why=r"\w+"):
    from visiontf.callbacks import RNGStateCheckpoint

    callback = RNGStateCheckpoint()
    state = {**callback.state_dict(), **edit}
    with pytest.raises(WeightsError, match=r"^the checkpoint resumed from: its RNGStateCheckpoint state is not the "
                                           r"random states this callback saves \(\w+Error: " + why):
        callback.load_state_dict(state)
    callback.load_state_dict(callback.state_dict())  # its own state restores


def test_saved_settings_that_build_a_model_far_larger_than_the_weights_are_refused_before_building(tmp_path):
    """A 160 KB checkpoint (or export) of a tiny ViT whose settings say embed_dim 8192 built a 6 GB model before its
    weights were compared; the model is now built on the meta device first and measured against the file."""
    import json

    from safetensors.torch import load_file, save_file

    import visiontf
    from visiontf.io.weights import read_safetensors_metadata
    from visiontf.tasks.checkpoints import CheckpointError, load_checkpoint_model

    tiny = {"img_size": 32, "patch_size": 8, "depth": 1, "embed_dim": 32, "num_heads": 2}
    model = visiontf.create_model("vit_tiny_patch16_224", num_classes=3, **tiny)
    huge = {**tiny, "embed_dim": 8192}
    torch.save({"state_dict": {f"model.{k}": v for k, v in model.state_dict().items()}, "pytorch-lightning_version": "2.6.0",
                "hyper_parameters": {"model_name": "vit_tiny_patch16_224", "num_classes": 3, "model_kwargs": huge}},
               tmp_path / "odd.ckpt")
    with pytest.raises(CheckpointError, match=r"odd\.ckpt: its saved settings build vit_tiny_patch16_224 with [\d,]+ values, "
                                              r"but the file holds [\d,]+: the settings and the weights are not of one model"):
        load_checkpoint_model(tmp_path / "odd.ckpt")
    visiontf.save_model(model, tmp_path / "m.safetensors")
    # the export's own config, its embed_dim changed
    meta = read_safetensors_metadata(tmp_path / "m.safetensors")
    key = next(k for k, v in meta.items() if "model_kwargs" in v)
    config = json.loads(meta[key])
    config["model_kwargs"] = {**config["model_kwargs"], "embed_dim": 8192}
    save_file(load_file(tmp_path / "m.safetensors"), tmp_path / "odd.safetensors", metadata={**meta, key: json.dumps(config)})
    with pytest.raises(WeightsError, match=r"odd\.safetensors: its saved settings build vit_tiny_patch16_224 with"):
        visiontf.load_model(tmp_path / "odd.safetensors")
    assert visiontf.load_model(tmp_path / "m.safetensors").patch_embed.proj.out_channels == 32


def test_a_tensor_claiming_more_values_than_its_memory_is_refused_unread(tmp_path):
    """A view with a zero stride saves one element as any number of them: 4 bytes in the file read as a 4 TB weight
    by anything that touches every value (the NaN check allocated what the file claimed), and torch's fused AdamW
    wrote past such an optimizer moment. The sizes alone are compared; nothing is allocated."""
    from visiontf import create_model

    model = create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, depth=1, embed_dim=48,
                         num_heads=3, num_classes=3)
    state = dict(model.state_dict())
    state["head.weight"] = torch.zeros(1).expand(2**20, 2**20)
    torch.save(state, tmp_path / "vast.pth")
    assert (tmp_path / "vast.pth").stat().st_size < 1 << 20
    for mmap in (False, True):
        with pytest.raises(WeightsError, match=r"vast\.pth: the tensor at \['head\.weight'\] \(shape \(1048576, 1048576\), "
                                               r"strides \(0, 0\)\) claims 4398046511104 bytes of values but holds 4: "):
            safe_torch_load(tmp_path / "vast.pth", mmap=mmap)
    with pytest.raises(WeightsError, match=r"vast\.pth: the tensor at \['head\.weight'\]"):
        create_model("vit_tiny_patch16_224", pretrained=str(tmp_path / "vast.pth"), img_size=32, patch_size=8, depth=1,
                     embed_dim=48, num_heads=3, num_classes=3)
    # nested deep in containers and referenced twice, as in a Lightning checkpoint's optimizer state
    moment = torch.zeros(1).expand(48, 48)
    torch.save({"optimizer_states": [{"state": {0: {"exp_avg": moment}, 1: {"exp_avg": moment}}}]}, tmp_path / "o.ckpt")
    with pytest.raises(WeightsError, match=r"o\.ckpt: the tensor at \['optimizer_states'\]\[0\]\['state'\]\[\d\]"
                                           r"\['exp_avg'\] \(shape \(48, 48\), strides \(0, 0\)\) claims 9216 bytes"):
        safe_torch_load(tmp_path / "o.ckpt")


def test_a_record_shorter_than_its_declared_storage_is_corrupt_naming_the_file(tmp_path):
    """A whole, well-formed archive (every checksum right) whose tensor record holds half the bytes its pickle declares:
    torch's own message about record sizes becomes the one-line "corrupt or incomplete" of any other damaged file."""
    whole = tmp_path / "whole.ckpt"
    torch.save({"state_dict": {"w": torch.arange(64, dtype=torch.float32)}}, whole)
    short = tmp_path / "short.ckpt"
    with zipfile.ZipFile(whole) as src, zipfile.ZipFile(short, "w") as dst:
        for info in src.infolist():
            data = src.read(info)
            dst.writestr(info, data[: len(data) // 2] if info.filename.endswith("/data/0") else data)
    with pytest.raises(RuntimeError, match="does not match expected size"):
        torch.load(short, weights_only=True)  # what torch itself says
    # (mmap=True is only a first look at a checkpoint's small entries; the weights always come from this full read)
    with pytest.raises(WeightsError, match=r"short\.ckpt: corrupt or incomplete \([\d,]+ bytes\)"):
        safe_torch_load(short)


def test_views_that_hold_their_own_memory_load():
    """Slices, transposes, channels-last weights and views into a larger storage are what torch.save writes for real
    models and states: each element has memory of its own."""
    import io

    base = torch.arange(60.0).reshape(3, 4, 5)
    kept = {"slice": base[:, ::2], "transposed": base.transpose(0, 2), "offset": base[2],
            "channels_last": torch.randn(2, 3, 4, 4).to(memory_format=torch.channels_last), "one_row": base[:1].expand(1, 4, 5),
            "empty": torch.zeros(0, 3).expand(0, 3), "scalar": torch.tensor(1.5)}
    buffer = io.BytesIO()
    torch.save(kept, buffer)
    buffer.seek(0)
    loaded = safe_torch_load(buffer)
    for name, value in kept.items():
        assert torch.equal(loaded[name], value), name
